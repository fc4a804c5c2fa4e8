# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The link hierarchy of a topology and the exact tree search over it.

Devices group hierarchically: VFs of one GPU, GPUs of one MetaXLink group or
PCIe switch, switches under one root port, host bridges of one NUMA node, the
node. When every pair's link class is the class of the smallest group holding
both (the matrix is *ultrametric*, which is what a PCIe tree with MetaXLink
groups aligned to it gives), the objective of :mod:`.scoring` decomposes over
that tree and a knapsack-style dynamic programme over it finds the exact
optimum in O(N^2) for N devices (O(N * size) for one request).

The hierarchy is single-linkage clustering of the link classes: a node of
class ``c`` is a maximal set of devices connected through pairs of class
``>= c``. For a non-ultrametric matrix the tree still exists but only bounds
the real classes from above; :attr:`Hierarchy.ultrametric` says which case
holds and the allocator falls back to a bounded search when it is false.

Decomposition (``u`` ranges over tree nodes, ``n_u`` = chosen devices under
``u``, ``F_u`` = free devices under ``u``, ``D_u`` = f(class u) - f(class of
u's parent), ``D_root`` = f(class root), for any per-class function ``f``):
the class of a pair is the class of its lowest common ancestor, and ``f``
telescopes along the path to the root, so the sum of ``f`` over the chosen
pairs and over the cut pairs (chosen, left free) are::

    sum_u D_u * C(n_u, 2)          sum_u D_u * n_u * (F_u - n_u)

With ``f`` = pair weight the first is P; with ``f(c) = base^c`` the second
encodes the per-class cut, closest class most significant. Both are sums of
per-node terms that depend on ``n_u`` only, which is what makes the tree
knapsack exact.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Dict, FrozenSet, List, Optional, Tuple, cast

from .model import LinkClass, Topology
from .scoring import WEIGHT_BY_CLASS, link_class

# A leaf's pseudo class: above every real link class, so a single device is
# the tightest possible "group" (only a request of one fits in it).
LEAF_CLASS = len(LinkClass)


@dataclass
class _Node:
    cls: int                        # link class of pairs split at this node; LEAF_CLASS for a device
    devices: Tuple[int, ...]        # sorted device indices below
    children: Tuple[int, ...]       # node ids, ordered by smallest device index
    parent: int                     # -1 for the root
    delta: int                      # weight(cls) - weight(parent cls); weight(cls) at the root


@dataclass
class Hierarchy:
    """The single-linkage tree of a topology (cache it: it depends on the topology only)."""

    nodes: List[_Node]
    root: int
    leaf_of: Dict[int, int]         # device index -> node id
    rank: Dict[int, int]            # device index -> position in sorted device order
    ultrametric: bool
    violations: Tuple[Tuple[int, int], ...]   # a few pairs that break ultrametricity (for messages)

    def ancestors(self, node: int) -> List[int]:
        out = []
        parent = self.nodes[node].parent
        while parent >= 0:
            out.append(parent)
            parent = self.nodes[parent].parent
        return out


_CACHE: "weakref.WeakKeyDictionary[Topology, Hierarchy]" = weakref.WeakKeyDictionary()


def hierarchy(topology: Topology) -> Hierarchy:
    """The hierarchy of ``topology``, built once per topology object."""
    try:
        return _CACHE[topology]
    except (KeyError, TypeError):
        pass
    built = build_hierarchy(topology)
    try:
        _CACHE[topology] = built
    except TypeError:
        pass   # not weak-referenceable: just do not cache
    return built


def build_hierarchy(topology: Topology) -> Hierarchy:
    devices = tuple(sorted(topology.device_indices))
    rank = {dev: i for i, dev in enumerate(devices)}
    nodes: List[_Node] = []
    leaf_of: Dict[int, int] = {}
    for dev in devices:
        leaf_of[dev] = len(nodes)
        nodes.append(_Node(LEAF_CLASS, (dev,), (), -1, 0))
    if not devices:
        return Hierarchy(nodes, -1, leaf_of, rank, True, ())

    # Kruskal from the closest class down: the components that merge while
    # adding the pairs of class c become one node of class c.
    by_class: List[List[Tuple[int, int]]] = [[] for _cls in range(LEAF_CLASS)]
    for i, a in enumerate(devices):
        for b in devices[i + 1:]:
            by_class[int(link_class(topology, a, b))].append((a, b))
    parent_uf = {dev: dev for dev in devices}

    def find(x: int) -> int:
        while parent_uf[x] != x:
            parent_uf[x] = parent_uf[parent_uf[x]]
            x = parent_uf[x]
        return x

    top_node = {dev: leaf_of[dev] for dev in devices}   # union-find root -> current tree node
    for cls in range(LEAF_CLASS - 1, -1, -1):
        merged: Dict[int, List[int]] = {}   # new uf root -> old tree nodes merged into it
        for a, b in by_class[cls]:
            ra, rb = find(a), find(b)
            if ra == rb:
                continue
            na = merged.pop(ra, None) or [top_node[ra]]
            nb = merged.pop(rb, None) or [top_node[rb]]
            parent_uf[rb] = ra
            merged[ra] = na + nb
        for uf_root, members in merged.items():
            members.sort(key=lambda nid: nodes[nid].devices[0])
            devs = tuple(sorted(d for nid in members for d in nodes[nid].devices))
            nid = len(nodes)
            nodes.append(_Node(cls, devs, tuple(members), -1, 0))
            for child in members:
                nodes[child].parent = nid
            top_node[uf_root] = nid
    roots = {find(dev) for dev in devices}
    if len(roots) != 1:   # cannot happen: every pair has a class, SYS joins all
        raise AssertionError("topology hierarchy is not connected")
    root = top_node[roots.pop()]
    for node in nodes:
        own = WEIGHT_BY_CLASS[node.cls] if node.cls < LEAF_CLASS else 0
        if node.parent >= 0 and node.cls < LEAF_CLASS:
            node.delta = own - WEIGHT_BY_CLASS[nodes[node.parent].cls]
        else:
            node.delta = own if node.cls < LEAF_CLASS else 0

    # Ultrametric iff every pair split at a node has exactly that node's class
    # (single linkage only guarantees ">=").
    violations: List[Tuple[int, int]] = []
    for node in nodes:
        if node.cls == LEAF_CLASS:
            continue
        for i, ca in enumerate(node.children):
            for cb in node.children[i + 1:]:
                for a in nodes[ca].devices:
                    for b in nodes[cb].devices:
                        if int(link_class(topology, a, b)) != node.cls and len(violations) < 8:
                            violations.append((min(a, b), max(a, b)))
    return Hierarchy(nodes, root, leaf_of, rank, not violations, tuple(violations))


class _Solver:
    """Tree knapsack over one free set, with values encoded in one integer.

    ``value = ALPHA * P - BETA * C + T`` where ``C = sum_c cut_c * base^c``
    is the per-class cut (every count is below ``base``, so comparing ``C``
    compares the cut closest class first) and ``T = sum 2^(N-1-rank(d))``
    over chosen devices: ``C < BIG`` and ``T < 2^N`` keep the terms apart, so
    maximising the integer maximises ``(P, -cut)`` lexicographically and then
    prefers the lexicographically smallest index tuple (the first differing
    index carries the largest power of two). The encoding is linear, so sums
    of per-node values compose exactly.
    """

    def __init__(self, tree: Hierarchy, free: FrozenSet[int], must: FrozenSet[int],
                 cap: int, tiebreak: bool = True) -> None:
        self.tree = tree
        self.cap = cap          # largest count worth solving for
        self.free = free
        self.must = must
        n_all = len(tree.rank)
        self.shift = n_all if tiebreak else 0
        max_free = len(free)
        # a per-class cut count is at most n * (F - n) <= F^2 / 4
        self.base = max_free * max_free // 4 + 1
        self.power = [self.base ** c for c in range(LEAF_CLASS)]
        self.big = self.base ** LEAF_CLASS
        self.alpha = self.big << self.shift
        self.beta = 1 << self.shift
        self.tiebreak = tiebreak
        nodes = tree.nodes
        self.cut_delta = [0] * len(nodes)
        for nid, node in enumerate(nodes):
            if node.cls < LEAF_CLASS:
                above = self.power[nodes[node.parent].cls] if node.parent >= 0 else 0
                self.cut_delta[nid] = self.power[node.cls] - above
        self.free_count = [0] * len(nodes)
        self.must_count = [0] * len(nodes)
        for dev in free:
            nid = tree.leaf_of[dev]
            while nid >= 0:
                self.free_count[nid] += 1
                if dev in must:
                    self.must_count[nid] += 1
                nid = nodes[nid].parent
        # per node: (lo, values, splits) where values[x - lo] is the best value
        # of choosing x devices below it; splits to rebuild the choice
        self.solved: Dict[int, Tuple[int, List[int], List[Tuple[int, int, List[int]]]]] = {}

    def leaf_weight(self, dev: int) -> int:
        if not self.tiebreak:
            return 0
        return 1 << (self.shift - 1 - self.tree.rank[dev])

    def own(self, nid: int, x: int) -> int:
        delta = self.tree.nodes[nid].delta
        if delta == 0:
            return 0
        return (self.alpha * delta * (x * (x - 1) // 2)
                - self.beta * self.cut_delta[nid] * x * (self.free_count[nid] - x))

    def ancestors_value(self, nid: int, x: int) -> int:
        total = 0
        for anc in self.tree.ancestors(nid):
            total += self.own(anc, x)
        return total

    def _leaf_order(self, nid: int) -> List[int]:
        """Free devices directly below an all-leaf node, required ones first."""
        devs = [d for d in self.tree.nodes[nid].devices if d in self.free]
        return [d for d in devs if d in self.must] + [d for d in devs if d not in self.must]

    def solve(self, nid: int) -> Tuple[int, List[int]]:
        """Best values for every feasible count below ``nid`` up to the cap."""
        cap = self.cap
        cached = self.solved.get(nid)
        if cached is not None:
            return cached[0], cached[1]
        node = self.tree.nodes[nid]
        lo = self.must_count[nid]
        hi = min(self.free_count[nid], cap)
        if node.cls == LEAF_CLASS:
            values = [0, self.leaf_weight(node.devices[0])][lo:hi + 1]
            self.solved[nid] = (lo, values, [])
            return lo, values
        splits: List[Tuple[int, int, List[int]]] = []
        if all(self.tree.nodes[c].cls == LEAF_CLASS for c in node.children):
            # every count is a prefix of the leaf order: required, then lowest index
            order = self._leaf_order(nid)
            values = []
            acc = 0
            for x in range(hi + 1):
                if x > 0:
                    acc += self.leaf_weight(order[x - 1])
                if x >= lo:
                    values.append(acc)
        else:
            acc_lo, sums = 0, [0]
            for child in node.children:
                if self.free_count[child] == 0:
                    continue
                c_lo, c_vals = self.solve(child)
                new_lo = acc_lo + c_lo
                new_hi = min(acc_lo + len(sums) - 1 + c_lo + len(c_vals) - 1, cap)
                best: List[Optional[int]] = [None] * (new_hi - new_lo + 1)
                arg = [0] * (new_hi - new_lo + 1)
                for i, a_val in enumerate(sums):
                    base = acc_lo + i + c_lo - new_lo
                    for j, c_val in enumerate(c_vals):
                        k = base + j
                        if k >= len(best):
                            break
                        val = a_val + c_val
                        cur = best[k]
                        if cur is None or val > cur:
                            best[k] = val
                            arg[k] = c_lo + j
                splits.append((child, new_lo, arg))
                # i + j covers every k in 0..new_hi - new_lo, so no entry is left None
                acc_lo, sums = new_lo, cast(List[int], best)
            values = sums[lo - acc_lo:hi - acc_lo + 1]
        values = [v + self.own(nid, lo + i) for i, v in enumerate(values)]
        self.solved[nid] = (lo, values, splits)
        return lo, values

    def value(self, nid: int, x: int) -> Optional[int]:
        """Full objective value of the best x-set below ``nid`` (ancestors included)."""
        lo, values = self.solve(nid)
        if not lo <= x < lo + len(values):
            return None
        return values[x - lo] + self.ancestors_value(nid, x)

    def choose(self, nid: int, x: int) -> List[int]:
        """Rebuild the devices behind ``solve(nid)[x]``."""
        node = self.tree.nodes[nid]
        if x == 0:
            return []
        if node.cls == LEAF_CLASS:
            return [node.devices[0]]
        splits = self.solved[nid][2]
        if not splits:
            return sorted(self._leaf_order(nid)[:x])
        out: List[int] = []
        remaining = x
        for child, new_lo, arg in reversed(splits):
            take = arg[remaining - new_lo]
            out.extend(self.choose(child, take))
            remaining -= take
        return sorted(out)

    def decode(self, value: int) -> Tuple[int, Tuple[int, ...]]:
        """(pair sum, cut pairs per class) from a full objective value."""
        q = value >> self.shift
        pair_sum = -(-q // self.big)
        code = pair_sum * self.big - q
        return pair_sum, tuple((code // p) % self.base for p in self.power)


@dataclass(frozen=True)
class TreeResult:
    devices: Tuple[int, ...]
    level: int          # int(LinkClass) of the bottleneck, LEAF_CLASS for one device
    pair_sum: int
    cut: Tuple[int, ...]


def _candidates(tree: Hierarchy, solver: _Solver, size: int, need_must: int) -> Tuple[int, List[int]]:
    """Nodes of the tightest class that can hold the request (rules 1 and 2)."""
    best_cls = -1
    found: List[int] = []
    for nid, node in enumerate(tree.nodes):
        if solver.free_count[nid] < size or solver.must_count[nid] < need_must:
            continue
        if node.cls > best_cls:
            best_cls, found = node.cls, [nid]
        elif node.cls == best_cls:
            found.append(nid)
    return best_cls, found


def tree_allocate(tree: Hierarchy, free: FrozenSet[int], must: FrozenSet[int], size: int) -> TreeResult:
    """Exact optimum of the objective when ``tree.ultrametric`` (caller validates input)."""
    solver = _Solver(tree, free, must, size)
    level, cands = _candidates(tree, solver, size, len(must))
    best_val: Optional[int] = None
    best_node = -1
    for nid in cands:
        val = solver.value(nid, size)
        if val is not None and (best_val is None or val > best_val):
            best_val, best_node = val, nid
    if best_val is None:
        raise AssertionError("no candidate group for %d devices" % size)
    pair_sum, cut = solver.decode(best_val)
    return TreeResult(tuple(solver.choose(best_node, size)), level, pair_sum, cut)


def tree_candidates(tree: Hierarchy, free: FrozenSet[int], must: FrozenSet[int], size: int,
                    limit: int = 64) -> List[Tuple[int, ...]]:
    """Best set (under the tree's classes) of every group that can hold the request.

    Seeds for the bounded search on a non-ultrametric topology, tightest
    groups first.
    """
    solver = _Solver(tree, free, must, size)
    nids = [nid for nid in range(len(tree.nodes))
            if solver.free_count[nid] >= size and solver.must_count[nid] == len(must)]
    nids.sort(key=lambda nid: (-tree.nodes[nid].cls, solver.free_count[nid], nid))
    out: List[Tuple[int, ...]] = []
    for nid in nids[:limit]:
        if solver.value(nid, size) is not None:
            out.append(tuple(solver.choose(nid, size)))
    return out


def tree_tables(tree: Hierarchy, free: FrozenSet[int]) -> Dict[int, Tuple[int, int, Tuple[int, ...]]]:
    """For every count n: (bottleneck level, pair sum, cut per class) of the optimum, one DP pass."""
    if not free:
        return {}
    total = len(free)
    solver = _Solver(tree, free, frozenset(), total, tiebreak=False)
    solver.solve(tree.root)
    # the tightest class able to hold n only falls as n grows: sweep nodes by class
    by_level: Dict[int, List[int]] = {}
    for nid, node in enumerate(tree.nodes):
        if solver.free_count[nid] > 0:
            by_level.setdefault(node.cls, []).append(nid)
    levels = sorted(by_level, reverse=True)
    out: Dict[int, Tuple[int, int, Tuple[int, ...]]] = {}
    first = 0
    for n in range(1, total + 1):
        for pos in range(first, len(levels)):
            level = levels[pos]
            best: Optional[int] = None
            for nid in by_level[level]:
                if solver.free_count[nid] < n:
                    continue
                val = solver.value(nid, n)
                if val is not None and (best is None or val > best):
                    best = val
            if best is not None:
                out[n] = (level,) + solver.decode(best)
                first = pos
                break
    return out
