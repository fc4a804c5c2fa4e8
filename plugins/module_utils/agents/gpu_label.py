# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""gpu-label: the node labeller of MetaX GPU nodes (manual 2.2.2, Table 2.7).

Run as::

    python -m ansible_collections.metax.gpu.plugins.module_utils.agents.gpu_label \\
        --host-root /host --node-name NODE [--interval 60] [--driver-mode native|cloud]

Every ``--interval`` seconds it discovers the node's GPUs under the host root,
computes the label map (``gpu.labels.node_labels``) and brings the Node's
``metax-tech.com/`` labels in line with one JSON merge patch: wrong values
corrected, labels it owns but no longer sets removed (for example every label
but ``gpu.installed=false`` once the GPUs are gone), every other label --
including other ``metax-tech.com/`` keys written by other components -- left
alone. Nothing is written when nothing changed. While the apiserver is away
it backs off and keeps running. RBAC: ``get`` and ``patch`` on ``nodes``.

After its first refresh that succeeded it creates ``--ready-file``, which the
chart's startup probe checks: a Ready gpu-label pod means a labelled node, so
the DaemonSet's ready count (what ``helm install --wait`` and the operator's
component status read) says the labels are there, not only that the
processes started.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from typing import Callable, Dict, Mapping, Optional, Sequence, Tuple

from ..gpu.discovery import DiscoveryError, discover
from ..gpu.labels import DRIVER_MODES, OWNED_LABEL_KEYS, keep_known_product, label_changes, node_labels
from ..names import LABEL_DRIVER_MODE, LABEL_DRIVER_READY
from ..backoff import Backoff
from ..host import HostRoot, HostRootError
from ..kube.client import core_v1
from ..kube.node import NodeUnavailable, OwnNode
from .common import (UsageError, add_common_flags, checked_host_root, kube_api_client, positive_float,
                     run_main, setup_logging, stop_event)

COMPONENT = "gpu-label"
LOG = logging.getLogger(COMPONENT)
DEFAULT_INTERVAL = 60.0      # seconds, as NFD and GFD use
# With the GPU Operator's driver component: driver.ready is the controller's
# (component readiness), gpu.driver.mode driver-manager's.
DRIVER_OWNED_KEYS = (LABEL_DRIVER_READY, LABEL_DRIVER_MODE)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpu-label", description="Label a node with its MetaX GPU facts.")
    add_common_flags(parser)
    parser.add_argument("--node-name", default=os.environ.get("NODE_NAME", ""),
                        help="the Node to label (default: $NODE_NAME, from the downward API)")
    parser.add_argument("--interval", type=positive_float, default=DEFAULT_INTERVAL,
                        help="seconds between label refreshes (default %(default)s)")
    parser.add_argument("--driver-mode", choices=DRIVER_MODES, default="native",
                        help="gpu.driver.mode: native (driver maintained on the host) or cloud "
                             "(installed by the GPU Operator) (default %(default)s)")
    parser.add_argument("--driver-labels", choices=("true", "false"), default="true",
                        help="write driver.ready and gpu.driver.mode (false: the GPU Operator's driver "
                             "component owns them, docs/design-decisions.md) (default %(default)s)")
    parser.add_argument("--once", action="store_true", help="one refresh, then exit (0 when it succeeded)")
    parser.add_argument("--ready-file", default="",
                        help="a file created after the first refresh that succeeded and removed on exit, "
                             "for the pod's probe (default: none)")
    return parser


# The apiserver could not be reached or refused the request; retried with backoff (kube/node.py's error).
ApiUnavailable = NodeUnavailable


