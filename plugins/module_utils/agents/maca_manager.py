# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""maca-manager: the GPU Operator's MACA component on one node (issue 25, the real ``metax-maca``).

    python -m ansible_collections.metax.gpu.plugins.module_utils.agents.maca_manager \\
        --host-root /host --payload-dir /payloads \\
        --image REGISTRY/maca-c500:2.18.0.3-ubuntu18.04-amd64 --image REGISTRY/maca-n100:...

Thin: the payload is chosen by ``maca/payload.py`` from the node's GPUs (read
from its sysfs by the GPU domain code), and installed by ``maca/install.py``,
the code of ``metax.gpu.maca`` and the ``maca_host`` role: ``/opt/maca-<version>``
whole or absent, ``/opt/maca`` switched in one rename, the previous ``--keep``
versions kept for running pods. The tree is copied by the archive rules
(links copied, never followed; devices skipped; ``--max-members``,
``--max-member-size``, ``--max-total-size`` bound it: docs/security.md). The kubelet mounts each ``--image`` read-only
at ``--payload-dir/<its index>`` (an image volume), so the copy reads the
image's ``/opt/maca`` straight from the node's image store.
When the node runs the version, it writes ``--ready-file`` (the pod's
readiness probe; the controller then sets ``maca.ready``). A failure is
logged and retried with backoff; the agent writes nothing on the Node.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from typing import List, Optional, Sequence

from ..archive import DEFAULT_LIMITS, ArchiveError, Limits, parse_size
from ..backoff import Backoff
from ..errors import MetaxGpuError
from ..gpu.discovery import discover
from ..host import HostRoot
from ..maca import install as maca_install
from ..maca.layout import version_of_image
from ..maca.payload import select_image
from .common import add_common_flags, checked_host_root, non_negative_int, positive_float, run_main, setup_logging, \
    stop_event

COMPONENT = "maca-manager"
LOG = logging.getLogger(COMPONENT)
DEFAULT_READY_FILE = "/run/maca-manager/ready"
TREE = "opt/maca"   # where the payload image holds MXMACA


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=COMPONENT, description="Install MXMACA on the node from its payload image.")
    add_common_flags(parser)
    parser.add_argument("--payload-dir", required=True,
                        help="where the payload images are mounted, one directory per --image (0, 1, ...)")
    parser.add_argument("--image", action="append", default=[], required=True,
                        help="a payload image reference, in the order of --payload-dir's directories (repeat)")
    parser.add_argument("--keep", type=non_negative_int, default=1,
                        help="other versions kept besides the active one, for running pods (default 1)")
    parser.add_argument("--interval", type=positive_float, default=60.0,
                        help="seconds between checks that the node still runs the version (default 60)")
    parser.add_argument("--ready-file", default=DEFAULT_READY_FILE, help=argparse.SUPPRESS)
    # the payload tree is copied with the archive rules and bounds (module_utils/archive/, docs/security.md)
    parser.add_argument("--max-members", type=_positive_int, default=DEFAULT_LIMITS.max_members,
                        help="the most files, directories and links the payload's tree may hold (default %d)"
                        % DEFAULT_LIMITS.max_members)
    parser.add_argument("--max-member-size", type=_size, default=DEFAULT_LIMITS.max_member_size,
                        help="the largest file it may hold, bytes or with a binary unit like 32GiB (default 32GiB)")
    parser.add_argument("--max-total-size", type=_size, default=DEFAULT_LIMITS.max_total_size,
                        help="the most it may copy to the node, bytes or like 128GiB (default 128GiB)")
    return parser


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ArchiveError as exc:
        raise argparse.ArgumentTypeError(str(exc))


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError("%r is not a positive number" % text)
    return value


def limits_of(args: argparse.Namespace) -> Limits:
    return Limits(max_members=args.max_members, max_member_size=args.max_member_size,
                  max_total_size=args.max_total_size)


def converge(host: HostRoot, payload_dir: str, images: Sequence[str], keep: int,
             limits: Limits = DEFAULT_LIMITS) -> str:
    """Install and activate the node's MXMACA; returns the version active afterwards."""
    products: List[str] = [gpu.product for gpu in discover(host, topology=False).gpus]
    index = select_image(images, products)
    version = version_of_image(images[index])
    started = time.monotonic()
    plan = maca_install.install(host, None, version, keep, tree=os.path.join(payload_dir, str(index), TREE),
                                limits=limits)
    if plan.install or plan.switch or plan.remove:
        LOG.info("MXMACA %s from %s active (was %s; copied: %s in %.1f s; removed: %s)", version, images[index],
                 plan.active_before, plan.install, time.monotonic() - started, ", ".join(plan.remove) or "none")
    return version


def _set_ready(path: str, version: Optional[str]) -> None:
    if version is None:
        if os.path.exists(path):
            os.unlink(path)
        return
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    # whole or absent: the probe (and a reader) never sees it half written
    with open(path + ".new", "w") as handle:
        handle.write(version + "\n")
    os.replace(path + ".new", path)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(COMPONENT, args)
    host = checked_host_root(args, "sys")
    stop = stop_event()
    backoff = Backoff(initial=2.0, cap=300.0)
    try:
        while True:
            try:
                _set_ready(args.ready_file, converge(host, args.payload_dir, args.image, args.keep, limits_of(args)))
                backoff.reset()
                delay = args.interval
            except MetaxGpuError as exc:
                # the same failure again in 2 s, 4 s, ... 5 min: never a tight loop
                _set_ready(args.ready_file, None)
                delay = backoff.next_delay()
                LOG.error("%s (retry in %.0f s)", exc, delay)
            if stop.wait(delay):
                break
    finally:
        _set_ready(args.ready_file, None)
    return 0


if __name__ == "__main__":
    run_main(COMPONENT, lambda: main(sys.argv[1:]))
