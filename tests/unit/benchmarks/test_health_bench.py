# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The GPU health benchmark's pure parts (benchmarks/health_bench.py): percentiles, the rows it injects
and how it plans its rounds, the per-minute arithmetic, the tables. No timing."""

from __future__ import annotations

import os
import random
import sys
from collections import Counter

import pytest

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "benchmarks")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)

import health_bench as H  # noqa: E402

from ansible_collections.metax.gpu.plugins.module_utils.health import policy as P  # noqa: E402


def test_percentile_is_nearest_rank():
    values = list(range(1, 101))          # 1..100
    assert H.percentile(values, 0.5) == 50
    assert H.percentile(values, 0.99) == 99
    assert H.percentile(values, 1.0) == 100
    assert H.percentile(values, 0.0) == 1
    # 40 samples: the p99 is the largest (what a p99 of 40 can say), the p50 the 20th
    forty = [float(v) for v in range(40, 0, -1)]
    assert H.percentile(forty, 0.99) == 40.0 and H.percentile(forty, 0.5) == 20.0
    assert H.percentile([7.0], 0.99) == 7.0
    with pytest.raises(ValueError):
        H.percentile([], 0.5)
    with pytest.raises(ValueError):
        H.percentile([1.0], 1.5)


def test_summarize():
    assert H.summarize([]) is None
    s = H.summarize([3.0, 1.0, 2.0])
    assert (s.n, s.p50, s.p99, s.max) == (3, 2.0, 3.0, 3.0)


def test_per_minute_counts_the_readings_the_loop_makes():
    # the loop waits the interval after each reading: a 5 s interval and a 1 s reading -> 10 readings a minute
    assert H.per_minute(0.5, 5, 1.0) == pytest.approx(5.0)
    assert H.per_minute(2, 5) == pytest.approx(24.0)       # 2 mx-smi runs a reading, 12 readings
    with pytest.raises(ValueError):
        H.per_minute(1.0, 0)


def test_every_row_of_the_default_table_is_benchmarked_with_its_own_threshold_or_rate():
    rows = H.default_rows()
    assert len(rows) == len(P.DEFAULT_RULES)
    assert len({r.label for r in rows}) == len(rows)           # two rows of one signal get two labels
    for row, rule in zip(rows, P.DEFAULT_RULES):
        assert (row.signal, row.action) == (rule.signal, rule.action)
        assert row.amount == (rule.threshold if rule.threshold is not None else rule.rate)
    labels = {r.label for r in rows}
    assert {"ecc-dram-correctable +1", "ecc-dram-correctable +1000", "ecc-retired-pages"} <= labels
    assert {r.signal for r in rows if r.node_wide} == {"driver-not-loaded", "mx-smi-unresponsive"}
    assert [r.signal for r in rows if not r.recovers] == ["eid-driver", "eid-sdk"]


def test_plan_rounds_fills_rounds_with_different_rows_and_keeps_node_wide_rows_alone():
    rows = H.default_rows()
    rounds = H.plan_rounds(rows, 5, random.Random(3))
    counts = Counter(r.label for rnd in rounds for r in rnd)
    assert set(counts.values()) == {5} and len(counts) == len(rows)
    for rnd in rounds:
        assert len(rnd) <= H.GPUS and len({r.label for r in rnd}) == len(rnd)
        if any(r.node_wide for r in rnd):
            assert len(rnd) == 1
    per_gpu = sum(1 for r in rows if not r.node_wide)
    assert sum(1 for rnd in rounds if not rnd[0].node_wide) == -(-per_gpu * 5 // H.GPUS)


def test_latency_table_orders_rows_as_the_policy_and_counts_the_missed():
    samples = [{"row": "pci-aer-ue", "action": "device-unhealthy", "detect": 0.5, "scan": 0.1, "recover": 3.0},
               {"row": "gpu-lost", "action": "device-unhealthy", "detect": 1.0, "scan": 0.2, "recover": 1.0},
               {"row": "gpu-lost", "action": "device-unhealthy", "detect": None, "scan": None, "recover": None}]
    lines = H.latency_table(samples, 5)
    assert lines[2].startswith("gpu-lost") and "(1 not detected)" in lines[2]
    assert lines[3].startswith("pci-aer-ue")
    assert "all rows: n 2" in lines[-1]
