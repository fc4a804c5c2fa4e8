# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""container-runtime: makes a node's container runtime read CDI, adds the runtime handler ``metax``, and takes both back on removal.

Run as (the operator's ``runtime`` component, a DaemonSet on GPU nodes)::

    python -m ansible_collections.metax.gpu.plugins.module_utils.agents.container_runtime \\
        --host-root /host [--node-name NODE] [--runtime-version containerd://1.7.24] \\
        [--restart auto|never] [--write-spec] [--cdi-spec-dir /var/run/cdi]

At start it reads the node's runtime (the Node's containerRuntimeVersion, or
``--runtime-version``), plans what the runtime needs to read CDI
(:mod:`cdi.runtime_config`: nothing for containerd 2.x and CRI-O, a drop-in
for containerd 1.7, ``features.cdi`` for Docker 25+), applies it with the
originals recorded (:mod:`cdi.runtime_state`) and restarts the runtime only
when a file changed and the restart is safe (``--restart never``: never).
containerd also gets the runtime handler ``metax`` of the RuntimeClass
``metax`` beside its other runtimes (a copy of the default one, never the
default; :func:`cdi.runtime_config.runtime_handler`).
Then, once the running runtime reads CDI (no restart still due), it is ready
(the file ``--ready-file``, which the pod's readiness probe checks, and from
which the operator sets ``runtime.ready``). It never sets a default runtime.

With ``--write-spec`` it also keeps the node's CDI spec current
(:func:`cdi.writer.refresh` every ``--interval`` seconds): for nodes where
gpu-device does not run in CDI mode. Under the operator gpu-device writes it
(one writer per node: only gpu-device knows which names it hands out).

On SIGTERM, unless ``--no-revert-on-exit`` (the component removed,
the node drained), every file it changed goes back byte-identical unless
someone changed it since, and the runtime restarts again if it had to the
first time.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
from typing import Dict, Optional, Sequence, Tuple

from ..cdi.mode import parse_runtime
from ..cdi.runtime_config import Plan, plan
from ..cdi.runtime_state import STATE_FILE, apply, config_files, revert
from ..cdi.writer import MACA_ROOT, refresh
from ..host import HostRoot, replace_file
from ..names import CDI_SPEC_DIR, RUNTIME_HANDLER
from .common import (UsageError, add_common_flags, checked_host_root, kube_api_client, node_runtime_version,
                     positive_float, run_main, setup_logging, stop_event)

COMPONENT = "container-runtime"
LOG = logging.getLogger(COMPONENT)
READY_FILE = "/tmp/runtime-ready"
# How the runtime restarts from the pod: in the host's namespaces (hostPID), by its service manager.
RESTART = {"containerd": ["systemctl", "restart", "containerd"], "docker": ["systemctl", "restart", "docker"]}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=COMPONENT, description="Make the node's container runtime read CDI.")
    add_common_flags(parser)
    parser.add_argument("--node-name", default=os.environ.get("NODE_NAME", ""),
                        help="this node's name, to read its runtime version (default: $NODE_NAME)")
    parser.add_argument("--runtime-version", default="",
                        help="the runtime as the Node reports it (containerd://1.7.24); default: read the Node")
    parser.add_argument("--restart", choices=("auto", "never"), default="auto",
                        help="restart the runtime when a change needs it and it is safe (auto), or never")
    parser.add_argument("--state-file", default=STATE_FILE,
                        help="where the originals of changed files are kept, on the node (default %(default)s)")
    parser.add_argument("--no-revert-on-exit", dest="revert_on_exit", action="store_false",
                        help="leave the changed files on SIGTERM (default: put every one back)")
    parser.add_argument("--write-spec", action="store_true",
                        help="keep the node's CDI spec current too (default: no, gpu-device writes it)")
    parser.add_argument("--cdi-spec-dir", default=CDI_SPEC_DIR, help="the spec's directory (default %(default)s)")
    parser.add_argument("--maca-root", default=MACA_ROOT, help="the host's MXMACA (default %(default)s)")
    parser.add_argument("--interval", type=positive_float, default=5.0,
                        help="seconds between spec refreshes with --write-spec (default %(default)s)")
    parser.add_argument("--ready-file", default=READY_FILE, help=argparse.SUPPRESS)
    return parser


def config_texts(host: HostRoot) -> Dict[str, Optional[str]]:
    """The runtime config files a plan reads, from the node (None: absent)."""
    return config_files(host)


# Runs a command in the host's namespaces (the pod has hostPID and is privileged).
IN_HOST = ["nsenter", "--target", "1", "--mount", "--uts", "--ipc", "--net", "--pid", "--"]


