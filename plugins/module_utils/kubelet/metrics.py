# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The agents' metrics: prometheus_client, imported once under the ImportError guard, and the /metrics server.

Every agent defines its metrics with its domain (``deviceplugin/metrics.py``,
``extender/metrics.py``, the operator's handlers) through :func:`counter`,
:func:`gauge` and :func:`histogram`, which are prometheus_client's own
classes, and serves them with :class:`MetricsServer` (gpu-aware serves its
exposition on its scheduler-facing port instead). gpu-exporter renders each
scrape from a reading (``exporter/render.py``) and is served by the same
server. Why prometheus_client and not the writer gpu-aware had:
docs/design-decisions.md and benchmarks/metrics_library_bench.py.

prometheus_client is an agents' requirement (requirements/agents.txt), not a
controller's: without it ``HAS_PROMETHEUS`` is False, every metric is a no-op
that takes the same calls, and an exposition says so in a comment.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional, Protocol, Sequence, Tuple

from .httpserve import MAX_CONNECTIONS, REQUEST_TIMEOUT, TEXT, BoundedHandler, BoundedHTTPServer

try:
    # REGISTRY: re-exported, the process's default (operator-controller serves it)
    from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, generate_latest  # pylint: disable=unused-import
    from prometheus_client.exposition import CONTENT_TYPE_LATEST as CONTENT_TYPE
    HAS_PROMETHEUS = True
except ImportError:
    REGISTRY = CollectorRegistry = Counter = Gauge = Histogram = generate_latest = None  # type: ignore[assignment,misc]
    CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
    HAS_PROMETHEUS = False

MISSING = b"# prometheus_client is not installed (requirements/agents.txt)\n"
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class Noop:
    """A metric of prometheus_client's shape that records nothing (prometheus_client missing)."""

    def labels(self, *args: Any, **kwargs: Any) -> "Noop":  # pylint: disable=unused-argument
        return self

    def set(self, value: float) -> None:  # pylint: disable=unused-argument
        return None

    def inc(self, amount: float = 1) -> None:  # pylint: disable=unused-argument
        return None

    def observe(self, value: float) -> None:  # pylint: disable=unused-argument
        return None

    def remove(self, *args: Any) -> None:  # pylint: disable=unused-argument
        return None


NOOP = Noop()


def new_registry() -> Any:
    """A registry of one agent's own metrics (None without prometheus_client)."""
    return CollectorRegistry(auto_describe=True) if HAS_PROMETHEUS else None


def counter(name: str, help_text: str, labels: Sequence[str] = (), *, registry: Any) -> Any:
    """A counter (``name`` without ``_total``: prometheus_client appends it) registered in ``registry`` (an
    agent's :func:`new_registry`, or :data:`REGISTRY`, the process's default)."""
    return Counter(name, help_text, list(labels), registry=registry) if HAS_PROMETHEUS else NOOP


def gauge(name: str, help_text: str, labels: Sequence[str] = (), *, registry: Any) -> Any:
    return Gauge(name, help_text, list(labels), registry=registry) if HAS_PROMETHEUS else NOOP


def histogram(name: str, help_text: str, labels: Sequence[str] = (), *, registry: Any,
              buckets: Sequence[float] = LATENCY_BUCKETS) -> Any:
    return Histogram(name, help_text, list(labels), buckets=tuple(buckets), registry=registry) if HAS_PROMETHEUS \
        else NOOP


def exposition(registry: Any) -> bytes:
    """The Prometheus text exposition of ``registry`` (prometheus_client's, served as :data:`CONTENT_TYPE`)."""
    return generate_latest(registry) if HAS_PROMETHEUS and registry is not None else MISSING


def sample(registry: Any, series: str, /, **labels: str) -> Optional[float]:
    """One sample's value (``gpu_aware_relists_total``, labels by name), None when absent: for tests and tools."""
    return registry.get_sample_value(series, labels) if HAS_PROMETHEUS and registry is not None else None


class Exposing(Protocol):  # pylint: disable=too-few-public-methods
    """What :class:`MetricsServer` serves: anything with ``exposition()``."""

    def exposition(self) -> bytes:
        ...


class RegistryExposition:  # pylint: disable=too-few-public-methods
    """A registry as :class:`Exposing` (the operator-controller's: the process's default registry)."""

    def __init__(self, registry: Any) -> None:
        self.registry = registry

    def exposition(self) -> bytes:
        return exposition(self.registry)


class MetricsServer:
    """HTTP on ``address:port``: ``/metrics`` and ``/healthz`` (200 when ``healthy()``), bounded (.httpserve)."""

    def __init__(self, metrics: Exposing, address: str, port: int,
                 healthy: Callable[[], Tuple[bool, str]], max_connections: int = MAX_CONNECTIONS,
                 request_timeout: float = REQUEST_TIMEOUT) -> None:
        self.metrics = metrics
        outer = self

        class Handler(BoundedHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server API)
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self.send_body(200, outer.metrics.exposition(), CONTENT_TYPE)
                elif path in ("/healthz", "/readyz"):
                    ok, why = healthy()
                    self.send_body(200 if ok else 503, (why + "\n").encode())
                else:
                    self.send_body(404, b"not found: try /metrics or /healthz\n", TEXT)

        self.httpd = BoundedHTTPServer((address, port), Handler, max_connections, request_timeout)
        self._thread: Optional[threading.Thread] = None

    @property
    def port(self) -> int:
        return self.httpd.port

    def start(self) -> None:
        self._thread = self.httpd.serve_in_thread("metrics-http")

    def stop(self) -> None:
        self.httpd.stop()
