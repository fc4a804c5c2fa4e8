# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Command line for the allocator (JSON on stdout)::

    python -m ansible_collections.metax.gpu.plugins.module_utils.gpu.allocator_cli \\
        --host-root DIR [--exclude 0,1] [--must-include 2] --size N
    python -m ... --host-root DIR [--exclude 0,1] --tables

A tool for administrators and developers, never imported by a module. A
simulator preset instead of a host root is ``sim.allocator_cli`` (same
options plus ``--preset NAME [--vfs N]``): the simulator is above this layer
and passes its preset loader in (:func:`main`'s ``presets``), so nothing here
imports it.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Callable, List, Optional, Sequence, Tuple

from .allocator import AllocationError, _as_index_set, allocate, indices_to_ids, per_count_tables
from .model import Inventory, Topology


# -- command line ------------------------------------------------------------

def _index_list(text: str) -> List[int]:
    out: List[int] = []
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            out.extend(range(int(lo), int(hi) + 1))
        else:
            out.append(int(part))
    return out


# A preset loader: (preset name, VFs per GPU) -> its topology (the simulator's, in sim.allocator_cli).
PresetLoader = Callable[[str, int], Topology]
PROG = "python -m ansible_collections.metax.gpu.plugins.module_utils.gpu.allocator_cli"


def _load(args: argparse.Namespace, presets: Optional[PresetLoader]) -> Tuple[Topology, List[int], Optional[Inventory]]:
    """Topology, the healthy device indices, and the inventory when there is one."""
    if presets is not None and args.preset:
        topo = presets(args.preset, args.vfs)
        return topo, list(topo.device_indices), None
    from ..host import HostRoot, HostRootError
    from .discovery import DiscoveryError, discover
    try:
        inventory = discover(HostRoot(args.host_root))
    except (DiscoveryError, HostRootError) as exc:
        raise AllocationError(str(exc))
    healthy = [dev.index for dev in inventory.devices if dev.healthy]
    return inventory.topology, healthy, inventory


def main(argv: Optional[Sequence[str]] = None, presets: Optional[PresetLoader] = None, prog: str = PROG) -> int:
    """The command line; ``presets`` (given by sim.allocator_cli) adds ``--preset`` and ``--vfs``."""
    parser = argparse.ArgumentParser(
        prog=prog, description="Choose MetaX GPUs for a request, or print the per-count score/loss tables.")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--host-root", help="node root to discover (/ on a node, a simulated root in tests)")
    if presets is not None:
        where.add_argument("--preset", help="a simulator preset instead of a host root (e.g. 8xC500)")
        parser.add_argument("--vfs", type=int, default=0, help="with --preset: VFs per GPU (SR-IOV)")
    parser.add_argument("--exclude", type=_index_list, default=[],
                        help="device indices already allocated, e.g. 0,1 or 0-3")
    parser.add_argument("--must-include", type=_index_list, default=[], help="device indices the set must contain")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--size", type=int, help="number of devices to allocate")
    what.add_argument("--tables", action="store_true", help="print the per-count score and loss tables")
    args = parser.parse_args(argv)
    try:
        topology, healthy, inventory = _load(args, presets)
        known = frozenset(topology.device_indices)
        _as_index_set(args.exclude, "exclude", known)
        available = [i for i in healthy if i not in set(args.exclude)]
        if args.tables:
            scores, losses = per_count_tables(topology, available)
            out: dict = {"available": available,
                         "scores": {str(n): v for n, v in sorted(scores.items())},
                         "losses": {str(n): v for n, v in sorted(losses.items())}}
        else:
            alloc = allocate(topology, available, args.size, args.must_include)
            out = alloc.to_dict()
            out["available"] = available
            if inventory is not None:
                out["ids"] = indices_to_ids(inventory, alloc.devices)
    except (AllocationError, ValueError, OSError) as exc:
        sys.stderr.write("error: %s\n" % exc)
        return 2
    sys.stdout.write(json.dumps(out, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
