# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""gpu-aware's decisions: which nodes pass, how they score, and the weights.

Pure functions; ``docs/gpu-aware.md`` states the same rules for users.

Filter, for a pod that needs ``n`` devices (n > 0):

* fewer than ``n`` devices in total -> ``FailedAndUnresolvableNodes``
  (preempting pods there cannot help);
* fewer than ``n`` free healthy devices -> ``FailedNodes``;
* otherwise the node passes. A pod that needs no device passes everywhere.

Prioritize: the per-count tables give each candidate node ``i`` a score
``s_i`` (communication quality of the best ``n``-set, higher is better) and a
loss ``l_i`` (damage to the devices left free, lower is better). Both are
min-max normalised over the candidates of the request that have them::

    s'_i = (s_i - min s) / (max s - min s)      (1 when all are equal)
    l'_i = (l_i - min l) / (max l - min l)      (0 when all are equal)
    score_i = floor(10 * (W_s * s'_i + W_l * (1 - l'_i)) / (W_s + W_l) + 1/2)

``W_s`` = ``scoreWeight`` and ``W_l`` = ``lossWeight``. Nodes without a table
entry for ``n`` (no annotations, or tables from before a change) get the
neutral :data:`NEUTRAL_SCORE`, and so does every node when both weights are 0
or the pod needs no device. The normalisation makes the two scales (see
``gpu/scoring.py``) comparable whatever their units, and the score depends
only on the request, so the same request always gets the same answer.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from itertools import compress
from operator import not_
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple, cast

from ..errors import MetaxGpuError
from ..names import RESOURCE_NAME
from .nodeinfo import GpuState

MIN_SCORE = 0
MAX_SCORE = 10
NEUTRAL_SCORE = 5

KEY_SCORE_WEIGHT = "scoreWeight"
KEY_LOSS_WEIGHT = "lossWeight"
DEFAULT_SCORE_WEIGHT = 1.0
DEFAULT_LOSS_WEIGHT = 1.0
# A weight is a plain non-negative decimal ("1", "0.5", "10").
_WEIGHT = re.compile(r"^\s*(\d{1,9}(\.\d{0,9})?|\.\d{1,9})\s*$")


class WeightError(MetaxGpuError, ValueError):
    """A weight value (flag or ConfigMap) is not acceptable."""


@dataclass(frozen=True)
class Weights:
    score: float = DEFAULT_SCORE_WEIGHT
    loss: float = DEFAULT_LOSS_WEIGHT
    source: str = "default"        # "flags" | "configmap <ns>/<name>" | "default"


def parse_weight(value: object, what: str = "weight") -> float:
    """A weight from a flag or a ConfigMap value: a non-negative decimal number."""
    if isinstance(value, bool):
        raise WeightError("%s: %r is not a number" % (what, value))
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str) and _WEIGHT.match(value):
        number = float(value)
    else:
        raise WeightError("%s: %r is not a non-negative decimal number" % (what, value))
    if not math.isfinite(number) or number < 0:
        raise WeightError("%s: %r is not a non-negative decimal number" % (what, value))
    return number


def weights_from_configmap(data: Optional[Mapping[str, object]], defaults: Weights, source: str) -> Weights:
    """The weights a ConfigMap's ``data`` asks for; a missing key keeps the default (the flag).

    Raises :class:`WeightError` naming the first bad key; the caller keeps the
    last good weights then.
    """
    data = data or {}
    score = defaults.score
    loss = defaults.loss
    if KEY_SCORE_WEIGHT in data:
        score = parse_weight(data[KEY_SCORE_WEIGHT], KEY_SCORE_WEIGHT)
    if KEY_LOSS_WEIGHT in data:
        loss = parse_weight(data[KEY_LOSS_WEIGHT], KEY_LOSS_WEIGHT)
    return Weights(score=score, loss=loss, source=source)


# --------------------------------------------------------------------- filter

def reason_total(demand: int) -> str:
    return "gpu-aware: node has fewer than %d %s devices in total" % (demand, RESOURCE_NAME)


