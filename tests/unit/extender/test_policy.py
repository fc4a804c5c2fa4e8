# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""filter and prioritize decisions, and the weights."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.metax.gpu.plugins.module_utils.extender.nodeinfo import GpuState
from ansible_collections.metax.gpu.plugins.module_utils.extender.policy import (
    NEUTRAL_SCORE, REASON_UNKNOWN, WeightError, Weights, filter_nodes, parse_weight, prioritize, reason_free,
    reason_total, weights_from_configmap)


def _state(total, free, score=None, loss=None, count=None):
    if score is None:
        return GpuState(total=total, free=free)
    return GpuState(total=total, free=free, scores={count: score}, losses={count: loss})


def test_filter_classifies_nodes():
    names = ["ok", "busy", "small", "unknown", "exact"]
    states = [_state(8, 8), _state(8, 2), _state(2, 2), None, _state(4, 4)]
    outcome = filter_nodes(4, names, states)
    assert outcome.passed == [0, 4]
    assert outcome.failed == {"busy": reason_free(4), "unknown": REASON_UNKNOWN}
    assert outcome.unresolvable == {"small": reason_total(4)}
    assert "4" in reason_free(4) and "metax-tech.com/gpu" in reason_free(4)


def test_filter_zero_demand_passes_known_nodes():
    outcome = filter_nodes(0, ["a", "b"], [_state(0, 0), None])
    assert outcome.passed == [0] and outcome.failed == {"b": REASON_UNKNOWN}


def test_reasons_do_not_vary_by_node():
    """kube-scheduler groups identical reasons in the pod's event ("3 <reason>")."""
    outcome = filter_nodes(3, ["a", "b"], [_state(8, 1), _state(8, 2)])
    assert len(set(outcome.failed.values())) == 1


def test_prioritize_example():
    # n = 2: A communicates best, B damages least, C is in between, D has no table.
    states = [_state(8, 8, 770, 360, 2), _state(8, 2, 210, 0, 2), _state(8, 4, 490, 180, 2), _state(8, 8)]
    assert prioritize(2, states, Weights(1, 0)) == [10, 0, 5, NEUTRAL_SCORE]
    assert prioritize(2, states, Weights(0, 1)) == [0, 10, 5, NEUTRAL_SCORE]
    assert prioritize(2, states, Weights(1, 1)) == [5, 5, 5, NEUTRAL_SCORE]
    assert prioritize(2, states, Weights(3, 1)) == [8, 3, 5, NEUTRAL_SCORE]   # 7.5 -> 8, 2.5 -> 3
    assert prioritize(2, states, Weights(0, 0)) == [NEUTRAL_SCORE] * 4
    assert prioritize(0, states, Weights(1, 1)) == [NEUTRAL_SCORE] * 4


def test_prioritize_equal_candidates_score_full():
    states = [_state(8, 8, 500, 40, 1), _state(8, 8, 500, 40, 1)]
    assert prioritize(1, states, Weights(1, 1)) == [10, 10]


def test_prioritize_missing_count_is_neutral():
    states = [_state(8, 8, 500, 40, 1), _state(8, 8, 600, 10, 1)]
    assert prioritize(2, states, Weights(1, 1)) == [NEUTRAL_SCORE, NEUTRAL_SCORE]
    assert prioritize(1, [None, states[0]], Weights(1, 1)) == [NEUTRAL_SCORE, 10]


table = st.tuples(st.integers(0, 900), st.integers(0, 5000))
# Weights as administrators write them. Subnormal floats (5e-324) are left out:
# there the reference formula below underflows (w * 0.5 == 0) while the
# implementation's algebraically equal form does not.
weight = st.one_of(st.just(0.0), st.floats(1e-6, 100, allow_nan=False))


