# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Side-by-side comparison with NVIDIA's go-gpuallocator best-effort policy.

    make -C benchmarks compare          # or:
    PYTHONPATH=.build/collections .venv/bin/python benchmarks/compare_go.py

Builds the Go harness in ``benchmarks/go-gpuallocator`` once (cached in
``.build/bench/``), feeds both allocators the same synthetic topologies and
requests, and prints per request: the chosen sets, the pair-score sum of each
set on NVIDIA's scale, the best set of the same size left for the next
request (by our allocator, for both, so the yardstick is the same), and the
latency. Link classes map to go-gpuallocator's link types as:

    MX -> one NVLink (plus the pair's PCIe type)   PIX -> single switch
    PXB -> multiple switches   PHB -> host bridge   NODE -> same CPU
    SYS -> cross CPU           SAME_GPU (VFs of one GPU) -> same board + two NVLinks

Requests that NVIDIA's policy would need too long for (it enumerates every
partition of the available GPUs into sets of the requested size) are not
sent; the table shows the partition count instead.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, ".build", "collections"))
sys.path.insert(0, HERE)

from ansible_collections.metax.gpu.plugins.module_utils.gpu import allocator  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.sim.alloc_synth import (  # noqa: E402
    pcie_links, random_spec, topology_from_spec)
from ansible_collections.metax.gpu.plugins.module_utils.gpu.alloc_tree import hierarchy  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.gpu.model import LinkClass, Topology  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.gpu.scoring import evaluate  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.sim.spec import GpuSpec, NodeSpec, preset  # noqa: E402
from allocator_bench import spec_32  # noqa: E402

GO_DIR = os.path.join(HERE, "go-gpuallocator")
GO_BIN = os.path.join(ROOT, ".build", "bench", "go-gpuallocator")
RESULTS = os.path.join(HERE, "results")

# go-gpuallocator's P2PLinkType values and its pair scores (besteffort_policy.go)
PCIE_TYPE = {LinkClass.SYS: 1, LinkClass.NODE: 2, LinkClass.PHB: 3, LinkClass.PXB: 4, LinkClass.PIX: 5}
SAME_BOARD, ONE_NVLINK, TWO_NVLINKS = 6, 7, 8
NV_SCORE = {1: 10, 2: 20, 3: 30, 4: 40, 5: 50, 6: 60}
# Partitions its best-effort policy may enumerate before we call it too slow
# to wait for here (16 GPUs, size 4 is 2.6 million: about 4 s).
MAX_PARTITIONS = 3_000_000


def nv_score(link_type: int) -> int:
    return NV_SCORE.get(link_type, 100 * (link_type - 6))


