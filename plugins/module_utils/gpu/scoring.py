# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""How good a set of devices is, and how much it costs the devices left free.

This is the objective the allocator optimises and the scale of the node
annotations ``metax-tech.com/gpu.topology.scores`` / ``.losses``. Pure
functions over a :class:`~.model.Topology`; see ``docs/allocator.md``.

Objective for a request of ``n`` devices out of the free set ``F``, compared
lexicographically (first difference wins):

1. **bottleneck** -- the worst link class inside the set (max). A set inside
   one MetaXLink group beats one inside one PCIe switch beats one spread over
   switches, and so on: the manual's rules (1) and (2). A ring all-reduce runs
   at the speed of its slowest hop, so this is also what a job feels first.
2. **pair sum** ``P`` -- the sum of :data:`PAIR_WEIGHTS` over the pairs of the
   set (max): among sets with the same worst hop, more close pairs are better.
3. **damage** -- the pairs (chosen device, device left free) that the
   allocation cuts, counted per link class and compared closest class first
   (min): first break as few VF-sibling pairs as possible, then as few
   MetaXLink pairs, then PIX, and so on. This is best fit from the bottom of
   the hierarchy up: VFs pack onto GPUs that are already split, GPUs onto
   groups that are already broken, and whole groups stay whole -- the manual's
   rule (3). The published **loss** ``L`` is the same cut summed with the pair
   weights: the communication potential the free pool loses for good.
4. lowest device indices (a deterministic tie-break).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple

from .model import LinkClass, Topology

# Pair weights. Only their order is prescribed by the manual (rule 1: a
# MetaXLink pair beats any PCIe pair); the sizes only break ties between sets
# whose worst hop is the same. PCIe levels are evenly spaced (each extra level
# of the PCIe tree costs the same, as in NVIDIA's allocator); MetaXLink is a
# dedicated fabric well above any PCIe path; two VFs of one GPU share the chip.
# All weights stay below 100 so the annotation score below can carry the
# bottleneck level in its hundreds digit.
PAIR_WEIGHTS: Dict[LinkClass, int] = {
    LinkClass.SYS: 10,
    LinkClass.NODE: 20,
    LinkClass.PHB: 30,
    LinkClass.PXB: 40,
    LinkClass.PIX: 50,
    LinkClass.MX: 70,
    LinkClass.SAME_GPU: 90,
}
# Indexed by int(LinkClass) for the hot loops.
WEIGHT_BY_CLASS: Tuple[int, ...] = tuple(PAIR_WEIGHTS[LinkClass(v)] for v in range(len(LinkClass)))
# Annotation score of a single device: no link to cross, so above every
# multi-device level (levels are 1..7, see :func:`annotation_score`).
SINGLE_DEVICE_SCORE = 800


@dataclass(frozen=True)
class SetMetrics:
    """The objective's terms for one candidate set."""

    size: int
    bottleneck: Optional[LinkClass]   # None for a single device
    pair_sum: int                     # P
    loss: int                         # L: sum of weights of the cut pairs
    cut: Tuple[int, ...] = ()         # cut pairs per link class, indexed by int(LinkClass)

    @property
    def score(self) -> int:
        """The annotation-scale score (see :func:`annotation_score`)."""
        return annotation_score(self.size, self.bottleneck, self.pair_sum)

    def key(self) -> Tuple[int, int, Tuple[int, ...]]:
        """Larger is better; the allocator maximises this (then lowest indices)."""
        level = len(LinkClass) if self.bottleneck is None else int(self.bottleneck)
        cut = self.cut or (0,) * len(LinkClass)
        return (level, self.pair_sum, tuple(-cut[c] for c in range(len(cut) - 1, -1, -1)))


def weighted_cut(cut: Sequence[int]) -> int:
    """The published loss of a per-class cut."""
    return sum(WEIGHT_BY_CLASS[c] * count for c, count in enumerate(cut))


def annotation_score(size: int, bottleneck: Optional[LinkClass], pair_sum: int) -> int:
    """Integer score of a set, the value published per count.

    ``100 * level(bottleneck) + floor(mean pair weight)`` with level SYS=1 ..
    SAME_GPU=7: the hundreds digit says which group holds the set (rules 1-2),
    the rest how close its pairs are on average (always below 100). It orders
    sets of one size as the allocator does, up to the rounding of the mean.
    A single device scores :data:`SINGLE_DEVICE_SCORE`.
    """
    if size <= 1:
        return SINGLE_DEVICE_SCORE if size == 1 else 0
    if bottleneck is None:
        raise ValueError("a set of %d devices has a bottleneck link" % size)
    pairs = size * (size - 1) // 2
    return 100 * (int(bottleneck) + 1) + pair_sum // pairs