@settings(deadline=None, max_examples=200)
@given(st.lists(st.one_of(st.none(), table), min_size=1, max_size=12), weight, weight)
def test_prioritize_properties(tables, ws, wl):
    states = [None if t is None else _state(8, 8, t[0], t[1], 3) for t in tables]
    weights = Weights(ws, wl)
    scores = prioritize(3, states, weights)
    assert len(scores) == len(states)
    assert all(0 <= s <= 10 and isinstance(s, int) for s in scores)
    assert scores == prioritize(3, states, weights)                     # deterministic
    for t, s in zip(tables, scores):
        if t is None:
            assert s == NEUTRAL_SCORE
    known = [(t, s) for t, s in zip(tables, scores) if t is not None]
    if known and ws + wl > 0:
        # The formula, computed independently.
        s_lo, s_hi = min(k[0][0] for k in known), max(k[0][0] for k in known)
        l_lo, l_hi = min(k[0][1] for k in known), max(k[0][1] for k in known)
        for (score, loss), got in known:
            ns = (score - s_lo) / (s_hi - s_lo) if s_hi > s_lo else 1.0
            nl = (loss - l_lo) / (l_hi - l_lo) if l_hi > l_lo else 0.0
            exact = 10 * (ws * ns + wl * (1 - nl)) / (ws + wl)
            assert abs(got - exact) <= 0.5 + 1e-6
        # Monotonic: better in both terms never scores lower.
        for (a, sa) in known:
            for (b, sb) in known:
                if a[0] >= b[0] and a[1] <= b[1]:
                    assert sa >= sb


@settings(deadline=None, max_examples=100)
@given(st.lists(table, min_size=2, max_size=10, unique_by=lambda t: t[0]))
def test_score_weight_alone_ranks_by_score(tables):
    states = [_state(8, 8, t[0], t[1], 2) for t in tables]
    scores = prioritize(2, states, Weights(1, 0))
    best = max(range(len(tables)), key=lambda i: tables[i][0])
    worst = min(range(len(tables)), key=lambda i: tables[i][0])
    assert scores[best] == 10 and scores[worst] == 0


@settings(deadline=None, max_examples=100)
@given(st.lists(table, min_size=2, max_size=10, unique_by=lambda t: t[1]))
def test_loss_weight_alone_ranks_by_loss(tables):
    states = [_state(8, 8, t[0], t[1], 2) for t in tables]
    scores = prioritize(2, states, Weights(0, 5))
    least = min(range(len(tables)), key=lambda i: tables[i][1])
    most = max(range(len(tables)), key=lambda i: tables[i][1])
    assert scores[least] == 10 and scores[most] == 0


@pytest.mark.parametrize("text, value", [("1", 1.0), ("0", 0.0), (" 2.5 ", 2.5), (".5", 0.5), ("10.", 10.0),
                                         (3, 3.0), (0.25, 0.25)])
def test_parse_weight(text, value):
    assert parse_weight(text) == value


@pytest.mark.parametrize("text", ["-1", "abc", "", "1e3", "nan", "inf", "1,5", True, None, -2, float("inf"),
                                  "1 2", "0x10"])
def test_parse_weight_rejects(text):
    with pytest.raises(WeightError):
        parse_weight(text)


def test_weights_from_configmap():
    flags = Weights(2, 3, "flags")
    assert weights_from_configmap({"scoreWeight": "5"}, flags, "cm") == Weights(5, 3, "cm")
    assert weights_from_configmap({}, flags, "cm") == Weights(2, 3, "cm")
    assert weights_from_configmap(None, flags, "cm") == Weights(2, 3, "cm")
    assert weights_from_configmap({"scoreWeight": "0", "lossWeight": "4", "other": "x"}, flags, "cm") == \
        Weights(0, 4, "cm")
    with pytest.raises(WeightError, match="lossWeight"):
        weights_from_configmap({"scoreWeight": "1", "lossWeight": "-1"}, flags, "cm")
    assert math.isclose(weights_from_configmap({"lossWeight": "0.125"}, flags, "cm").loss, 0.125)
