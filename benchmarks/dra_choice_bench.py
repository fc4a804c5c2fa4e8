# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""DRA: the default kube-scheduler's choice against the allocator's optimum, on the allocator benchmark's 69 requests.

    make -C benchmarks dra-choice        # or:
    flock /tmp/metax-heavy.lock env PYTHONPATH=.build/collections .venv/bin/python benchmarks/dra_choice_bench.py

A private control plane (dra_common: etcd, kube-apiserver, our kube-scheduler;
never the shared cluster; ~1 min). The requests are compare_go.py's
(``build_cases``: the same nodes, free GPUs, sizes and sequences). For each
request a Node object of its own carries the ResourceSlice gpu-dra publishes
for the simulated node (discovery over a simulator host root, then
``dra/slices.py``); the GPUs the request finds taken are held by a claim
already allocated them. Each step of the request is one ResourceClaim and one
pod pinned to the node: the scheduler allocates the claim and binds the pod,
and its devices are compared with ``allocator.allocate`` on the same free
GPUs (the free set the scheduler saw: earlier steps keep what the scheduler
gave them).

The claim is what a user can write without our extender: ``matchAttribute``
on the tightest attribute first, looser ones only where that cannot be
satisfied (for whole GPUs: the MetaXLink group, then the PCIe root, then the
NUMA node, then no constraint; for VFs the physical function first). By
default that is one claim per step, its request listing the constraints as
prioritized subrequests (``firstAvailable``, DRAPrioritizedList, on in
1.36); ``--claims ladder`` writes one claim per constraint instead, the next
only when the scheduler finds the last unschedulable (the same sets, more
round trips). A request of size 1 has no constraint. A request that must
include a device (the device plugin's mustInclude) is a request for that
device by a CEL selector plus one for the rest, under the same constraint.

Verdicts: ``same`` set; ``equivalent`` (another set, equal on the
allocator's objective: worst link, pair weights, damage to the free GPUs);
``worse`` with the term that differs. The ``first fit`` column says whether
the scheduler's set is the first fitting one in the slice's device order
(PCI order) under the constraint it was given -- the reason where it is not
the optimum: DRA's allocator takes devices in order, it does not score them.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import dra_common as D
from compare_go import Node, Request, build_cases, fmt_set

from ansible_collections.metax.gpu.plugins.module_utils.gpu import allocator  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.gpu.model import Inventory  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.gpu.scoring import evaluate  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.sim.layout import canonical_gpus  # noqa: E402

GPU_LADDER = (D.ATTR_GROUP, D.ATTR_ROOT, D.ATTR_NUMA, None)
VF_LADDER = (D.ATTR_PF, D.ATTR_GROUP, D.ATTR_ROOT, D.ATTR_NUMA, None)
# --switch-attribute (a what-if, not published by gpu-dra): the PCIe switch above each GPU
ATTR_SWITCH = D.DRA_DRIVER + "/pcieSwitch"
SHORT = {D.ATTR_GROUP: "metaxLinkGroup", D.ATTR_ROOT: "pcieRoot", D.ATTR_NUMA: "numaNode",
         D.ATTR_PF: "physicalFunction", ATTR_SWITCH: "pcieSwitch", None: "none"}


@dataclass
class SimNode:
    """A request's node as gpu-dra sees it: its devices in slice order, with compare_go's indices."""

    node: Node
    inventory: Inventory
    names: Dict[int, str] = field(default_factory=dict)        # compare_go device index -> device name
    index_of: Dict[str, int] = field(default_factory=dict)      # device name -> compare_go index
    attrs: Dict[str, Dict[str, object]] = field(default_factory=dict)
    order: List[str] = field(default_factory=list)              # device names in slice order
    extra: Dict[str, Dict[str, object]] = field(default_factory=dict)   # device name -> what-if attributes

    def slices(self, node_name: str) -> List[Dict[str, object]]:
        """The ResourceSlices gpu-dra publishes for this node under ``node_name`` (plus the what-ifs)."""
        pool = D.node_slices(node_name, self.inventory)
        for item in pool:
            for entry in item["spec"].get("devices") or []:
                entry["attributes"].update(self.extra.get(entry["name"], {}))
        return pool

    @property
    def device_class(self) -> str:
        return D.VF_CLASS if self.node.vfs else D.GPU_CLASS


def simulate(node: Node, root: str, switch_attribute: bool = False) -> SimNode:
    """The simulated node behind compare_go's synthetic one, and the index mapping between them.

    The simulator numbers GPUs in PCI order (layout.canonical_gpus), compare_go in spec order and VFs
    ``gpu * vfs + vf``; the mapping is checked pair by pair against both topologies."""
    inv = D.simulated_inventory(root, node.spec, node.vfs)
    spec_order = canonical_gpus(node.spec)
    remaining = list(range(len(node.spec.gpus)))
    spec_of_pos = []
    for placed in spec_order:       # canonical position -> spec index (identical GpuSpecs: first unused)
        idx = next(i for i in remaining if node.spec.gpus[i] == placed)
        remaining.remove(idx)
        spec_of_pos.append(idx)
    sim = SimNode(node, inv)
    devices = D.node_slices("x", inv)
    by_bdf = {dev.bdf: dev for dev in inv.devices}
    seen_vfs: Dict[int, int] = {}
    index_by_dev: Dict[int, int] = {}
    for item in devices:
        for entry in item["spec"].get("devices") or []:
            dev = by_bdf[entry["attributes"][D.S.ATTR_PCI_BUS_ID]["string"]]
            switch = next(g for g in inv.gpus if g.index == dev.gpu_index).switch
            if switch_attribute and switch:
                sim.extra[entry["name"]] = {ATTR_SWITCH.split("/", 1)[1]: {"string": switch}}
                entry["attributes"].update(sim.extra[entry["name"]])
            gpu = spec_of_pos[dev.gpu_index]
            if node.vfs:
                k = seen_vfs.get(gpu, 0)
                seen_vfs[gpu] = k + 1
                index = gpu * node.vfs + k
            else:
                index = gpu
            name = entry["name"]
            sim.names[index], sim.index_of[name] = name, index
            sim.attrs[name] = {k: list(v.values())[0] for k, v in entry["attributes"].items()}
            sim.order.append(name)
            index_by_dev[dev.index] = index
    topo = inv.topology
    for a in topo.device_indices:
        for b in topo.device_indices:
            if a < b and topo.link(a, b) != node.topology.link(index_by_dev[a], index_by_dev[b]):
                raise SystemExit("error: %s: the simulated node's link %d-%d (%s) is not compare_go's (%s)" % (
                    node.name, a, b, topo.link(a, b), node.topology.link(index_by_dev[a], index_by_dev[b])))
    return sim


def attr_value(sim: SimNode, name: str, attribute: Optional[str]) -> object:
    if attribute is None:
        return None
    short = attribute.split("/", 1)[1] if attribute.startswith(D.DRA_DRIVER + "/") else attribute
    return sim.attrs[name].get(short, KeyError)


def first_fit(sim: SimNode, free: Sequence[str], size: int, attribute: Optional[str],
              must: Optional[str]) -> Optional[List[str]]:
    """The set DRA's allocator would take if it walks the devices in slice order and keeps the first
    that fit the constraint (backtracking over the first device's value)."""
    order = [n for n in sim.order if n in set(free)]
    firsts = [must] if must else order
    for first in firsts:
        value = attr_value(sim, first, attribute)
        if value is KeyError:
            continue
        chosen = [first] + [n for n in order if n != first and attr_value(sim, n, attribute) == value][:size - 1]
        if len(chosen) == size:
            return sorted(chosen, key=sim.order.index)
    return None


@dataclass
class Step:
    node: str
    request: str
    size: int
    free: List[int]
    rung: str = ""
    tries: int = 0
    scheduler: List[int] = field(default_factory=list)
    optimum: List[int] = field(default_factory=list)
    method: str = ""            # the allocator's: tree and exhaustive are exact, search is not
    verdict: str = ""
    why: str = ""
    first_fit: bool = False
    seconds: float = 0.0
    message: str = ""


def verdict(node: Node, free: Sequence[int], ours: Sequence[int], theirs: Sequence[int]) -> Tuple[str, str]:
    """(verdict, the objective's term that differs) of the scheduler's set ``theirs`` against ``ours``."""
    if sorted(ours) == sorted(theirs):
        return "same", ""
    mine, sched = evaluate(node.topology, ours, free), evaluate(node.topology, theirs, free)
    k_mine, k_sched = mine.key(), sched.key()
    if k_mine == k_sched:
        return "equivalent", ""

    def legend(cls):
        return "-" if cls is None else cls.legend
    if k_mine[0] != k_sched[0]:
        why = "worst link %s, optimum %s" % (legend(sched.bottleneck), legend(mine.bottleneck))
    elif k_mine[1] != k_sched[1]:
        why = "pair weights %d, optimum %d" % (sched.pair_sum, mine.pair_sum)
    else:
        why = "damage to the free GPUs %d, optimum %d" % (sched.loss, mine.loss)
    return ("worse" if k_mine > k_sched else "better"), why


def ladder_of(sim: SimNode, size: int) -> Sequence[Optional[str]]:
    if size <= 1:
        return (None,)
    ladder: Tuple[Optional[str], ...] = VF_LADDER if sim.node.vfs else GPU_LADDER
    if sim.extra:       # the switch between the MetaXLink group and the root complex
        at = ladder.index(D.ATTR_ROOT)
        ladder = ladder[:at] + (ATTR_SWITCH,) + ladder[at:]
    return ladder


def must_request(sim: SimNode, must: str) -> Dict[str, object]:
    return D.device_request("must", 1, sim.device_class, 'device.attributes["%s"].index == %d' % (
        D.DRA_DRIVER, int(sim.attrs[must]["index"])))  # type: ignore[call-overload]


def schedule_claim(api: D.TokenClient, watch: D.PodWatch, node_name: str, name: str,
                   claim: Dict[str, object], settle: float = 0.0) -> Tuple[str, object, float]:
    """Create ``claim`` and a pod using it, pinned to the node: ("bound", the claim, seconds) or
    ("unschedulable", the scheduler's message, seconds)."""
    api.create(D.claims_path(), claim)
    start = time.monotonic()
    api.create(D.pods_path(), D.pod_manifest(name, node_name, name))
    state, detail = watch.wait(name, settle=settle)
    if state == "bound":
        return state, api.request("GET", "%s/%s" % (D.claims_path(), name)), detail[0] - start
    return state, detail, time.monotonic() - start


def run_step(api: D.TokenClient, watch: D.PodWatch, sim: SimNode, node_name: str, tag: str, size: int,
             must: Optional[str], style: str) -> Tuple[str, int, List[str], float, str]:
    """(constraint used, claims written, devices, seconds to bind, last refusal) of one step.

    ``first-available``: one claim whose request lists the ladder as prioritized subrequests;
    ``ladder``: one claim per rung, the next written when the scheduler finds the last unschedulable."""
    ladder = ladder_of(sim, size)
    rest = size - (1 if must else 0)
    if style == "first-available":
        requests: List[Dict[str, object]] = []
        constraints: List[Dict[str, object]] = []
        if must:
            requests.append(must_request(sim, must))
        if rest:
            request, constraints = D.prioritized_request("gpus", rest, ladder, sim.device_class,
                                                         ["must"] if must else [])
            requests.append(request)
        name = "%s-1" % tag
        # always satisfiable (the last subrequest has no constraint): a refusal is the scheduler
        # not having seen the whole pool yet
        state, detail, seconds = schedule_claim(api, watch, node_name, name,
                                                D.claim_manifest(name, requests, constraints=constraints), 10.0)
        if state != "bound":
            raise RuntimeError("%s: unschedulable: %s" % (tag, detail))
        results = D.allocation_results(detail)  # type: ignore[arg-type]
        chosen = [r["request"].split("/", 1)[1] for r in results if "/" in str(r.get("request"))]
        attribute = ladder[int(chosen[0][1:])] if chosen else None
        devices = [str(r["device"]) for r in results if r.get("pool") == node_name]
        return SHORT[attribute], 1, devices, seconds, ""
    last = ""
    for tries, attribute in enumerate(ladder, 1):
        name = "%s-%d" % (tag, tries)
        requests = [must_request(sim, must)] if must else []
        if rest:
            requests.append(D.device_request("gpus", rest, sim.device_class))
        state, detail, seconds = schedule_claim(api, watch, node_name, name, D.claim_manifest(
            name, requests, attribute if size > 1 else None))
        if state == "bound":
            devices = [dev for pool, dev in D.allocated_devices(detail) if pool == node_name]  # type: ignore[arg-type]
            return SHORT[attribute], tries, devices, seconds, last
        last = str(detail)
        D.delete_now(api, "%s/%s" % (D.pods_path(), name))
        D.delete_now(api, "%s/%s" % (D.claims_path(), name))
    raise RuntimeError("%s: no rung of the ladder was schedulable: %s" % (tag, last))


def run(requests: Sequence[Request], style: str, switch_attribute: bool = False, quiet: bool = False) -> Tuple[List[Step], str]:
    steps: List[Step] = []
    with D.Cluster() as cluster:
        api = cluster.api
        version = cluster.version()
        sims: Dict[int, SimNode] = {}
        watch = D.PodWatch(api)
        try:
            for i, req in enumerate(requests):
                sim = sims.get(id(req.node))
                if sim is None:
                    sim = sims[id(req.node)] = simulate(req.node, os.path.join(cluster.plane.dir, "sim%d" % len(sims)),
                                                        switch_attribute)
                node_name = "req-%02d" % i
                D.create_node(api, D.node_manifest(node_name))
                pool = sim.slices(node_name)
                for item in pool:
                    api.create("/apis/resource.k8s.io/v1/resourceslices", item)
                if len(pool) > 1:
                    # the scheduler allocates from a pool only once it has all its slices: a refusal
                    # before would be read as the constraint's in ladder mode
                    time.sleep(1.0)
                taken = [sim.names[d] for d in sorted(sim.names) if d not in set(req.available)]
                if taken:
                    D.hold_devices(api, "held-%02d" % i, node_name, taken, sim.device_class)
                free = list(req.available)
                must = [sim.names[d] for d in req.required]
                for s, size in enumerate(req.sizes):
                    step = Step(req.node.name, req.id, size, sorted(free))
                    rung, tries, devices, seconds, message = run_step(
                        api, watch, sim, node_name, "r%02d-%d" % (i, s), size, must[0] if must else None, style)
                    step.rung, step.tries, step.seconds, step.message = rung, tries, seconds, message
                    step.scheduler = sorted(sim.index_of[d] for d in devices)
                    opt = allocator.allocate(req.node.topology, free, size, [sim.index_of[m] for m in must])
                    step.optimum, step.method = list(opt.devices), opt.method
                    step.verdict, step.why = verdict(req.node, free, step.optimum, step.scheduler)
                    attribute = next(a for a, short in SHORT.items() if short == rung)
                    predicted = first_fit(sim, [sim.names[d] for d in free], size, attribute,
                                          must[0] if must else None)
                    step.first_fit = predicted is not None and sorted(devices) == sorted(predicted)
                    steps.append(step)
                    if not quiet:
                        print(row(step), flush=True)
                    free = [d for d in free if d not in step.scheduler]
                    must = []
        finally:
            watch.stop()
    return steps, version


HEADER = "%-16s %-28s %4s | %-18s %-16s %-16s | %-10s %-38s %5s %7s" % (
    "node", "request", "size", "constraint (claims)", "scheduler", "allocator", "verdict", "why", "first", "bind ms")


def row(step: Step) -> str:
    return "%-16s %-28s %4d | %-18s %-16s %-16s | %-10s %-38s %5s %7.1f" % (
        step.node[:16], step.request[:28], step.size, "%s (%d)" % (step.rung, step.tries), fmt_set(step.scheduler),
        fmt_set(step.optimum), step.verdict, step.why, "yes" if step.first_fit else "no", step.seconds * 1000)


def summary(steps: Sequence[Step]) -> List[str]:
    total = len(steps)
    count = {v: sum(1 for s in steps if s.verdict == v) for v in ("same", "equivalent", "worse", "better")}
    lines = ["requests (steps): %d; scheduler's set = allocator's: %d (%.0f %%); equivalent on the allocator's "
             "objective: %d; worse: %d; better: %d" % (total, count["same"], 100.0 * count["same"] / total,
                                                       count["equivalent"], count["worse"], count["better"]),
             "as good as the optimum (same or equivalent): %d of %d (%.0f %%)" % (
                 count["same"] + count["equivalent"], total, 100.0 * (count["same"] + count["equivalent"]) / total),
             "the scheduler's set is the first fit in slice (PCI) order under its constraint: %d of %d" % (
                 sum(1 for s in steps if s.first_fit), total)]
    rungs: Dict[str, int] = {}
    for s in steps:
        rungs[s.rung] = rungs.get(s.rung, 0) + 1
    lines.append("constraint that was schedulable: " + ", ".join("%s %d" % kv for kv in sorted(rungs.items())))
    for s in steps:
        if s.verdict == "better":
            lines.append("better than the allocator (its method there: %s%s): %s %s, %s" % (
                s.method, "" if s.method != "search" else ", the bounded local search of a non-hierarchical topology",
                s.node, s.request, s.why))
    reasons: Dict[str, int] = {}
    for s in steps:
        if s.verdict == "worse":
            key = s.why.split(" ")[0] + " " + s.why.split(" ")[1]
            reasons[key] = reasons.get(key, 0) + 1
    if reasons:
        lines.append("worse by: " + ", ".join("%s %d" % kv for kv in sorted(reasons.items())))
    binds = [s.seconds * 1000 for s in steps]
    lines.append("pod creation -> bound (the schedulable try): p50 %.1f ms, p99 %.1f ms" % (
        D.percentile(binds, 50), D.percentile(binds, 99)))
    return lines


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--seed", type=int, default=7, help="compare_go's seed (default %(default)s: its 69 requests)")
    parser.add_argument("--random-nodes", type=int, default=12, help="compare_go's random nodes (default %(default)s)")
    parser.add_argument("--claims", choices=("first-available", "ladder"), default="first-available",
                        help="first-available (default): one claim per step, its request listing the constraints "
                             "from tightest to none as prioritized subrequests; ladder: one claim per constraint, "
                             "the next written when the scheduler finds the last unschedulable")
    parser.add_argument("--switch-attribute", action="store_true",
                        help="what-if: give every device a pcieSwitch attribute (the PCIe switch above its GPU; "
                             "gpu-dra does not publish it) and try it between the MetaXLink group and the PCIe root")
    parser.add_argument("--json", help="also write the steps to this file")
    args = parser.parse_args(argv)
    requests = build_cases(random.Random(args.seed), args.random_nodes)
    started = time.monotonic()
    print("machine: " + D.machine())
    print(HEADER)
    print("-" * len(HEADER))
    steps, version = run(requests, args.claims, args.switch_attribute)
    lines = ["", "kube-scheduler %s (default profile, no extender); claims: %s%s; allocator: "
             "plugins/module_utils/gpu/allocator.py" % (
                 version, args.claims, ", what-if pcieSwitch attribute" if args.switch_attribute else "")]
    lines += summary(steps) + [D.closing_line(started)]
    print("\n".join(lines))
    suffix = ("" if args.claims == "first-available" else "_" + args.claims) + (
        "_switch" if args.switch_attribute else "")
    D.write_results("dra_choice%s.txt" % suffix,
                    ["machine: " + D.machine(), HEADER, "-" * len(HEADER)] + [row(s) for s in steps] + lines,
                    [asdict(s) for s in steps], args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
