# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Topology-aware GPU allocation: the preferred set for a request, and the
per-count score/loss tables published as node annotations.

Pure functions over a :class:`~.model.Topology` keyed by device index; the
device plugin maps kubelet device IDs (PCI addresses) with
:func:`preferred_allocation`. The objective is in :mod:`.scoring`, the exact
tree search in :mod:`.alloc_tree`; ``docs/allocator.md`` has the reasoning.
The command line is in :mod:`.allocator_cli` (kept apart so that modules
using the allocator ship neither argparse glue nor simulator presets).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple

from ..errors import MetaxGpuError
from .alloc_tree import Hierarchy, hierarchy, tree_allocate, tree_candidates, tree_tables
from .model import Inventory, LinkClass, Topology
from ..names import ANNOTATION_LOSSES, ANNOTATION_SCORES
from .scoring import (PAIR_WEIGHTS, SetMetrics, annotation_score,
                      combinations_count, evaluate, exhaustive_best, link_class, weighted_cut)

# Non-ultrametric topologies (see alloc_tree) are searched exhaustively up to
# this many candidate sets (C(12, 6) = 924 fits: every request on 12 devices
# is exact), beyond it by a bounded local search.
EXHAUSTIVE_LIMIT = 1000
# Swap trials the local search may spend per request (each costs O(link classes)).
SEARCH_BUDGET = 200000

__all__ = [
    "ANNOTATION_LOSSES", "ANNOTATION_SCORES", "PAIR_WEIGHTS", "Allocation", "AllocationError",
    "allocate", "per_count_tables", "topology_annotations", "preferred_allocation", "evaluate",
    "MAX_LOSS", "MAX_SCORE", "bounded_loss", "ids_to_indices", "indices_to_ids",
]


class AllocationError(MetaxGpuError, ValueError):
    """The request cannot be served as asked (bad size, unknown or unavailable devices)."""


@dataclass(frozen=True)
class Allocation:
    """The chosen set and why it was chosen."""

    devices: Tuple[int, ...]             # sorted device indices
    score: int                           # annotation scale (scoring.annotation_score)
    loss: int                            # pair weight lost to the devices left free
    bottleneck: Optional[LinkClass]      # worst link inside the set; None for one device
    pair_sum: int
    method: str                          # "tree" | "exhaustive" | "search"

    @property
    def exact(self) -> bool:
        """True when the set is proven optimal for the objective."""
        return self.method != "search"

    def to_dict(self) -> dict:
        return {
            "devices": list(self.devices),
            "size": len(self.devices),
            "score": self.score,
            "loss": self.loss,
            "bottleneck": None if self.bottleneck is None else self.bottleneck.legend,
            "pair_sum": self.pair_sum,
            "method": self.method,
        }


def _as_index_set(values: Iterable[int], what: str, known: FrozenSet[int]) -> FrozenSet[int]:
    out = set()
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int):
            raise AllocationError("%s: device index %r is not an integer" % (what, value))
        out.add(value)
    unknown = sorted(out - known)
    if unknown:
        raise AllocationError("%s: unknown device index(es) %s (this node has %s)"
                              % (what, _fmt(unknown), _fmt(sorted(known))))
    return frozenset(out)


def _fmt(indices: Sequence[int]) -> str:
    """Sorted indices as runs ("0-3,6"), short even on 128-device nodes."""
    parts: List[str] = []
    run: List[int] = []
    for index in list(indices) + [None]:
        if run and (index is None or index != run[-1] + 1):
            parts.append(str(run[0]) if len(run) == 1 else "%d-%d" % (run[0], run[-1]))
            run = []
        if index is not None:
            run.append(index)
    return ",".join(parts) or "none"


def _validate(topology: Topology, available: Iterable[int], size: int,
              must_include: Iterable[int]) -> Tuple[FrozenSet[int], FrozenSet[int]]:
    if isinstance(size, bool) or not isinstance(size, int):
        raise AllocationError("size must be an integer, got %r" % (size,))
    known = frozenset(topology.device_indices)
    free = _as_index_set(available, "available", known)
    must = _as_index_set(must_include, "must-include", known)
    if size < 1:
        raise AllocationError("size must be at least 1, got %d" % size)
    missing = sorted(must - free)
    if missing:
        raise AllocationError("must-include device(s) %s are not available (available: %s)"
                              % (_fmt(missing), _fmt(sorted(free))))
    if len(must) > size:
        raise AllocationError("%d must-include devices do not fit in a request of %d" % (len(must), size))
    if size > len(free):
        raise AllocationError("cannot allocate %d devices: only %d available (%s)"
                              % (size, len(free), _fmt(sorted(free))))
    return free, must


