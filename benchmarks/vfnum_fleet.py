# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""N stand-in driver-managers in one process, for benchmarks/scale_driver_config.py.

    python benchmarks/vfnum_fleet.py --collections DIR --kubeconfig F --names FILE \\
        --roots DIR --max-parallel P [--namespace metax-operator]

Each stand-in is the real code, imported from ``--collections`` (this
checkout's tree, or another's for a before/after run): driver_manager's
``Kube`` (the same driver-config and Node watches, the same node patches,
pod list and Events) and ``Manager`` with its vfnum path (``vfnum_round``,
``reconcile_vfnum``, the vfnum slots of ``kube/slots.py``), over a simulated
root of the 2xC550-sriov preset of its own, driven by ``run_loop`` as in the
DaemonSet's pod. What is left out is the driver part of a round (package
queries, ``mx-smi``): several processes per round and per node that each real
node runs on its own CPU, here all on the same two cores.

Shared by every stand-in: the token (the chart's ``driver-manager`` service
account) and this process's CPU (two cores for every stand-in, where each
real node has its own). Not shared: the ``ApiClient``. The real code allows
one for all (``Kube`` takes any), but its connection pool is a queue under
one lock: with 500 stand-ins, ~440 rounds at once queued on that lock in a
futex storm (``py-spy dump``), a cost of the benchmark, not of driver-manager.

It prints ``ready N`` once every stand-in finished its first round, and on
``stop`` (or EOF) on stdin, one JSON line: the slot hold times (take to
release), the apply times, the most stand-ins holding a slot at once, and the
rounds run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import threading
import time
from typing import Any, Dict, List


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--collections", required=True, help="the collections tree to import driver_manager from")
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--names", required=True, help="a file with one node name a line")
    parser.add_argument("--roots", required=True, help="a directory for the simulated roots")
    parser.add_argument("--max-parallel", type=int, required=True)
    parser.add_argument("--namespace", default="metax-operator")
    parser.add_argument("--interval", type=float, default=30.0, help="seconds between rounds (the chart's)")
    return parser.parse_args()


class Stats:
    """What the stand-ins did, counted under one lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.holding = 0
        self.max_holding = 0
        self.holds: List[float] = []
        self.applies: List[float] = []
        self.rounds = 0
        self.first_rounds = 0

    def as_dict(self) -> Dict[str, Any]:
        with self.lock:
            return {"holds_s": sorted(self.holds), "applies_s": sorted(self.applies), "rounds": self.rounds,
                    "max_holding": self.max_holding}


def main() -> int:
    args = parse()
    # the tree under test first: this checkout's scale_common is not imported here
    sys.path.insert(0, os.path.abspath(args.collections))
    # pylint: disable=import-outside-toplevel
    from ansible_collections.metax.gpu.plugins.module_utils.agents import driver_manager as dm
    from ansible_collections.metax.gpu.plugins.module_utils.agents.common import kube_api_client
    from ansible_collections.metax.gpu.plugins.module_utils.sim import generator
    from ansible_collections.metax.gpu.plugins.module_utils.sim.spec import preset

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))     # three watches per stand-in
    threading.stack_size(512 * 1024)                              # six threads per stand-in
    with open(args.names, encoding="utf-8") as src:
        names = [line.strip() for line in src if line.strip()]
    stats = Stats()
    stop = threading.Event()

    class StandIn(dm.Manager):
        """driver-manager's Manager, its driver part left out (see the module docstring)."""

        def reconcile_driver(self, params: Any) -> Dict[str, object]:
            return {}

        def apply_vfnum(self, wanted: int, plan: Any) -> str:
            started = time.monotonic()
            try:
                return super().apply_vfnum(wanted, plan)
            finally:
                with stats.lock:
                    stats.applies.append(time.monotonic() - started)

        def round(self) -> bool:
            try:
                return super().round()
            finally:
                with stats.lock:
                    stats.rounds += 1
                    if not getattr(self, "_counted", False):
                        self._counted = True     # pylint: disable=attribute-defined-outside-init
                        stats.first_rounds += 1

    def counted(slots: Any) -> None:
        """Time each hold of ``slots`` (take to release) and count the holders at once."""
        take, release = slots.take, slots.release
        since: List[float] = []

        def counted_take() -> Any:
            got = take()
            if got and not since:
                since.append(time.monotonic())
                with stats.lock:
                    stats.holding += 1
                    stats.max_holding = max(stats.max_holding, stats.holding)
            return got

        def counted_release() -> None:
            if since:
                with stats.lock:
                    stats.holding -= 1
                    stats.holds.append(time.monotonic() - since.pop())
            release()
        slots.take, slots.release = counted_take, counted_release

    spec = preset("2xC550-sriov")
    managers = []
    for name in names:
        host = generator.create(os.path.join(args.roots, name), spec)
        # a client per stand-in, as each pod has: one shared client's connection pool (a queue
        # under one lock) made 500 stand-ins queue on that lock, not on the API server
        kube = dm.Kube(kube_api_client(args.kubeconfig), name, args.namespace, "driver-config")
        manager = StandIn(host, kube, "Never", os.path.join(args.roots, "payload"), None,
                          os.path.join(args.roots, name, "ready"),
                          vfnum_policy=dm.VfnumPolicy(False, args.max_parallel))
        manager.driver_verified = True      # the vfnum entry goes first, as on a node whose driver is up
        counted(manager.slots)
        managers.append(manager)
    for manager in managers:       # every root made first: the first rounds do not compete with that
        threading.Thread(target=dm.run_loop, args=(manager, args.interval, stop), daemon=True).start()
    while stats.first_rounds < len(names):
        time.sleep(0.2)
    print("ready %d" % len(names), flush=True)
    for line in sys.stdin:
        if line.strip() == "stop":
            break
    stop.set()
    print(json.dumps(stats.as_dict()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
