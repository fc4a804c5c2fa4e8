# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The series gpu-aware exports (names documented in docs/gpu-aware.md).

prometheus_client's metrics, through the agents' one metrics library
(kubelet/metrics.py); the scheduler-facing server (``server.py``) serves
:meth:`ExtenderMetrics.exposition` on ``/metrics`` itself. A benchmark
measured the library on the hot path against the writer gpu-aware had
before (benchmarks/metrics_library_bench.py; docs/design-decisions.md).
"""

from __future__ import annotations

from typing import Any

from ..kubelet.metrics import CONTENT_TYPE, counter, exposition, gauge, histogram, new_registry, sample

__all__ = ("CONTENT_TYPE", "ExtenderMetrics")


class ExtenderMetrics:  # pylint: disable=too-many-instance-attributes
    """gpu-aware's metrics, in a registry of their own (kubelet.metrics.NOOP each without prometheus_client)."""

    def __init__(self) -> None:
        r = self.registry = new_registry()
        self.requests: Any = counter("gpu_aware_requests", "HTTP requests by verb and status code.",
                                     ("verb", "code"), registry=r)
        self.duration: Any = histogram(
            "gpu_aware_request_duration_seconds",
            "Time to answer filter/prioritize: from reading the body to the answer ready to send.", ("verb",),
            registry=r)
        self.nodes: Any = counter("gpu_aware_filter_nodes",
                                  "Nodes judged by filter, by result (passed, failed, unresolvable).", ("result",),
                                  registry=r)
        self.weight: Any = gauge("gpu_aware_weight", "Weight in use, by name (score, loss).", ("name",), registry=r)
        self.config_valid: Any = gauge("gpu_aware_config_valid",
                                       "1 when the last ConfigMap read was applied, 0 when it was rejected.",
                                       registry=r)
        self.config_errors: Any = counter("gpu_aware_config_errors",
                                          "ConfigMap values rejected (the last good weights stay).", registry=r)
        self.config_reloads: Any = counter("gpu_aware_config_reloads", "Weights changes applied from the ConfigMap.",
                                           registry=r)
        self.cache_nodes: Any = gauge("gpu_aware_node_cache_nodes", "Nodes in the node cache.", registry=r)
        self.cache_synced: Any = gauge("gpu_aware_node_cache_synced", "1 once the node cache has listed the nodes.",
                                       registry=r)
        self.watch_restarts: Any = counter("gpu_aware_watch_restarts",
                                           "List/watch reconnects after an error, by resource.", ("resource",),
                                           registry=r)
        self.relists: Any = counter("gpu_aware_relists", "Full lists, by resource.", ("resource",), registry=r)
        self.annotation_errors: Any = counter("gpu_aware_annotation_errors",
                                              "Nodes seen with an unusable gpu-device annotation.", registry=r)
        self.config_valid.set(1)

    def exposition(self) -> bytes:
        """The text exposition of /metrics."""
        return exposition(self.registry)

    def value(self, series: str, /, **labels: str) -> float:
        """A sample's value by its exposed name (``gpu_aware_relists_total``, ``resource="nodes"``); 0 when absent."""
        found = sample(self.registry, series, **labels)
        return 0.0 if found is None else found