def allocate(topology: Topology, available: Iterable[int], size: int,
             must_include: Iterable[int] = ()) -> Allocation:
    """The preferred ``size`` devices out of ``available``, containing ``must_include``.

    Raises :class:`AllocationError` on bad input. Deterministic: the same
    input always gives the same set.
    """
    free, must = _validate(topology, available, size, must_include)
    tree = hierarchy(topology)
    if tree.ultrametric:
        res = tree_allocate(tree, free, must, size)
        bottleneck = None if size == 1 else LinkClass(res.level)
        metrics = SetMetrics(size, bottleneck, res.pair_sum, weighted_cut(res.cut), res.cut)
        return _result(res.devices, metrics, "tree")
    return _search(topology, tree, free, must, size)


def _result(devices: Sequence[int], metrics: SetMetrics, method: str) -> Allocation:
    return Allocation(tuple(sorted(devices)), metrics.score, metrics.loss, metrics.bottleneck,
                      metrics.pair_sum, method)


class _Dense:
    """Free-set matrices for the bounded search on non-ultrametric topologies."""

    def __init__(self, topology: Topology, free: FrozenSet[int]) -> None:
        self.order = sorted(free)
        size = len(self.order)
        self.cls = [[len(LinkClass)] * size for _row in range(size)]
        self.weight = [[0] * size for _row in range(size)]
        for i, a in enumerate(self.order):
            for j in range(i + 1, size):
                cls = link_class(topology, a, self.order[j])
                self.cls[i][j] = self.cls[j][i] = int(cls)
                self.weight[i][j] = self.weight[j][i] = PAIR_WEIGHTS[cls]
        # per-class cut encoded closest class first (see alloc_tree._Solver)
        base = size * size // 4 + 1
        power = [base ** c for c in range(len(LinkClass))]
        self.code = [[0 if i == j else power[self.cls[i][j]] for j in range(size)] for i in range(size)]
        self.degree = [sum(row) for row in self.code]
        self.orders: Optional[List[List[int]]] = None   # greedy growth orders, see _greedy_seeds

    def key(self, members: Sequence[int]) -> Tuple[int, int, int, int]:
        """(level, P, -cut code, tie-break) of positions ``members``; larger is better."""
        level = len(LinkClass)
        pair_sum = 0
        inside = 0
        for x, i in enumerate(members):
            crow, wrow, krow = self.cls[i], self.weight[i], self.code[i]
            for j in members[x + 1:]:
                pair_sum += wrow[j]
                inside += krow[j]
                if crow[j] < level:
                    level = crow[j]
        code = sum(self.degree[i] for i in members) - 2 * inside
        top = len(self.order) - 1
        return (level, pair_sum, -code, sum(1 << (top - i) for i in members))


def _search(topology: Topology, tree: Hierarchy, free: FrozenSet[int], must: FrozenSet[int],
            size: int, dense: Optional[_Dense] = None, all_sizes: bool = False) -> Allocation:
    """Exact by enumeration when small, else seeds improved by swaps (bounded work)."""
    if combinations_count(len(free), len(must), size) <= EXHAUSTIVE_LIMIT:
        devices, metrics = exhaustive_best(topology, free, size, must)
        return _result(devices, metrics, "exhaustive")
    if dense is None:
        dense = _Dense(topology, free)
    pos = {dev: i for i, dev in enumerate(dense.order)}
    fixed = sorted(pos[d] for d in must)
    cands = tree_candidates(tree, free, must, size)
    seeds: List[List[int]] = [sorted(pos[d] for d in cand) for cand in cands]
    seeds.extend(_greedy_seeds(dense, fixed, size, all_sizes))
    improved = _local_search(dense, max(seeds, key=dense.key), frozenset(fixed))
    chosen = [dense.order[i] for i in improved]
    return _result(chosen, evaluate(topology, chosen, free), "search")


