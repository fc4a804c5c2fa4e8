"""Scoring: the pair weight table, the annotation scale and the set metrics."""
from __future__ import annotations

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.sim.alloc_synth import topology_from_spec
from ansible_collections.metax.gpu.plugins.module_utils.gpu.model import LinkClass
from ansible_collections.metax.gpu.plugins.module_utils.gpu.scoring import (
    PAIR_WEIGHTS, SINGLE_DEVICE_SCORE, annotation_score, combinations_count, evaluate, exhaustive_best)
from ansible_collections.metax.gpu.plugins.module_utils.sim.spec import preset

C500x8 = topology_from_spec(preset("8xC500"))


def test_weights_follow_the_link_order():
    ordered = [PAIR_WEIGHTS[c] for c in sorted(LinkClass)]
    assert ordered == sorted(set(ordered)) and ordered[0] > 0 and ordered[-1] < 100
    assert PAIR_WEIGHTS[LinkClass.MX] > PAIR_WEIGHTS[LinkClass.PIX]      # rule 1


def test_annotation_score_scale():
    assert annotation_score(1, None, 0) == SINGLE_DEVICE_SCORE == 800
    assert annotation_score(2, LinkClass.MX, 70) == 670
    assert annotation_score(2, LinkClass.SAME_GPU, 90) == 790
    # 12 MX pairs and 16 SYS pairs: SYS level, mean weight 40
    assert annotation_score(8, LinkClass.SYS, 12 * 70 + 16 * 10) == 100 + 35
    assert annotation_score(0, None, 0) == 0
    with pytest.raises(ValueError):
        annotation_score(3, None, 0)


def test_a_tighter_bottleneck_always_scores_higher():
    for size in range(2, 40):
        pairs = size * (size - 1) // 2
        for low in LinkClass:
            for high in LinkClass:
                if high > low:
                    best_low = annotation_score(size, low, pairs * PAIR_WEIGHTS[LinkClass.SAME_GPU])
                    worst_high = annotation_score(size, high, pairs * PAIR_WEIGHTS[high])
                    assert worst_high > best_low


def test_evaluate_manual_example_2():
    free = range(2, 8)
    good = evaluate(C500x8, (2, 3), free)
    bad = evaluate(C500x8, (4, 5), free)
    assert good.bottleneck == bad.bottleneck == LinkClass.MX and good.pair_sum == bad.pair_sum == 70
    assert good.cut[LinkClass.MX] == 0 and bad.cut[LinkClass.MX] == 4
    assert good.loss == 8 * 10 and bad.loss == 4 * 70 + 4 * 10
    assert good.key() > bad.key()


def test_evaluate_single_and_whole():
    one = evaluate(C500x8, [0], range(8))
    assert one.bottleneck is None and one.score == 800 and one.loss == 3 * 70 + 4 * 10
    whole = evaluate(C500x8, range(8), range(8))
    assert whole.loss == 0 and whole.pair_sum == 12 * 70 + 16 * 10


def test_exhaustive_best_and_counts():
    assert exhaustive_best(C500x8, range(2, 8), 2)[0] == (2, 3)
    assert exhaustive_best(C500x8, range(8), 3, [7])[0] == (4, 5, 7)
    assert combinations_count(16, 0, 8) == 12870
    assert combinations_count(8, 2, 4) == 15
    assert combinations_count(4, 0, 5) == 0
    with pytest.raises(ValueError):
        exhaustive_best(C500x8, range(2, 8), 2, [0])