def link_class(topology: Topology, a: int, b: int) -> LinkClass:
    """The pair's class; a pair the topology does not know is taken as SYS (farthest)."""
    key = (a, b) if a < b else (b, a)
    return topology.links.get(key, LinkClass.SYS)


def evaluate(topology: Topology, devices: Iterable[int], free: Iterable[int]) -> SetMetrics:
    """Metrics of allocating ``devices`` out of the free set ``free``.

    Devices of the set that are not in ``free`` count as free (the set is
    what gets taken); other devices outside ``free`` do not matter.
    """
    chosen = sorted(set(devices))
    rest = sorted(set(free).difference(chosen))
    bottleneck: Optional[LinkClass] = None
    pair_sum = 0
    for i, a in enumerate(chosen):
        for b in chosen[i + 1:]:
            cls = link_class(topology, a, b)
            pair_sum += PAIR_WEIGHTS[cls]
            if bottleneck is None or cls < bottleneck:
                bottleneck = cls
    cut = [0] * len(LinkClass)
    for a in chosen:
        for r in rest:
            cut[int(link_class(topology, a, r))] += 1
    return SetMetrics(len(chosen), bottleneck, pair_sum, weighted_cut(cut), tuple(cut))


@dataclass(frozen=True)
class _Matrix:
    """Dense weight/class matrix over an index list, for the brute force."""

    order: Tuple[int, ...]
    cls: Tuple[Tuple[int, ...], ...]
    weight: Tuple[Tuple[int, ...], ...]


def _matrix(topology: Topology, order: Sequence[int]) -> _Matrix:
    cls_rows: List[Tuple[int, ...]] = []
    w_rows: List[Tuple[int, ...]] = []
    for a in order:
        row = [len(LinkClass) if a == b else int(link_class(topology, a, b)) for b in order]
        cls_rows.append(tuple(row))
        w_rows.append(tuple(0 if a == b else WEIGHT_BY_CLASS[c] for b, c in zip(order, row)))
    return _Matrix(tuple(order), tuple(cls_rows), tuple(w_rows))


def combinations_count(free: int, must: int, size: int) -> int:
    """How many candidate sets an exhaustive search would look at."""
    if size < must or size > free:
        return 0
    k = size - must
    n = free - must
    result = 1
    for i in range(min(k, n - k)):
        result = result * (n - i) // (i + 1)
    return result


def exhaustive_best(topology: Topology, free: Iterable[int], size: int,
                    must_include: Iterable[int] = ()) -> Tuple[Tuple[int, ...], SetMetrics]:
    """The optimum by trying every candidate set (the reference for tests).

    Ties on the objective go to the lexicographically smallest sorted index
    tuple, which is the first one :func:`itertools.combinations` yields.
    """
    order = tuple(sorted(set(free)))
    must: FrozenSet[int] = frozenset(must_include)
    if not must <= set(order):
        raise ValueError("must-include devices %s are not free" % sorted(must - set(order)))
    if not len(must) <= size <= len(order):
        raise ValueError("cannot choose %d of %d free devices with %d required"
                         % (size, len(order), len(must)))
    mat = _matrix(topology, order)
    pos = {dev: i for i, dev in enumerate(order)}
    # The per-class cut is compared closest class first: encode it in base
    # ``base`` (a class count never reaches it), most significant = closest.
    # cut code = sum over chosen of (code to every free device) - 2 * code inside.
    base = len(order) * len(order) // 4 + 1
    power = [base ** c for c in range(len(LinkClass))]
    code_row = [[power[c] if c < len(LinkClass) else 0 for c in row] for row in mat.cls]
    degree = [sum(row) for row in code_row]
    must_pos = sorted(pos[d] for d in must)
    others = [i for i in range(len(order)) if order[i] not in must]
    best_key: Optional[Tuple[int, int, int]] = None
    best_set: Tuple[int, ...] = ()
    top_level = len(LinkClass)
    for extra in itertools.combinations(others, size - len(must_pos)):
        members = sorted(must_pos + list(extra))
        level = top_level
        pair_sum = 0
        inside = 0
        for i, a in enumerate(members):
            crow = mat.cls[a]
            wrow = mat.weight[a]
            krow = code_row[a]
            for b in members[i + 1:]:
                pair_sum += wrow[b]
                inside += krow[b]
                if crow[b] < level:
                    level = crow[b]
        code = sum(degree[a] for a in members) - 2 * inside
        key = (level, pair_sum, -code)
        if best_key is None or key > best_key:
            best_key = key
            best_set = tuple(members)
    chosen = tuple(order[i] for i in best_set)
    return chosen, evaluate(topology, chosen, order)