def _greedy_seeds(dense: _Dense, fixed: List[int], size: int, all_sizes: bool = False) -> List[List[int]]:
    """Sets grown greedily from a few seeds, keeping the worst link as high as possible.

    The bottleneck comes first in the objective, so each step adds the device
    whose worst link to the set is highest, then the one adding the most pair
    weight, then the least damage. A step does not depend on the target size,
    so for the per-count tables (``all_sizes``) the growth orders are computed
    once per free set and every size takes a prefix: the same sets as growing
    each size on its own.
    """
    count = len(dense.order)
    if fixed:
        return [sorted(_grow(dense, list(fixed), size))]
    starts = range(min(count, max(2, min(16, 512 // max(1, count)))))
    if not all_sizes:
        return [sorted(_grow(dense, [start], size)) for start in starts]
    if dense.orders is None:
        dense.orders = [_grow(dense, [start], count) for start in starts]
    return [sorted(order[:size]) for order in dense.orders]


def _grow(dense: _Dense, members: List[int], size: int) -> List[int]:
    count = len(dense.order)
    inside = set(members)
    gain = [0] * count
    kgain = [0] * count
    worst = [len(LinkClass)] * count

    def add(m: int) -> None:
        wrow, krow, crow = dense.weight[m], dense.code[m], dense.cls[m]
        for i in range(count):
            gain[i] += wrow[i]
            kgain[i] += krow[i]
            if i != m and crow[i] < worst[i]:
                worst[i] = crow[i]

    for m in members:
        add(m)
    while len(members) < size:
        pick = -1
        pick_key = None
        for i in range(count):
            if i in inside:
                continue
            key = (worst[i], gain[i], 2 * kgain[i] - dense.degree[i], -i)
            if pick_key is None or key > pick_key:
                pick, pick_key = i, key
        members.append(pick)
        inside.add(pick)
        add(pick)
    return members


def _local_search(dense: _Dense, start: List[int], fixed: FrozenSet[int]) -> List[int]:
    """First-improvement swaps (one in, one out) until none helps or the budget is spent.

    Each trial swap is scored in O(classes) from per-device sums over the
    current set (pair weight, cut code, pairs per class), updated in O(F)
    when a swap is taken.
    """
    count = len(dense.order)
    classes = len(LinkClass)
    top = count - 1
    current = set(start)
    weight, code, cls, degree = dense.weight, dense.code, dense.cls, dense.degree
    sw = [sum(weight[x][m] for m in current) for x in range(count)]
    sk = [sum(code[x][m] for m in current) for x in range(count)]
    cc = [[0] * classes for _x in range(count)]
    for x in range(count):
        row = cc[x]
        for m in current:
            if m != x:
                row[cls[x][m]] += 1
    cnt = [sum(cc[m][c] for m in current) // 2 for c in range(classes)]
    pair_sum = sum(sw[m] for m in current) // 2
    inside = sum(sk[m] for m in current) // 2
    deg_sum = sum(degree[m] for m in current)
    tie = sum(1 << (top - m) for m in current)

    def level_of(counts: List[int]) -> int:
        for c in range(classes):
            if counts[c] > 0:
                return c
        return classes

    current_key = (level_of(cnt), pair_sum, -(deg_sum - 2 * inside), tie)
    budget = SEARCH_BUDGET
    improved = True
    while improved and budget > 0:
        improved = False
        outside = [i for i in range(count) if i not in current]
        level = current_key[0]
        for out_pos in sorted(current - fixed):
            cc_out = cc[out_pos]
            w_out_row = weight[out_pos]
            base_pairs = pair_sum - sw[out_pos]
            # unless every worst pair involves out_pos, the worst link cannot
            # rise, so a swap that loses pair weight cannot win
            can_rise = level < classes and cnt[level] == cc_out[level]
            for in_pos in outside:
                budget -= 1
                trial_pairs = base_pairs + sw[in_pos] - w_out_row[in_pos]
                if trial_pairs < pair_sum and not can_rise:
                    if budget <= 0:
                        break
                    continue
                link = cls[out_pos][in_pos]
                cc_in = cc[in_pos]
                trial_cnt = [cnt[c] - cc_out[c] + cc_in[c] for c in range(classes)]
                trial_cnt[link] -= 1
                trial_inside = inside - sk[out_pos] + sk[in_pos] - code[out_pos][in_pos]
                trial_deg = deg_sum - degree[out_pos] + degree[in_pos]
                trial_key = (level_of(trial_cnt), trial_pairs, -(trial_deg - 2 * trial_inside),
                             tie - (1 << (top - out_pos)) + (1 << (top - in_pos)))
                if trial_key > current_key:
                    current.discard(out_pos)
                    current.add(in_pos)
                    cnt, pair_sum, inside, deg_sum = trial_cnt, trial_pairs, trial_inside, trial_deg
                    tie = trial_key[3]
                    current_key = trial_key
                    w_in, w_out = weight[in_pos], weight[out_pos]
                    k_in, k_out = code[in_pos], code[out_pos]
                    c_in, c_out = cls[in_pos], cls[out_pos]
                    for x in range(count):
                        sw[x] += w_in[x] - w_out[x]
                        sk[x] += k_in[x] - k_out[x]
                        if x != in_pos:
                            cc[x][c_in[x]] += 1
                        if x != out_pos:
                            cc[x][c_out[x]] -= 1
                    improved = True
                    break
                if budget <= 0:
                    break
            if improved or budget <= 0:
                break
    return sorted(current)


def per_count_tables(topology: Topology, free: Iterable[int]) -> Tuple[Dict[int, int], Dict[int, int]]:
    """For n = 1..len(free): the score and the loss of the preferred n-set.

    The values of the annotations ``metax-tech.com/gpu.topology.scores`` and
    ``.losses`` (keys are counts; serialise them with :func:`topology_annotations`).
    Equal to ``allocate(topology, free, n).score`` / ``.loss`` for every n.
    """
    free_set = _as_index_set(free, "free", frozenset(topology.device_indices))
    scores: Dict[int, int] = {}
    losses: Dict[int, int] = {}
    tree = hierarchy(topology)
    if tree.ultrametric:
        for n, (level, pair_sum, cut) in tree_tables(tree, free_set).items():
            bottleneck = None if n == 1 else LinkClass(level)
            scores[n] = annotation_score(n, bottleneck, pair_sum)
            losses[n] = weighted_cut(cut)
        return scores, losses
    dense = _Dense(topology, free_set)
    for n in range(1, len(free_set) + 1):
        alloc = _search(topology, tree, free_set, frozenset(), n, dense, all_sizes=True)
        scores[n], losses[n] = alloc.score, alloc.loss
    return scores, losses


# Bounds of the published tables (DESIGN section 3: HAMi decodes them as a Go
# map[int]int and ranks with 2000 - value, a missing key counting as 0).
MAX_SCORE = 1000
MAX_LOSS = 1000
# A raw weighted cut of this size is published as about half the scale.
_LOSS_HALF = 2000


def bounded_loss(raw: int) -> int:
    """Compress a raw weighted cut into 0..MAX_LOSS-1, keeping its order."""
    if raw <= 0:
        return 0
    return 1 + ((MAX_LOSS - 2) * raw) // (raw + _LOSS_HALF)


def _compact(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=False)


def topology_annotations(topology: Optional[Topology], free: Iterable[int],
                         capacity: Optional[int] = None) -> Dict[str, str]:
    """The two topology annotations, the one serialiser of them (the device plugin publishes these).

    Keys ``"1"`` .. ``"C"``, C = ``capacity`` (the node's devices, healthy or
    not; default: the free devices), always all present: a size the free
    devices cannot serve carries the worst values (score 0, loss
    :data:`MAX_LOSS`). Scores are clamped to 0..:data:`MAX_SCORE`, losses
    compressed by :func:`bounded_loss` (order kept). ``topology`` None (the
    node's devices cannot be read) publishes the worst values for every size.
    """
    free = list(free)
    scores: Dict[int, int] = {}
    losses: Dict[int, int] = {}
    if free and topology is not None:
        scores, losses = per_count_tables(topology, free)
    out_scores: Dict[str, int] = {}
    out_losses: Dict[str, int] = {}
    for n in range(1, (len(free) if capacity is None else capacity) + 1):
        if n in scores:
            out_scores[str(n)] = max(0, min(MAX_SCORE, scores[n]))
            out_losses[str(n)] = bounded_loss(losses[n])
        else:
            out_scores[str(n)] = 0
            out_losses[str(n)] = MAX_LOSS
    return {ANNOTATION_SCORES: _compact(out_scores), ANNOTATION_LOSSES: _compact(out_losses)}


def ids_to_indices(inventory: Inventory, ids: Iterable[str], what: str = "device") -> List[int]:
    """Map kubelet device IDs (``Device.id``) to node-local indices."""
    index_of = {dev.id: dev.index for dev in inventory.devices}
    out = []
    unknown = []
    for dev_id in ids:
        if dev_id in index_of:
            out.append(index_of[dev_id])
        else:
            unknown.append(dev_id)
    if unknown:
        raise AllocationError("%s: unknown device id(s) %s" % (what, ", ".join(map(str, unknown))))
    return out


def indices_to_ids(inventory: Inventory, indices: Iterable[int]) -> List[str]:
    id_of = {dev.index: dev.id for dev in inventory.devices}
    return [id_of[i] for i in indices]


def preferred_allocation(inventory: Inventory, available_ids: Iterable[str], must_include_ids: Iterable[str],
                         size: int, topology: Optional[Topology] = None) -> List[str]:
    """GetPreferredAllocation for the device plugin: device IDs in, device IDs out (by index)."""
    topo = topology if topology is not None else inventory.topology
    available = ids_to_indices(inventory, available_ids, "available")
    must = ids_to_indices(inventory, must_include_ids, "must-include")
    alloc = allocate(topo, available, size, must)
    return indices_to_ids(inventory, alloc.devices)