class Labeller:
    """One node's labels. ``read_labels()`` and ``patch_labels(patch)`` talk to the apiserver."""

    def __init__(self, host: HostRoot, driver_mode: str, read_labels: Callable[[], Mapping[str, str]],
                 patch_labels: Callable[[Dict[str, Optional[str]]], None], driver_labels: bool = True) -> None:
        self.host = host
        # keys another writer owns in this deployment: neither set nor removed here
        self.foreign: Tuple[str, ...] = () if driver_labels else DRIVER_OWNED_KEYS
        self.driver_mode = driver_mode
        self.read_labels = read_labels
        self.patch_labels = patch_labels
        self.writes = 0
        self.last_desired: Optional[Dict[str, str]] = None
        self.warnings: Tuple[str, ...] = ()

    def desired(self) -> Dict[str, str]:
        inventory = discover(self.host, topology=False)
        # each warning once when it appears, not on every refresh
        for warning in inventory.warnings:
            if warning not in self.warnings:
                LOG.warning("%s", warning, extra={"fields": {"mx_smi_unparsed": warning in inventory.unparsed}})
        self.warnings = inventory.warnings
        return {k: v for k, v in node_labels(inventory, self.driver_mode).items() if k not in self.foreign}

    def sync(self) -> Dict[str, Optional[str]]:
        """One refresh; returns the patch written ({} when nothing changed).

        Raises DiscoveryError/HostRootError (the node cannot be read: nothing
        is written) or ApiUnavailable.
        """
        desired = self.desired()
        current = dict(self.read_labels())
        desired = keep_known_product(current, desired)
        if desired != self.last_desired:
            LOG.info("computed %d labels", len(desired), extra={"fields": {"labels": desired}})
        self.last_desired = desired
        patch = {k: v for k, v in label_changes(current, desired).items() if k not in self.foreign}
        if patch:
            self.patch_labels(patch)
            self.writes += 1
            LOG.info("labels updated: %s", ", ".join(
                "%s=%s" % (k, v) if v is not None else "-" + k for k, v in sorted(patch.items())),
                extra={"fields": {"patch": patch}})
        else:
            LOG.debug("labels up to date")
        return patch


def kube_label_access(api_client, node_name: str, timeout: float = 10.0):
    """(read_labels, patch_labels) for :class:`Labeller`: our own node through kube/node.py
    (ApiUnavailable with the RBAC or node-name hint)."""
    own = OwnNode(core_v1(api_client), node_name, timeout)

    def patch_labels(patch: Dict[str, Optional[str]]) -> None:
        own.patch(labels=patch)

    return own.labels, patch_labels


def run_loop(labeller: Labeller, interval: float, stop: threading.Event, once: bool = False,
             ready_file: str = "") -> int:
    backoff = Backoff(initial=1.0, cap=max(1.0, min(60.0, interval)))
    try:
        while not stop.is_set():
            try:
                labeller.sync()
            except ApiUnavailable as exc:
                delay = backoff.next_delay()
                LOG.warning("cannot update the node labels (retrying in %.1fs): %s", delay, exc)
                if once:
                    return 1
                stop.wait(delay)
                continue
            except (DiscoveryError, HostRootError) as exc:
                LOG.error("cannot read the node's GPUs, labels left as they are: %s", exc)
                if once:
                    return 1
                stop.wait(interval)
                continue
            backoff.reset()
            # Once labelled, the node stays labelled while the apiserver is away: ready is not withdrawn.
            if ready_file and not os.path.exists(ready_file):
                _mark_ready(ready_file)
            if once:
                return 0
            stop.wait(interval)
        LOG.info("stopping")
        return 0
    finally:
        if ready_file and os.path.exists(ready_file):
            os.unlink(ready_file)


def _mark_ready(path: str) -> None:
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("labelled\n")


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(COMPONENT, args)
    if not args.node_name:
        raise UsageError("--node-name is required (or NODE_NAME from the downward API)")
    host = checked_host_root(args, "sys")
    read_labels, patch_labels = kube_label_access(kube_api_client(args.kubeconfig), args.node_name)
    labeller = Labeller(host, args.driver_mode, read_labels, patch_labels, driver_labels=args.driver_labels == "true")
    LOG.info("gpu-label starting", extra={"fields": {
        "node": args.node_name, "host_root": host.path, "interval": args.interval,
        "driver_mode": args.driver_mode, "owned_keys": list(OWNED_LABEL_KEYS)}})
    return run_loop(labeller, args.interval, stop_event(), once=args.once, ready_file=args.ready_file)


if __name__ == "__main__":
    run_main(COMPONENT, lambda: main(sys.argv[1:]))