def reason_free(demand: int) -> str:
    return "gpu-aware: fewer than %d free healthy %s devices" % (demand, RESOURCE_NAME)


REASON_UNKNOWN = "gpu-aware: node not in gpu-aware's node cache yet"


@dataclass
class FilterOutcome:
    passed: List[int]                 # indices into the request's nodes, in request order
    failed: Dict[str, str]            # FailedNodes
    unresolvable: Dict[str, str]      # FailedAndUnresolvableNodes


def filter_nodes(demand: int, names: Sequence[str], states: Sequence[Optional[GpuState]]) -> FilterOutcome:
    """Split the candidates; ``states[i]`` is None when node ``names[i]`` is unknown."""
    need = max(demand, 0)
    fits = [state is not None and state.fit >= need for state in states]
    if all(fits):
        return FilterOutcome(list(range(len(fits))), {}, {})
    return filter_outcome(demand, names, fits, dict(zip(names, states)).get)


def filter_outcome(demand: int, names: Sequence[str], fits: Sequence[bool],
                   state_of: Callable[[str], Optional[GpuState]]) -> FilterOutcome:
    """The outcome once ``fits[i]`` (node i can serve ``demand`` devices now) is known; ``state_of(name)``
    is asked only about the nodes that cannot, to say why."""
    passed = list(compress(range(len(fits)), fits))
    if len(passed) == len(fits):
        return FilterOutcome(passed, {}, {})
    need = max(demand, 0)
    free_reason = reason_free(demand)
    failing = list(compress(names, map(not_, fits)))
    states = list(map(state_of, failing))
    failed = {name: free_reason if state is not None else REASON_UNKNOWN for name, state in zip(failing, states)}
    unresolvable: Dict[str, str] = {}
    if any(state is not None and state.total < need for state in states):
        total_reason = reason_total(demand)
        for name, state in zip(failing, states):
            if state is not None and state.total < need:
                failed.pop(name, None)      # a name can repeat in a request that skipped parse_args
                unresolvable[name] = total_reason
    return FilterOutcome(passed, failed, unresolvable)


# ----------------------------------------------------------------- prioritize

def prioritize(demand: int, states: Sequence[Optional[GpuState]], weights: Weights) -> List[int]:
    """Scores 0..10 for the candidates, in order (formula in the module docstring)."""
    if demand <= 0:
        return [NEUTRAL_SCORE] * len(states)
    return scores_from_tables([None if state is None else state.pairs.get(demand) for state in states], weights)


def scores_from_tables(tables: Sequence[Optional[Tuple[int, int]]], weights: Weights) -> List[int]:
    """Scores for the candidates' ``(score, loss)`` entries of the request's count (None: no entry)."""
    total_weight = weights.score + weights.loss
    # set() then discard(None): a C pass, where a comprehension testing each entry is a Python one.
    found: Set[Optional[Tuple[int, int]]] = set(tables)
    found.discard(None)
    distinct = cast(Set[Tuple[int, int]], found)
    if total_weight <= 0 or not distinct:
        return [NEUTRAL_SCORE] * len(tables)
    scores = [table[0] for table in distinct]
    losses = [table[1] for table in distinct]
    s_lo, s_hi, l_lo, l_hi = min(scores), max(scores), min(losses), max(losses)
    cs = MAX_SCORE * weights.score / total_weight
    cl = MAX_SCORE * weights.loss / total_weight
    # score_i = cs * s'_i + cl * (1 - l'_i) = base + ks * s_i - kl * l_i, rounded half up. It lies in
    # [0.5, 10.5] before int() truncates, so the result is within 0..10 without clamping.
    ks = cs / (s_hi - s_lo) if s_hi > s_lo else 0.0
    kl = cl / (l_hi - l_lo) if l_hi > l_lo else 0.0
    base = (cs if ks == 0.0 else -ks * s_lo) + cl + kl * l_lo + 0.5 + 1e-9
    value: Dict[Optional[Tuple[int, int]], int] = {table: int(base + ks * table[0] - kl * table[1])
                                                   for table in distinct}
    value[None] = NEUTRAL_SCORE
    return list(map(value.__getitem__, tables))
