# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""N stand-in driver-managers in one process, for benchmarks/scale_driver_config.py.

    python benchmarks/vfnum_fleet.py --collections DIR --kubeconfig F --names FILE \\
        --roots DIR --max-parallel P [--namespace metax-operator] [--node-selector K=V] [--own-watches]

Each stand-in is the real code, imported from ``--collections`` (this
checkout's tree, or another's for a before/after run): driver_manager's
``Kube`` (the same node patches, ConfigMap and Node reads, pod list and
Events, each stand-in over an ``ApiClient`` of its own) and ``Manager`` with
its vfnum path (``vfnum_round``, ``reconcile_vfnum`` of vfnum/reconcile.py, the
vfnum slots of ``kube/slots.py``), over a simulated root of the 2xC550-sriov preset of its
own, driven by ``run_loop`` (and its slot waiter) as in the DaemonSet's pod.
What is left out is the driver part of a round (package queries, ``mx-smi``):
several processes per round and per node that each real node runs on its own
CPU, here all on the same two cores.

Shared by every stand-in: the token (the chart's ``driver-manager`` service
account), this process's CPU (two cores for every stand-in, where each real
node has its own), and **the watch transport**. A pod opens three watches of
its own (driver-config, its Node, the slot Leases: ``driver_manager.open_watches``);
here the fleet opens one per kind for all stand-ins (``driver_manager.watch_objects``,
the pod's own loop: the driver-config ConfigMap, the fleet's Nodes by
``--node-selector``, the slot pool's Leases by its label), decodes each event
once, and hands it to every stand-in's own decision -- the same
``driver_manager.Watched`` objects a pod's watch calls: ``ConfigWatched``
(``event_changes_config`` against that stand-in's ``config_version``),
``NodeWatched`` (its node's upgrade state, only its own Node's events), and
``SlotsWatched`` (that stand-in's ``Slots.relisted/seen/unwatched``). Why: with
a watch each, 500 stand-ins held 1,500 watches and every Lease event was
decoded 500 times through the kubernetes client under one GIL; 500 stand-ins
never reached a first ``success`` in 7.5 min. What this leaves unmeasured:
the API server's fan-out of one event to N watchers (here it sends each
event once), and the N watch connections it holds. ``--own-watches`` runs the
pod's ``open_watches`` per stand-in instead (the fleet before this change),
and so does a ``--collections`` tree without ``watch_objects``.

Not shared: the ``ApiClient`` of the rounds. The real code allows one for all
(``Kube`` takes any), but its connection pool is a queue under one lock: with
500 stand-ins, ~440 rounds at once queued on that lock in a futex storm
(``py-spy dump``), a cost of the benchmark, not of driver-manager.

It prints ``ready N`` once every stand-in finished its first round, and on
``stop`` (or EOF) on stdin, one JSON line: the slot hold times (take to
release), the apply times, the most stand-ins holding a slot at once, the
rounds run, and the events each shared watch handed out.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--collections", required=True, help="the collections tree to import driver_manager from")
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--names", required=True, help="a file with one node name a line")
    parser.add_argument("--roots", required=True, help="a directory for the simulated roots")
    parser.add_argument("--max-parallel", type=int, required=True)
    parser.add_argument("--namespace", default="metax-operator")
    parser.add_argument("--interval", type=float, default=30.0, help="seconds between rounds (the chart's)")
    parser.add_argument("--node-selector", default="", help="the label selector of the fleet's Nodes (shared watch)")
    parser.add_argument("--own-watches", action="store_true",
                        help="three watches per stand-in, as each pod has (no shared watch)")
    return parser.parse_args()


class Stats:
    """What the stand-ins did. Only the slot count (a take or a release: two per node changed) is
    under a lock. What every round or every event counts has one writer each (a stand-in's own
    counter, a shared watch's own) and is summed at the end: a lock taken by every round and by the
    watch threads, with 500 stand-ins, queued a few hundred threads on it -- the Lease watch among
    them, so the stand-ins' views went stale and slots stood free (a cost of the benchmark)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.holding = 0
        self.max_holding = 0
        self.holds: List[float] = []
        self.applies: List[float] = []        # list.append: atomic, no lock

    def as_dict(self, rounds: int, events: Dict[str, int]) -> Dict[str, Any]:
        with self.lock:
            return {"holds_s": sorted(self.holds), "applies_s": sorted(self.applies), "rounds": rounds,
                    "max_holding": self.max_holding, "events": events}


def _name(obj: Any) -> Optional[str]:
    """An object's name as the watch hands it: the API server's JSON (kube/watch.py), or a client model
    (a ``--collections`` tree from before)."""
    if isinstance(obj, dict):
        return (obj.get("metadata") or {}).get("name")
    return getattr(getattr(obj, "metadata", None), "name", None)


class Shared:
    """One watch's events handed to every stand-in's own decision (driver_manager.Watched: the code
    a pod's own watch calls), each wake set as the pod's watch would set it. ``by_name``: an object
    goes only to the stand-in of that name (its Node), and an opening hands each stand-in its own
    object alone, as a pod's watch by ``metadata.name`` lists it. Members join before the watch opens.

    Written against ``driver_manager.Watched``'s three methods (duck-typed: the class comes from
    the tree under test, imported at run time)."""

    def __init__(self, kind: str, by_name: bool = False) -> None:
        self.kind = kind
        self.handed = 0          # events handed to stand-ins (openings' items too); this watch's thread alone
        self.by_name = by_name
        self.members: List[Tuple[str, Any, threading.Event]] = []
        self.named: Dict[str, Tuple[Any, threading.Event]] = {}

    def join(self, name: str, watched: Any, wake: threading.Event) -> None:
        self.members.append((name, watched, wake))
        self.named[name] = (watched, wake)

    def _count(self, count: int) -> None:
        self.handed += count

    def opened(self, items: List[Any]) -> bool:
        by: Dict[Optional[str], Any] = {_name(item): item for item in items}
        for name, watched, wake in self.members:
            if watched.opened(([by[name]] if name in by else []) if self.by_name else items):
                wake.set()
        self._count(len(self.members) if self.by_name else len(self.members) * max(1, len(items)))
        return False         # every stand-in's own wake is set above; the loop's own is unused

    def changed(self, event: Dict[str, Any]) -> bool:
        if self.by_name:
            name = _name(event.get("object"))
            member = self.named.get(name) if isinstance(name, str) else None
            if member is not None and member[0].changed(event):
                member[1].set()
            self._count(1 if member is not None else 0)
            return False
        for _member, watched, wake in self.members:
            if watched.changed(event):
                wake.set()
        self._count(len(self.members))
        return False

    def broken(self) -> None:
        for _name, watched, _wake in self.members:
            watched.broken()


def main() -> int:
    args = parse()
    # the tree under test first: this checkout's scale_common is not imported here
    sys.path.insert(0, os.path.abspath(args.collections))
    # pylint: disable=import-outside-toplevel
    from ansible_collections.metax.gpu.plugins.module_utils.agents import driver_manager as dm
    from ansible_collections.metax.gpu.plugins.module_utils.agents.common import kube_api_client
    from ansible_collections.metax.gpu.plugins.module_utils.kube import client as kube_client
    from ansible_collections.metax.gpu.plugins.module_utils.kube import slots as kube_slots
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

        rounds_run = 0           # this stand-in's run_loop thread alone writes it

        def round(self) -> bool:
            try:
                return super().round()
            finally:
                self.rounds_run += 1

    def stand_in(manager: Any) -> None:
        """The driver part left out and each vfnum apply timed, on the procedure objects that run them
        (``manager.driver``, ``manager.vfnum``), or on the Manager itself in a tree from before the
        split of driver-manager along its procedures (a before/after run)."""
        driver = getattr(manager, "driver", manager)
        vfnum = getattr(manager, "vfnum", manager)
        apply = vfnum.apply_vfnum

        def timed_apply(wanted: int, plan: Any) -> str:
            started = time.monotonic()
            try:
                return apply(wanted, plan)
            finally:
                stats.applies.append(time.monotonic() - started)
        driver.reconcile_driver = lambda params: {}
        vfnum.apply_vfnum = timed_apply

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
        # a stand-in has no kubelet: no pod holds its simulated GPUs
        kube = dm.Kube(kube_api_client(args.kubeconfig), name, args.namespace, "driver-config", holders=list)
        manager = StandIn(host, kube, "Never", os.path.join(args.roots, "payload"), None,
                          os.path.join(args.roots, name, "ready"),
                          vfnum_policy=dm.VfnumPolicy(False, args.max_parallel))
        manager.driver_verified = True      # the vfnum entry goes first, as on a node whose driver is up
        stand_in(manager)
        counted(manager.slots)
        managers.append(manager)

    shared = not args.own_watches and hasattr(dm, "watch_objects")
    watches: Dict[str, Any] = {}
    config, nodes, leases = Shared("configmaps"), Shared("nodes", by_name=True), Shared("leases")
    if shared:
        joined: List[str] = []
        joined_lock = threading.Lock()

        def join(manager: Any, wake: threading.Event, _stop: threading.Event) -> None:
            """run_loop's ``watches``: this stand-in's own decisions joined to the shared watches."""
            name = manager.kube.node
            config.join(name, dm.ConfigWatched(manager.kube), wake)
            nodes.join(name, dm.NodeWatched(), wake)
            leases.join(name, dm.SlotsWatched(manager.slots), wake)
            with joined_lock:
                joined.append(name)
        watches["watches"] = join
    for manager in managers:       # every root made first: the first rounds do not compete with that
        threading.Thread(target=dm.run_loop, args=(manager, args.interval, stop), kwargs=watches,
                         daemon=True).start()
    if shared:
        while len(joined) < len(names):
            time.sleep(0.05)
        # the pod's own watch loop, one per kind, over a client of its own (not a stand-in's)
        api = kube_api_client(args.kubeconfig)
        core, coord = kube_client.core_v1(api), kube_client.coordination_v1(api)
        opened: List[Tuple[Callable[..., Any], Tuple[Any, ...], Dict[str, str], Shared]] = [
            (core.list_namespaced_config_map, (args.namespace,), {"field_selector": "metadata.name=driver-config"},
             config),
            (core.list_node, (), {"label_selector": args.node_selector} if args.node_selector else {}, nodes),
            (coord.list_namespaced_lease, (args.namespace,),
             {"label_selector": "%s=%s" % (kube_slots.POOL_LABEL, dm.VFNUM_SLOT_PREFIX)}, leases)]
        for lister, largs, selector, fan in opened:
            threading.Thread(target=dm.watch_objects, args=(threading.Event(), stop, lister, largs, selector, fan),
                             daemon=True).start()
    while sum(1 for manager in managers if manager.rounds_run) < len(names):
        time.sleep(0.2)
    print("ready %d" % len(names), flush=True)
    for line in sys.stdin:
        if line.strip() == "stop":
            break
    stop.set()
    print(json.dumps(stats.as_dict(sum(manager.rounds_run for manager in managers),
                                   {fan.kind: fan.handed for fan in (config, nodes, leases)} if shared else {})),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
