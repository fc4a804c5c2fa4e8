# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Prometheus metrics of gpu-device and its HTTP endpoint (/metrics, /healthz).

Metric names (all gauges are per node; see docs/agents.md):

``metax_gpu_devices``                     devices advertised to the kubelet
``metax_gpu_devices_healthy``             of which Healthy
``metax_gpu_devices_allocated``           of which assigned to containers (pod-resources API)
``metax_gpu_device_healthy{device}``      1 Healthy / 0 Unhealthy, per device ID
``metax_gpu_allocation_duration_seconds{rpc}``  histogram of Allocate / GetPreferredAllocation
``metax_gpu_allocation_errors_total{rpc}``      requests answered with an error
``metax_gpu_registrations_total``         successful registrations with the kubelet
``metax_gpu_annotation_patches_total{result}``  node annotation patches (ok / error)
``metax_gpu_discovery_warnings``          warnings of the latest device scan
``metax_gpu_mx_smi_unparsed``             of which about mx-smi output not understood
                                          (discovery fell back to PCI/sysfs for it)

Without prometheus_client the metrics are no-ops and the endpoint serves
only /healthz.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterable, Optional, Protocol, Set, Tuple

try:
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
    from prometheus_client.exposition import CONTENT_TYPE_LATEST
    HAS_PROMETHEUS = True
except ImportError:
    CollectorRegistry = Counter = Gauge = Histogram = generate_latest = None  # type: ignore[assignment,misc]
    CONTENT_TYPE_LATEST = "text/plain; version=0.0.4; charset=utf-8"
    HAS_PROMETHEUS = False

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class _Noop:
    def labels(self, *args, **kwargs):  # pylint: disable=unused-argument
        return self

    def set(self, value):  # pylint: disable=unused-argument
        return None

    def inc(self, amount=1):  # pylint: disable=unused-argument
        return None

    def observe(self, value):  # pylint: disable=unused-argument
        return None

    def remove(self, *args):  # pylint: disable=unused-argument
        return None


class DevicePluginMetrics:
    """The metrics of one gpu-device instance (its own registry)."""

    # prometheus_client metrics, or _Noop stand-ins when it is not installed
    devices: Any
    healthy: Any
    allocated: Any
    device_healthy: Any
    latency: Any
    errors: Any
    registrations: Any
    patches: Any
    discovery_warnings: Any
    mx_smi_unparsed: Any
    registry: Any

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._device_ids: Set[str] = set()
        if not HAS_PROMETHEUS:
            self.registry = None
            noop = _Noop()
            self.devices = self.healthy = self.allocated = self.device_healthy = noop
            self.latency = self.errors = self.registrations = self.patches = noop
            self.discovery_warnings = self.mx_smi_unparsed = noop
            return
        self.registry = CollectorRegistry(auto_describe=True)
        reg = self.registry
        self.devices = Gauge("metax_gpu_devices", "MetaX GPU devices advertised to the kubelet",
                             registry=reg)
        self.healthy = Gauge("metax_gpu_devices_healthy", "Advertised devices that are Healthy", registry=reg)
        self.allocated = Gauge("metax_gpu_devices_allocated",
                               "Devices assigned to containers (kubelet pod-resources API)", registry=reg)
        self.device_healthy = Gauge("metax_gpu_device_healthy", "1 when the device is Healthy, else 0",
                                    ["device"], registry=reg)
        self.latency = Histogram("metax_gpu_allocation_duration_seconds",
                                 "Time to answer Allocate and GetPreferredAllocation", ["rpc"],
                                 buckets=LATENCY_BUCKETS, registry=reg)
        self.errors = Counter("metax_gpu_allocation_errors", "Allocation requests answered with an error",
                              ["rpc"], registry=reg)
        self.registrations = Counter("metax_gpu_registrations", "Successful registrations with the kubelet",
                                     registry=reg)
        self.patches = Counter("metax_gpu_annotation_patches", "Node annotation patches", ["result"],
                               registry=reg)
        self.discovery_warnings = Gauge("metax_gpu_discovery_warnings",
                                        "Warnings of the latest device scan", registry=reg)
        self.mx_smi_unparsed = Gauge("metax_gpu_mx_smi_unparsed",
                                     "Warnings of the latest device scan about mx-smi output that was not "
                                     "understood (discovery fell back to PCI/sysfs)", registry=reg)

    def set_devices(self, devices: Iterable[Tuple[str, bool]]) -> None:
        """``devices``: (id, healthy) of every advertised device."""
        items = list(devices)
        with self._lock:
            self.devices.set(len(items))
            self.healthy.set(sum(1 for _id, ok in items if ok))
            ids = set()
            for dev_id, ok in items:
                self.device_healthy.labels(dev_id).set(1 if ok else 0)
                ids.add(dev_id)
            for gone in self._device_ids - ids:
                try:
                    self.device_healthy.remove(gone)
                except KeyError:
                    pass
            self._device_ids = ids

    def exposition(self) -> bytes:
        if self.registry is None:
            return b"# prometheus_client is not installed\n"
        return generate_latest(self.registry)


class Exposing(Protocol):  # pylint: disable=too-few-public-methods
    """What :class:`MetricsServer` serves: anything with ``exposition()`` (gpu-device, gpu-exporter)."""

    def exposition(self) -> bytes:
        ...


class MetricsServer:
    """HTTP on ``address:port``: ``/metrics`` and ``/healthz`` (200 when ``healthy()``)."""

    def __init__(self, metrics: Exposing, address: str, port: int,
                 healthy: Callable[[], Tuple[bool, str]]) -> None:
        self.metrics = metrics
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server API)
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._send(200, outer.metrics.exposition(), CONTENT_TYPE_LATEST)
                elif path in ("/healthz", "/readyz"):
                    ok, why = healthy()
                    self._send(200 if ok else 503, (why + "\n").encode(), "text/plain; charset=utf-8")
                else:
                    self._send(404, b"not found: try /metrics or /healthz\n", "text/plain; charset=utf-8")

            def _send(self, code: int, body: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format, *args):  # pylint: disable=redefined-builtin
                return None

        self.httpd = ThreadingHTTPServer((address, port), Handler)
        self.httpd.daemon_threads = True
        self._thread: Optional[threading.Thread] = None

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    def start(self) -> None:
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="metrics-http", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