def restart_runtime(service: str, runner=subprocess.run) -> bool:
    argv = IN_HOST + RESTART[service]
    LOG.info("restarting %s: %s", service, " ".join(argv))
    proc = runner(argv, capture_output=True, text=True, timeout=120, check=False)
    if proc.returncode != 0:
        LOG.error("restarting %s failed (%d): %s", service, proc.returncode, (proc.stderr or "").strip())
    return proc.returncode == 0


def enable(host: HostRoot, runtime_version: str, state_file: str, may_restart: bool,
           runner=subprocess.run) -> Tuple[Plan, bool]:
    """Apply the plan for the node's runtime; restart it when that is needed and safe.

    Returns the plan and whether the running runtime now reads CDI: not while
    a restart it needs for CDI is still due (unsafe, ``--restart never`` or
    failed), so the pod stays unready and gpu-device, which waits for
    ``runtime.ready``, does not hand out CDI names the runtime would not resolve.
    A restart due only for the runtime handler ``metax`` (containerd 2.x reads
    CDI already) does not hold readiness back: only pods naming the
    RuntimeClass ``metax`` wait for it, and the warning says so.
    """
    the_plan = plan(runtime_version, config_texts(host))
    outcome = apply(host, the_plan, state_file)
    LOG.info("%s", the_plan.reason, extra={"fields": {"changed": outcome.changed, "runtime": runtime_version}})
    if not (outcome.changed and the_plan.restart):
        return the_plan, True
    what = "to read CDI" if the_plan.restart_for_cdi else "for the runtime handler %s" % RUNTIME_HANDLER
    if not the_plan.restart_safe:
        LOG.warning("%s needs a restart %s, which would stop its containers (no live-restore): "
                    "restart it in a maintenance window", the_plan.restart, what)
        return the_plan, not the_plan.restart_for_cdi
    if not may_restart:
        LOG.warning("%s needs a restart %s (--restart never)", the_plan.restart, what)
        return the_plan, not the_plan.restart_for_cdi
    restarted = restart_runtime(the_plan.restart, runner)
    if not restarted and not the_plan.restart_for_cdi:
        LOG.warning("%s reads CDI; pods naming the RuntimeClass %s wait for its restart", the_plan.restart,
                    RUNTIME_HANDLER)
    return the_plan, restarted or not the_plan.restart_for_cdi


def disable(host: HostRoot, the_plan: Plan, state_file: str, may_restart: bool, runner=subprocess.run) -> None:
    outcome = revert(host, state_file)
    for message in outcome.messages:
        LOG.warning("%s", message)
    LOG.info("reverted: %s", ", ".join(outcome.changed) or "nothing to revert")
    if outcome.changed and the_plan.restart and the_plan.restart_safe and may_restart:
        restart_runtime(the_plan.restart, runner)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(COMPONENT, args)
    host = checked_host_root(args, "etc")
    runtime_version = args.runtime_version
    if not runtime_version:
        if not args.node_name:
            raise UsageError("--runtime-version or --node-name (or NODE_NAME) is needed")
        runtime_version = node_runtime_version(kube_api_client(args.kubeconfig), args.node_name) or ""
    if parse_runtime(runtime_version) is None:
        raise UsageError("cannot tell the node's container runtime from %r" % runtime_version)
    stop = stop_event()
    # A --host-prefix other than / is a simulated node root (the local cluster's): its
    # /etc/containerd is a copy that no running runtime reads, so restarting the
    # host's runtime for it would only disturb the host.
    simulated = args.host_prefix is not None and os.path.abspath(args.host_prefix) != "/"
    if simulated and args.restart == "auto":
        LOG.info("host prefix %s is not /: the runtime is never restarted for its files", args.host_prefix)
    may_restart = args.restart == "auto" and not simulated
    the_plan, reads_cdi = enable(host, runtime_version, args.state_file, may_restart)
    if reads_cdi:
        # whole or not there: the probe and the tests read it the moment it appears
        replace_file(args.ready_file, (the_plan.reason + "\n").encode("utf-8"))
    else:
        LOG.warning("not ready: the runtime reads CDI only after the restart above")
    try:
        while True:
            if args.write_spec:
                result = refresh(host, args.cdi_spec_dir, args.maca_root or None)
                if result.changed:
                    LOG.info("CDI spec %s rewritten", result.path)
            if stop.wait(args.interval):
                break
    finally:
        if os.path.exists(args.ready_file):
            os.unlink(args.ready_file)
        if args.revert_on_exit:
            disable(host, the_plan, args.state_file, may_restart)
    return 0


if __name__ == "__main__":
    run_main(COMPONENT, lambda: main(sys.argv[1:]))