class Node:
    """A synthetic node: our topology plus the per-pair link types for Go."""

    def __init__(self, name: str, spec: NodeSpec, vfs: int = 0) -> None:
        self.name = name
        self.spec, self.vfs = spec, vfs     # the simulated node behind it (dra_scheduler_bench builds it)
        self.topology: Topology = topology_from_spec(spec, vfs)
        pcie = pcie_links(spec)
        self.types: Dict[Tuple[int, int], List[int]] = {}
        devices = self.topology.device_indices
        for i, a in enumerate(devices):
            for b in devices[i + 1:]:
                cls = self.topology.link(a, b)
                ga, gb = (a // vfs, b // vfs) if vfs else (a, b)
                if cls == LinkClass.SAME_GPU:
                    self.types[(a, b)] = [SAME_BOARD, TWO_NVLINKS]
                elif cls == LinkClass.MX:
                    self.types[(a, b)] = [PCIE_TYPE[pcie[(ga, gb)]], ONE_NVLINK]
                else:
                    self.types[(a, b)] = [PCIE_TYPE[cls]]
        hierarchy(self.topology)

    def nv_sum(self, devices: Sequence[int]) -> int:
        members = sorted(devices)
        return sum(nv_score(t) for i, a in enumerate(members) for b in members[i + 1:]
                   for t in self.types[(a, b)])


def partitions(available: int, size: int) -> int:
    """Upper bound of the partitions NVIDIA's best-effort policy enumerates."""
    if size <= 1:
        return available
    padded = -(-available // size) * size
    groups = padded // size
    count = 1
    remaining = padded
    for _group in range(groups):
        # choose the rest of the group that holds the first remaining GPU
        count *= _comb(remaining - 1, size - 1)
        remaining -= size
    return count


def _comb(n: int, k: int) -> int:
    if k < 0 or k > n:
        return 0
    out = 1
    for i in range(min(k, n - k)):
        out = out * (n - i) // (i + 1)
    return out


class Request:
    def __init__(self, node: Node, rid: str, available: Sequence[int], sizes: Sequence[int],
                 required: Sequence[int] = ()) -> None:
        self.node = node
        self.id = rid
        self.available = sorted(available)
        self.sizes = list(sizes)
        self.required = list(required)

    @property
    def go_work(self) -> int:
        """Partitions of the largest step (the first step has the most GPUs available)."""
        worst = 0
        left = len(self.available)
        for size in self.sizes:
            worst = max(worst, partitions(left, size))
            left -= size
        return worst


def build_cases(rng: random.Random, random_nodes: int) -> List[Request]:
    c8 = Node("8xC500", preset("8xC500"))
    n4 = Node("4xN100", preset("4xN100"))
    vf8 = Node("2xC550 x4 VFs", preset("2xC550-sriov"), 4)
    c16 = Node("16xC500", preset("16xC500"))
    c32 = Node("32xC500", spec_32())
    vf128 = Node("16xC500 x8 VFs", preset("16xC500"), 8)
    boards = Node("dual-board 16", NodeSpec("dual-board", tuple(
        GpuSpec("C500", numa_node=socket, root_complex=2 * socket + board, root_port=0, switch_path=(2 * socket + board,),
                metaxlink_group=board)
        for board in (0, 1) for socket in (0, 1) for _gpu in range(4))))
    reqs = [
        Request(c8, "manual example 1 (0,1 taken)", range(2, 8), [4]),
        Request(c8, "manual example 2 (0,1 taken)", range(2, 8), [2]),
    ]
    reqs += [Request(c8, "all free", range(8), [n]) for n in range(1, 9)]
    reqs += [Request(c8, "sequence", range(8), [1, 2, 1, 4]),
             Request(c8, "sequence", range(8), [2, 1, 2, 2]),
             Request(c8, "sequence", range(8), [3, 1, 4]),
             Request(c8, "0,5 taken", [1, 2, 3, 4, 6, 7], [2]),
             Request(c8, "0,5 taken", [1, 2, 3, 4, 6, 7], [3]),
             Request(c8, "must include 4", range(8), [2], [4])]
    reqs += [Request(n4, "all free", range(4), [n]) for n in range(1, 5)]
    reqs += [Request(n4, "0 taken", [1, 2, 3], [n]) for n in (1, 2)]
    reqs += [Request(vf8, "all free", range(8), [n]) for n in (1, 2, 4)]
    reqs += [Request(vf8, "sequence", range(8), [1, 2, 1, 4]),
             Request(vf8, "VF 0 taken", range(1, 8), [2])]
    reqs += [Request(c16, "all free", range(16), [n]) for n in (1, 2, 3, 4, 8, 16)]
    reqs += [Request(c16, "0,1 taken", range(2, 16), [n]) for n in (2, 4, 8)]
    reqs += [Request(c16, "0,1,4,8,9,12 taken", [2, 3, 5, 6, 7, 10, 11, 13, 14, 15], [n]) for n in (2, 3, 4)]
    reqs += [Request(boards, "0,1,8 taken", [d for d in range(16) if d not in (0, 1, 8)], [n]) for n in (2, 4, 8)]
    reqs += [Request(c32, "all free", range(32), [n]) for n in (2, 8)]
    reqs += [Request(vf128, "all free", range(128), [n]) for n in (1, 8)]
    for k in range(random_nodes):
        spec = random_spec(rng, rng.randint(6, 12))
        node = Node("random %d GPUs #%d" % (len(spec.gpus), k), spec)
        devices = list(node.topology.device_indices)
        free = [d for d in devices if rng.random() > 0.3] or devices
        reqs.append(Request(node, "random taken", free, [rng.randint(1, len(free))]))
    return reqs


def ensure_go_binary() -> str:
    sources = [os.path.join(GO_DIR, f) for f in ("main.go", "go.mod", "go.sum")]
    if os.path.exists(GO_BIN) and os.path.getmtime(GO_BIN) >= max(os.path.getmtime(s) for s in sources):
        return GO_BIN
    go = shutil.which("go") or "/usr/local/go/bin/go"
    if not os.path.exists(go):
        raise SystemExit("error: the Go toolchain is needed to build %s" % GO_DIR)
    # share the machine politely: do not start while another Go build runs
    waited = 0
    while subprocess.run(["pgrep", "-f", "go build"], stdout=subprocess.DEVNULL, check=False).returncode == 0:
        if waited == 0:
            sys.stderr.write("waiting for a running 'go build' to finish before building the harness...\n")
        time.sleep(10)
        waited += 10
        if waited > 3600:
            break
    os.makedirs(os.path.dirname(GO_BIN), exist_ok=True)
    env = dict(os.environ, GOFLAGS="-mod=mod")
    sys.stderr.write("building %s (once)...\n" % GO_BIN)
    subprocess.run(["nice", "-n", "10", go, "build", "-p", "1", "-o", GO_BIN, "."], cwd=GO_DIR, env=env, check=True)
    return GO_BIN


def run_go(requests: List[Request]) -> Dict[Tuple[str, int], List[dict]]:
    cases: Dict[str, dict] = {}
    for i, req in enumerate(requests):
        if req.go_work > MAX_PARTITIONS:
            continue
        node = req.node
        case = cases.setdefault(node.name, {
            "name": node.name, "devices": len(node.topology.device_indices),
            "links": [[a, b, t] for (a, b), t in sorted(node.types.items())], "requests": []})
        case["requests"].append({"id": str(i), "available": req.available, "required": req.required,
                                 "sizes": req.sizes, "budget_ms": 100})
    binary = ensure_go_binary()
    proc = subprocess.run([binary], input=json.dumps({"cases": list(cases.values())}), stdout=subprocess.PIPE,
                          universal_newlines=True, check=True)
    out: Dict[Tuple[str, int], List[dict]] = {}
    for res in json.loads(proc.stdout)["results"] or []:
        out[(res["case"], int(res["id"]))] = res["steps"]
    return out


def run_ours(req: Request) -> List[dict]:
    steps = []
    available = list(req.available)
    required = list(req.required)
    for size in req.sizes:
        times = []
        spent = 0.0
        alloc = None
        while not times or (spent < 0.1 and len(times) < 1000):
            start = time.perf_counter()
            alloc = allocator.allocate(req.node.topology, available, size, required)
            took = time.perf_counter() - start
            spent += took
            times.append(took * 1000.0)
        assert alloc is not None
        steps.append({"size": size, "chosen": list(alloc.devices), "ms": statistics.median(times), "runs": len(times)})
        available = [d for d in available if d not in alloc.devices]
        required = []
    return steps


def fmt_set(devices: Sequence[int]) -> str:
    devices = sorted(devices)
    if len(devices) > 4 and devices == list(range(devices[0], devices[-1] + 1)):
        return "{%d-%d}" % (devices[0], devices[-1])
    return "{" + ",".join(str(d) for d in devices) + "}"


def next_best(node: Node, free: Sequence[int], size: int) -> str:
    """The best set of the same size in what is left, by our allocator (same yardstick for both)."""
    if len(free) < size:
        return "none"
    alloc = allocator.allocate(node.topology, free, size)
    level = "1 GPU" if alloc.bottleneck is None else alloc.bottleneck.legend
    return "%s %s" % (level, fmt_set(alloc.devices))


def _legend(cls: Optional[LinkClass]) -> str:
    return "-" if cls is None else cls.legend


def verdict(node: Node, free: Sequence[int], go: Sequence[int], ours: Sequence[int]) -> str:
    if sorted(go) == sorted(ours):
        return "same"
    mine = evaluate(node.topology, ours, free)
    theirs = evaluate(node.topology, go, free)
    k_mine, k_theirs = mine.key(), theirs.key()
    if k_mine > k_theirs:
        if k_mine[0] != k_theirs[0]:
            why = "tighter worst link (%s vs %s)" % (_legend(mine.bottleneck), _legend(theirs.bottleneck))
        elif k_mine[1] != k_theirs[1]:
            why = "closer pairs"
        else:
            why = "less damage to free GPUs"
        return "ours: " + why
    if k_mine == k_theirs:
        return "equivalent"
    return "go better by our objective"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="Compare with NVIDIA go-gpuallocator (best effort)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--random-nodes", type=int, default=12)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    requests = build_cases(rng, args.random_nodes)
    go_results = run_go(requests)

    rows = []
    summary = {"requests": 0, "same": 0, "equivalent": 0, "ours": 0, "go": 0, "skipped": 0,
               "nv_go_higher": 0}
    speed: Dict[str, Tuple[float, float]] = {}
    header = "%-18s %-28s %4s | %-16s %-16s | %6s %6s | %-16s %-16s | %10s %8s | %s" % (
        "node", "request", "size", "go set", "ours set", "go Σnv", "our Σnv", "go: next same size",
        "ours: next same size", "go ms", "ours ms", "verdict")
    for i, req in enumerate(requests):
        node = req.node
        ours = run_ours(req)
        go = go_results.get((node.name, i))
        free_go = list(req.available)
        free_ours = list(req.available)
        for s, step in enumerate(ours):
            size = step["size"]
            summary["requests"] += 1
            if go is None:
                summary["skipped"] += 1
                parts = partitions(len(free_ours), size)
                rows.append("%-18s %-28s %4d | %-16s %-16s | %6s %6d | %-16s %-16s | %10s %8.3f | %s" % (
                    node.name, req.id, size, "not run", fmt_set(step["chosen"]), "-", node.nv_sum(step["chosen"]),
                    "-", next_best(node, [d for d in free_ours if d not in step["chosen"]], size),
                    "~%.0e parts" % parts, step["ms"], "go would enumerate %.1e partitions" % parts))
                free_ours = [d for d in free_ours if d not in step["chosen"]]
                continue
            gstep = go[s]
            v = verdict(node, free_ours if free_ours == free_go else free_go, gstep["chosen"], step["chosen"]) \
                if free_ours == free_go else "different history"
            key = v.split(":")[0] if v.startswith("ours") else ("go" if v.startswith("go") else v)
            if key in summary:
                summary[key] += 1
            nv_go, nv_ours = node.nv_sum(gstep["chosen"]), node.nv_sum(step["chosen"])
            if nv_go > nv_ours:
                summary["nv_go_higher"] += 1
            rows.append("%-18s %-28s %4d | %-16s %-16s | %6d %6d | %-16s %-16s | %10.3f %8.3f | %s" % (
                node.name, req.id, size, fmt_set(gstep["chosen"]), fmt_set(step["chosen"]), nv_go, nv_ours,
                next_best(node, [d for d in free_go if d not in gstep["chosen"]], size),
                next_best(node, [d for d in free_ours if d not in step["chosen"]], size),
                gstep["ms"], step["ms"], v))
            group = "random 6-12 GPUs" if node.name.startswith("random") else node.name
            best = speed.get(group, (0.0, 0.0))
            speed[group] = (max(best[0], gstep["ms"]), max(best[1], step["ms"]))
            free_go = [d for d in free_go if d not in gstep["chosen"]]
            free_ours = [d for d in free_ours if d not in step["chosen"]]

    print("NVIDIA go-gpuallocator (best effort) vs metax.gpu allocator")
    print("Σnv: pair-score sum of the chosen set on go-gpuallocator's scale; next: best set of the same size")
    print("left afterwards (by our allocator for both); ms: median of repeated calls")
    print()
    print(header)
    print("-" * len(header))
    for row in rows:
        print(row)
    print()
    compared = summary["requests"] - summary["skipped"]
    print("requests: %d, compared with Go: %d; same set: %d; equivalent: %d; ours better by the manual's rules: %d; "
          "Go better: %d; Go set has a higher NVIDIA pair sum: %d; not run on Go: %d"
          % (summary["requests"], compared, summary["same"], summary["equivalent"], summary["ours"], summary["go"],
             summary["nv_go_higher"], summary["skipped"]))
    for name, (go_ms, our_ms) in speed.items():
        print("slowest call on %-18s go %10.3f ms   ours %7.3f ms   go/ours %.3g" % (
            name, go_ms, our_ms, go_ms / our_ms if our_ms else 0))
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "compare_go.txt"), "w") as handle:
        handle.write("\n".join([header] + rows) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
