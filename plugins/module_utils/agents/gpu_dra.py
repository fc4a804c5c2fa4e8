# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""gpu-dra: the Dynamic Resource Allocation driver ``gpu.metax-tech.com`` (docs/dra.md).

Run as::

    python -m ansible_collections.metax.gpu.plugins.module_utils.agents.gpu_dra \\
        --host-root /host --node-name NODE [--healthy-interval 5] [--cdi-spec-dir /var/run/cdi] \\
        [--maca-root /opt/maca] [--plugins-dir /var/lib/kubelet/plugins] \\
        [--plugins-registry-dir /var/lib/kubelet/plugins_registry]

It serves the kubelet's DRA node service (NodePrepareResources /
NodeUnprepareResources, dra/v1) on ``<plugins-dir>/gpu.metax-tech.com/dra.sock``
and offers its registration on ``<plugins-registry-dir>/gpu.metax-tech.com-reg.sock``,
where the kubelet's plugin watcher finds it; it publishes the node's GPUs as
ResourceSlices (one pool per node) and republishes them, with the pool's next
generation, when a device changes or its health does (gpu-device's checks,
every ``--healthy-interval`` seconds: an unhealthy device carries the taint
``gpu.metax-tech.com/unhealthy``, removed when it recovers).

One mode per node: gpu-dra serves a node only while its label
``metax-tech.com/gpu.device-mode`` is ``dra`` (the chart's nodeAffinity says
the same; this check keeps a gpu-dra started any other way from serving a node
the device plugin serves). Until then it waits, registering nothing. Once in
DRA mode it publishes its pool only after the device plugin stopped serving
the node (the Node's allocatable ``metax-tech.com/gpu`` 0 or absent), and when
it stops on a node that left DRA mode it deletes its pool: at no moment are
the two serving one node (docs/dra.md "Switching a node").

The device health that taints the devices also goes to the kubelet's health
stream (KEP-4680, dra/health.py), which writes it into the status of the pods
holding the devices.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Sequence

from ..cdi.spec import CdiDevice
from ..cdi.writer import MACA_ROOT, host_maca
from ..deviceplugin.devices import DeviceState, Snapshot
from ..deviceplugin.containers import reading_discovery
from ..dra import slices as S
from ..dra.health import HealthFeed
from ..dra.prepare import CheckpointError, Preparer, cdi_devices
from ..dra.publish import SliceApi, publish
from ..dra.server import DraPlugin
from ..errors import MetaxGpuError
from ..gpu.discovery import DiscoveryError, discover
from ..host import HostRoot, HostRootError
from ..kube.client import ApiException
from ..kubelet import constants as KC
from ..kubelet.grpc_api import HAS_GRPC, REQUIRED
from ..names import CDI_SPEC_DIR, DEVICE_MODE_DRA, DRA_DRIVER, LABEL_DEVICE_MODE, RESOURCE_NAME
from ..backoff import Backoff
from .common import (UsageError, add_common_flags, checked_host_root, kube_api_client, non_negative_int,
                     positive_float, process_age, run_main, setup_logging, stop_event)

COMPONENT = "gpu-dra"
LOG = logging.getLogger(COMPONENT)
WATCH_SECONDS = 1.0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpu-dra", description="MetaX GPU DRA driver (%s)." % DRA_DRIVER)
    add_common_flags(parser)
    parser.add_argument("--node-name", default=os.environ.get("NODE_NAME", ""),
                        help="this node's name: its pool and ResourceSlices (default: $NODE_NAME)")
    parser.add_argument("--plugins-dir", default=KC.PLUGINS_DIR,
                        help="the kubelet's plugins directory (default %(default)s)")
    parser.add_argument("--plugins-registry-dir", default=KC.PLUGINS_REGISTRY_DIR,
                        help="the kubelet's plugin registration directory (default %(default)s)")
    parser.add_argument("--healthy-interval", type=non_negative_int, default=5,
                        help="seconds between GPU health checks; 0 disables them (default %(default)s)")
    parser.add_argument("--resync-interval", type=positive_float, default=60.0,
                        help="seconds between full comparisons of the ResourceSlices with the node "
                             "(default %(default)s)")
    parser.add_argument("--cdi-spec-dir", default=CDI_SPEC_DIR,
                        help="where the per-claim CDI specs are written (default %(default)s)")
    parser.add_argument("--maca-root", default=MACA_ROOT,
                        help="the host's MXMACA, under the host root ('' = devices only; default %(default)s)")
    parser.add_argument("--ignore-mode-label", action="store_true",
                        help="serve the node whatever its %s label says (tests only)" % LABEL_DEVICE_MODE)
    return parser


def slice_devices(snapshot: Snapshot, previous: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The pool's devices from gpu-device's view of the node (``DeviceState``): its health verdict
    per device, the last full scan's attributes, gone devices kept tainted."""
    if snapshot.inventory is None:
        return S.taint_all(previous)
    health = {adv.id: adv.healthy for adv in snapshot.devices}
    gone = [adv.id for adv in snapshot.devices if not adv.present]
    return S.build_devices(snapshot.inventory, health, previous, gone)


class GpuDraAgent:
    """Every moving part of gpu-dra; :meth:`run` until ``stop`` is set.

    ``api`` has SliceApi's methods (list, create, replace, delete, get_claim, node_mode, plugin_allocatable).
    """

    def __init__(self, host: HostRoot, node_name: str, api: Any, plugins_dir: str = KC.PLUGINS_DIR,
                 registry_dir: str = KC.PLUGINS_REGISTRY_DIR, spec_dir: str = CDI_SPEC_DIR,
                 maca_root: Optional[str] = MACA_ROOT, healthy_interval: int = 5, resync_interval: float = 60.0,
                 check_mode: bool = True, stop: Optional[threading.Event] = None) -> None:
        self.host = host
        self.node_name = node_name
        self.api = api
        self.healthy_interval = healthy_interval
        self.resync_interval = resync_interval
        self.check_mode = check_mode
        self.stop = stop or threading.Event()
        self.state = DeviceState(host, check_health=healthy_interval > 0,
                                 discover_fn=reading_discovery(for_containers=False))
        self.maca_root = maca_root
        self.preparer = Preparer(node_name, os.path.join(plugins_dir, DRA_DRIVER), spec_dir, api.get_claim,
                                 self.node_devices, self.maca, host.host_path)
        self.health = HealthFeed(node_name, check_interval=healthy_interval)
        self.plugin = DraPlugin(self.preparer, plugins_dir, registry_dir, health=self.health)
        self.published: List[Dict[str, Any]] = []
        self.publishes = 0
        self.last_error: Optional[str] = None
        self._threads: List[threading.Thread] = []

    # -- what Prepare reads -------------------------------------------
    def node_devices(self) -> Dict[str, CdiDevice]:
        inventory = self.state.snapshot().inventory
        if inventory is None:
            try:
                inventory = discover(self.host, topology=False)
            except (DiscoveryError, HostRootError, OSError) as exc:
                LOG.warning("cannot read the node's devices: %s", exc)
                return {}
        return cdi_devices(inventory)

    def maca(self):
        return host_maca(self.host, self.maca_root) if self.maca_root else None

    # -- the node's mode ------------------------------------------------
    def wait_for_mode(self) -> bool:
        """True once the node is in DRA mode (or the check is off); False when stopped first."""
        if not self.check_mode:
            return True
        backoff = Backoff(initial=2.0, cap=30.0)
        said = None
        while not self.stop.is_set():
            try:
                mode = self.api.node_mode()
            except Exception as exc:  # pylint: disable=broad-except  # the client raises many kinds
                mode, reason = None, "cannot read node %s: %s" % (self.node_name, exc)
            else:
                if mode == DEVICE_MODE_DRA:
                    LOG.info("node %s is in DRA mode (%s=%s)", self.node_name, LABEL_DEVICE_MODE, mode)
                    return True
                reason = "node %s has %s=%s, not %s: the device plugin serves it; waiting" % (
                    self.node_name, LABEL_DEVICE_MODE, mode or "(unset)", DEVICE_MODE_DRA)
            if reason != said:
                LOG.warning("%s", reason)
                said = reason
            self.stop.wait(backoff.next_delay())
        return False

    def wait_for_plugin_gone(self, stopped: threading.Event) -> bool:
        """True once the device plugin serves nothing on the node (or the check is off); False when stopped.

        A node switched to DRA by its label alone: the DaemonSet controller removes gpu-device, the
        kubelet zeroes its devices and reports that at its next node-status update; until then the
        scheduler could still place device-plugin pods, so the pool is not published."""
        if not self.check_mode:
            return True
        backoff = Backoff(initial=1.0, cap=5.0)
        said = None
        while not self.stop.is_set() and not stopped.is_set():
            try:
                count = self.api.plugin_allocatable()
            except Exception as exc:  # pylint: disable=broad-except  # the client raises many kinds
                reason = "cannot read node %s's allocatable (retrying): %s" % (self.node_name, exc)
            else:
                if count == 0:
                    if said is not None:
                        LOG.info("the device plugin serves nothing on %s any more: publishing", self.node_name)
                    return True
                reason = ("the device plugin still serves %d %s on %s: publishing once it has stopped"
                          % (count, RESOURCE_NAME, self.node_name))
            if reason != said:
                LOG.warning("%s", reason)
                said = reason
            stopped.wait(backoff.next_delay())
        return False

    # -- ResourceSlices -------------------------------------------------
    def publish_once(self) -> bool:
        """Bring the slices in line with the node; False when the API server refused or was away."""
        devices = slice_devices(self.state.snapshot(), self.published)
        # the kubelet's health stream gets it whether or not the API server takes the slices
        self.health.update(devices)
        try:
            result = publish(self.api, self.node_name, devices)
        except (ApiException, MetaxGpuError, OSError) as exc:
            self.last_error = str(exc)
            LOG.warning("cannot publish the ResourceSlices (retrying): %s", exc)
            return False
        except Exception as exc:  # pylint: disable=broad-except  # urllib3 and friends
            self.last_error = str(exc)
            LOG.warning("cannot publish the ResourceSlices (retrying): %s", exc)
            return False
        before = {name for name, _reason in S.tainted(self.published)}
        now = dict(S.tainted(devices))
        for name in sorted(set(now) - before):
            LOG.warning("device %s tainted %s (%s)", name, S.DRA_TAINT_UNHEALTHY, now[name])
        for name in sorted(before - set(now)):
            LOG.info("device %s recovered: taint removed", name)
        self.published = devices
        self.last_error = None
        if result.changed:
            self.publishes += 1
        return True

    def publish_loop(self, stopped: Optional[threading.Event] = None) -> None:
        backoff = Backoff(initial=1.0, cap=30.0)
        version = -1
        stopped = stopped or threading.Event()
        if not self.wait_for_plugin_gone(stopped):
            return
        while not self.stop.is_set() and not stopped.is_set():
            ok = self.publish_once()
            version = self.state.version if ok else version
            if not ok:
                stopped.wait(backoff.next_delay())
                continue
            backoff.reset()
            # the next change of the device list or its health, or the periodic resync
            self.state.wait_for_change(version, self.resync_interval)

    def health_loop(self) -> None:
        while not self.stop.wait(self.healthy_interval):
            self.state.refresh()
            self.health.checked(time.time())

    def _start_thread(self, target, name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def mode_is_dra(self) -> bool:
        """The label now (an unreadable Node keeps the current mode: the API server may be away)."""
        if not self.check_mode:
            return True
        try:
            return self.api.node_mode() == DEVICE_MODE_DRA
        except Exception:  # pylint: disable=broad-except
            return True

    def withdraw(self) -> None:
        """The node left DRA mode: unregister and delete the pool, so the scheduler stops placing
        claims on it while the device plugin takes over."""
        self.plugin.stop()
        deleted = 0
        try:
            for item in self.api.list():
                self.api.delete(item["metadata"]["name"])
                deleted += 1
        except Exception as exc:  # pylint: disable=broad-except
            LOG.warning("cannot delete the ResourceSlices of %s: %s", self.node_name, exc)
        self.published = []
        # a warning when it took a pool away from the scheduler; a gpu-dra that never served says so quietly
        LOG.log(logging.WARNING if deleted else logging.INFO,
                "node %s is not in DRA mode: unregistered, %d ResourceSlice(s) deleted", self.node_name, deleted)

    def serve(self) -> None:
        """Register and publish until stopped or the node leaves DRA mode."""
        stopped = threading.Event()
        publisher = threading.Thread(target=self.publish_loop, args=(stopped,), name="publish", daemon=True)
        publisher.start()
        self.plugin.start()
        checked = 0.0
        while not self.stop.wait(WATCH_SECONDS):
            checked += WATCH_SECONDS
            if checked >= self.resync_interval:
                checked = 0.0
                if not self.mode_is_dra():
                    break
            if not self.plugin.sockets_present():
                # the kubelet (re)starting cleans its directories: offer the sockets again
                LOG.warning("a plugin socket is gone: serving and registering again")
                self.plugin.start()
        stopped.set()
        self.state.wake()
        publisher.join(5.0)
        if not self.stop.is_set():
            self.withdraw()

    def run(self) -> int:
        self.state.refresh()
        if self.healthy_interval > 0:
            self.health.checked(time.time())
        snap = self.state.snapshot()
        LOG.info("found %d MetaX device(s), %d healthy; %d claim(s) prepared before", len(snap.devices),
                 len(snap.healthy_ids), len(self.preparer.prepared))
        if self.healthy_interval > 0:
            self._start_thread(self.health_loop, "health")
        while self.wait_for_mode():
            self.serve()
        LOG.info("stopping")
        if not self.mode_is_dra():
            # stopped because the node left DRA mode (the DaemonSet controller removes us before our
            # next look at the label): the pool goes with us, else the device plugin coming back
            # would serve the node beside it until the kubelet wipes it (30 s)
            self.withdraw()
        self.plugin.stop()
        self.state.wake()
        for thread in self._threads:
            thread.join(5.0)
        return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(COMPONENT, args)
    if not HAS_GRPC:
        raise UsageError(REQUIRED)
    if not args.node_name:
        raise UsageError("--node-name (or NODE_NAME) is required: it names the node's pool")
    host = checked_host_root(args, "sys/bus/pci/devices")
    client = kube_api_client(args.kubeconfig)
    stop = stop_event()
    try:
        agent = GpuDraAgent(host, args.node_name, SliceApi(client, args.node_name), args.plugins_dir,
                            args.plugins_registry_dir, args.cdi_spec_dir, args.maca_root or None,
                            args.healthy_interval, args.resync_interval, check_mode=not args.ignore_mode_label,
                            stop=stop)
    except CheckpointError as exc:
        raise UsageError("%s (move it aside to start without the claims it lists)" % exc)
    age = process_age()
    LOG.info("gpu-dra starting%s", "" if age is None else ", %.2f s after its process began" % age,
             extra={"fields": {"host_root": host.path, "node": args.node_name, "plugins_dir": args.plugins_dir,
                               "healthy_interval": args.healthy_interval, "since_start": age}})
    return agent.run()


if __name__ == "__main__":
    run_main(COMPONENT, lambda: main(sys.argv[1:]))
