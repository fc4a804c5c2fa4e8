# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""A small Prometheus text-format (0.0.4) registry: counters, gauges, histograms.

gpu-aware exports a handful of series; this avoids a dependency on the hot
path and behaves the same whether or not ``prometheus_client`` is installed.
"""

from __future__ import annotations

import bisect
import math
import threading
from typing import Dict, List, Sequence, Tuple, TypeVar

LabelValues = Tuple[str, ...]
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _format_value(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


class _Metric:
    kind = "untyped"

    def __init__(self, name: str, help_text: str, labels: Sequence[str] = ()) -> None:
        self.name = name
        self.help = help_text
        self.labels = tuple(labels)
        self._lock = threading.Lock()

    def _label_text(self, values: LabelValues, extra: str = "") -> str:
        parts = ['%s="%s"' % (k, _escape(v)) for k, v in zip(self.labels, values)]
        if extra:
            parts.append(extra)
        return "{%s}" % ",".join(parts) if parts else ""

    def _check(self, values: LabelValues) -> LabelValues:
        if len(values) != len(self.labels):
            raise ValueError("%s takes labels %s" % (self.name, self.labels))
        return tuple(str(v) for v in values)

    def samples(self) -> List[str]:
        raise NotImplementedError

    def render(self) -> str:
        lines = ["# HELP %s %s" % (self.name, self.help), "# TYPE %s %s" % (self.name, self.kind)]
        lines.extend(self.samples())
        return "\n".join(lines)


M = TypeVar("M", bound=_Metric)


class Counter(_Metric):
    kind = "counter"

    def __init__(self, name: str, help_text: str, labels: Sequence[str] = ()) -> None:
        super().__init__(name, help_text, labels)
        self._values: Dict[LabelValues, float] = {}
        if not self.labels:
            self._values[()] = 0.0

    def inc(self, *values: str, amount: float = 1.0) -> None:
        key = self._check(values)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, *values: str) -> float:
        return self._values.get(self._check(values), 0.0)

    def samples(self) -> List[str]:
        with self._lock:
            items = sorted(self._values.items())
        return ["%s%s %s" % (self.name, self._label_text(k), _format_value(v)) for k, v in items]


class Gauge(Counter):
    kind = "gauge"

    def set(self, *values: str, value: float) -> None:
        key = self._check(values)
        with self._lock:
            self._values[key] = float(value)


class Histogram(_Metric):
    kind = "histogram"

    def __init__(self, name: str, help_text: str, labels: Sequence[str] = (),
                 buckets: Sequence[float] = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5,
                                             5)) -> None:
        super().__init__(name, help_text, labels)
        self.buckets = tuple(sorted(buckets))
        self._series: Dict[LabelValues, List[float]] = {}   # bucket counts..., count, sum

    def observe(self, *values: str, value: float) -> None:
        key = self._check(values)
        position = bisect.bisect_left(self.buckets, value)
        with self._lock:
            series = self._series.get(key)
            if series is None:
                series = self._series[key] = [0.0] * (len(self.buckets) + 2)
            if position < len(self.buckets):
                series[position] += 1
            series[-2] += 1
            series[-1] += value

    def count(self, *values: str) -> float:
        series = self._series.get(self._check(values))
        return series[-2] if series else 0.0

    def samples(self) -> List[str]:
        out: List[str] = []
        with self._lock:
            items = sorted((k, list(v)) for k, v in self._series.items())
        for key, series in items:
            cumulative = 0.0
            for bound, count in zip(self.buckets, series):
                cumulative += count
                out.append("%s_bucket%s %s" % (self.name, self._label_text(key, 'le="%s"' % _format_value(bound)),
                                               _format_value(cumulative)))
            out.append("%s_bucket%s %s" % (self.name, self._label_text(key, 'le="+Inf"'),
                                           _format_value(series[-2])))
            out.append("%s_count%s %s" % (self.name, self._label_text(key), _format_value(series[-2])))
            out.append("%s_sum%s %s" % (self.name, self._label_text(key), _format_value(series[-1])))
        return out


class Registry:
    def __init__(self) -> None:
        self._metrics: List[_Metric] = []

    def add(self, metric: M) -> M:
        self._metrics.append(metric)
        return metric

    def render(self) -> bytes:
        return ("\n".join(m.render() for m in self._metrics) + "\n").encode("utf-8")


class ExtenderMetrics:
    """The series gpu-aware exports (names documented in docs/gpu-aware.md)."""

    def __init__(self) -> None:
        r = self.registry = Registry()
        self.requests = r.add(Counter("gpu_aware_requests_total", "HTTP requests by verb and status code.",
                                      ("verb", "code")))
        self.duration = r.add(Histogram("gpu_aware_request_duration_seconds",
                                        "Time to answer filter/prioritize: from reading the body to the answer ready to send.",
                                        ("verb",)))
        self.nodes = r.add(Counter("gpu_aware_filter_nodes_total",
                                   "Nodes judged by filter, by result (passed, failed, unresolvable).",
                                   ("result",)))
        self.weight = r.add(Gauge("gpu_aware_weight", "Weight in use, by name (score, loss).", ("name",)))
        self.config_valid = r.add(Gauge("gpu_aware_config_valid",
                                        "1 when the last ConfigMap read was applied, 0 when it was rejected."))
        self.config_errors = r.add(Counter("gpu_aware_config_errors_total",
                                           "ConfigMap values rejected (the last good weights stay)."))
        self.config_reloads = r.add(Counter("gpu_aware_config_reloads_total",
                                            "Weights changes applied from the ConfigMap."))
        self.cache_nodes = r.add(Gauge("gpu_aware_node_cache_nodes", "Nodes in the node cache."))
        self.cache_synced = r.add(Gauge("gpu_aware_node_cache_synced",
                                        "1 once the node cache has listed the nodes."))
        self.watch_restarts = r.add(Counter("gpu_aware_watch_restarts_total",
                                            "List/watch reconnects after an error, by resource.", ("resource",)))
        self.relists = r.add(Counter("gpu_aware_relists_total", "Full lists, by resource.", ("resource",)))
        self.annotation_errors = r.add(Counter("gpu_aware_annotation_errors_total",
                                               "Nodes seen with an unusable gpu-device annotation."))
        self.config_valid.set(value=1)
