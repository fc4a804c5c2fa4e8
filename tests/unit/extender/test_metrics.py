# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""gpu-aware's series: the names and labels docs/gpu-aware.md lists (dashboards and rules depend on them),
written by prometheus_client through kubelet/metrics.py."""
from __future__ import annotations

import os
import re

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.extender.metrics import CONTENT_TYPE, ExtenderMetrics

parser = pytest.importorskip("prometheus_client.parser")
DOC = os.path.join(os.path.dirname(__file__), "..", "..", "..", "docs", "gpu-aware.md")


def documented():
    """{series: (type, label names)} of the Metrics table of docs/gpu-aware.md."""
    text = open(DOC).read().split("## Metrics", 1)[1].split("\n## ", 1)[0]
    out = {}
    for name, labels, kind in re.findall(r"^\| `(gpu_aware_\w+)(?:\{([\w,]+)\})?` \| (\w+) \|", text, re.M):
        out[name] = (kind, tuple(sorted(labels.split(","))) if labels else ())
    return out


def exposed(metrics):
    """{series as documented: (type, label names)}, every labelled series touched once."""
    metrics.requests.labels("filter", "200").inc()
    metrics.duration.labels("filter").observe(0.002)
    metrics.nodes.labels("passed").inc(3)
    metrics.weight.labels("score").set(1)
    metrics.watch_restarts.labels("nodes").inc()
    metrics.relists.labels("nodes").inc()
    out = {}
    for family in parser.text_string_to_metric_families(metrics.exposition().decode()):
        if family.name.endswith("_created"):
            continue        # prometheus_client's creation time of each counter (not documented, not used)
        name = family.name + "_total" if family.type == "counter" else family.name
        labels = {k for s in family.samples for k in s.labels if k != "le"}
        out[name] = (family.type, tuple(sorted(labels)))
    return out


def test_the_series_are_the_documented_ones():
    table = documented()
    assert len(table) == 12
    assert exposed(ExtenderMetrics()) == table


def test_values_read_back_and_the_exposition_is_prometheus_text():
    metrics = ExtenderMetrics()
    assert metrics.value("gpu_aware_config_valid") == 1        # set at start
    metrics.nodes.labels("failed").inc(2)
    metrics.nodes.labels("failed").inc()
    assert metrics.value("gpu_aware_filter_nodes_total", result="failed") == 3
    assert metrics.value("gpu_aware_filter_nodes_total", result="passed") == 0      # absent: 0
    assert CONTENT_TYPE.startswith("text/plain; version=")      # the text format, as prometheus_client names it
    for value in (0.0005, 0.003, 7.0):
        metrics.duration.labels("prioritize").observe(value)
    assert metrics.value("gpu_aware_request_duration_seconds_count", verb="prioritize") == 3
    assert metrics.value("gpu_aware_request_duration_seconds_bucket", verb="prioritize", le="0.001") == 1
    assert metrics.value("gpu_aware_request_duration_seconds_bucket", verb="prioritize", le="+Inf") == 3


def test_each_instance_has_its_own_registry():
    first, second = ExtenderMetrics(), ExtenderMetrics()
    first.relists.labels("nodes").inc()
    assert first.value("gpu_aware_relists_total", resource="nodes") == 1
    assert second.value("gpu_aware_relists_total", resource="nodes") == 0
