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

The endpoint is reachable by every pod that can reach the pod IP, so a client
holds little: a connection must send its request within ``REQUEST_TIMEOUT``
of connecting (a client sending a byte at a time is cut off), each answer
closes its connection, and at most ``MAX_CONNECTIONS`` are served at once, one
thread each; beyond that the connection open the longest is closed for the
new one (a scrape or a probe takes milliseconds; one held open is not a scrape).
It listens on all addresses of the pod's own network namespace (the charts run
it without hostNetwork): the pod IP(s) and loopback, which Prometheus, the
kubelet's probes and ``kubectl port-forward`` use (docs/security.md).
"""

from __future__ import annotations

import io
import socket
import sys
import threading
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterable, Optional, Protocol, Set, Tuple

from ..httpbounds import DeadlineReader, abort

try:
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
    from prometheus_client.exposition import CONTENT_TYPE_LATEST
    HAS_PROMETHEUS = True
except ImportError:
    CollectorRegistry = Counter = Gauge = Histogram = generate_latest = None  # type: ignore[assignment,misc]
    CONTENT_TYPE_LATEST = "text/plain; version=0.0.4; charset=utf-8"
    HAS_PROMETHEUS = False

# Prometheus (one or two replicas), the kubelet's liveness and readiness probes
# and a person with curl; more at once is not a scrape.
MAX_CONNECTIONS = 16
REQUEST_TIMEOUT = 10.0     # from connecting to the end of the request head (GET has no body)
WRITE_TIMEOUT = 30.0       # the whole answer (sendall's timeout covers the call)

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


class BoundedHTTPServer(ThreadingHTTPServer):
    """ThreadingHTTPServer with at most ``max_connections`` threads; at the cap the oldest connection goes."""

    daemon_threads = True
    block_on_close = False

    def __init__(self, address: Tuple[str, int], handler: Any, max_connections: int = MAX_CONNECTIONS,
                 request_timeout: float = REQUEST_TIMEOUT) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, handler)
        self.max_connections = max_connections
        # DeadlineReader's timeouts: the request must arrive within request_timeout of connecting
        self.idle_timeout = self.request_timeout = self.read_timeout = request_timeout
        self._lock = threading.Lock()
        self._open: "OrderedDict[int, Any]" = OrderedDict()     # id(socket) -> socket, oldest first
        self.evicted = 0

    @property
    def connections(self) -> int:
        with self._lock:
            return len(self._open)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._lock:
            while len(self._open) >= self.max_connections:
                _key, oldest = self._open.popitem(last=False)
                abort(oldest)
                self.evicted += 1
            self._open[id(request)] = request
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._forget(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._forget(request)

    def _forget(self, request: Any) -> None:
        with self._lock:
            if self._open.get(id(request)) is request:
                del self._open[id(request)]

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that is cut off, times out or goes away is routine, not a traceback on stderr."""
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)


class _BoundedHandler(BaseHTTPRequestHandler):
    """One request per connection (HTTP/1.0), read within the server's deadline."""

    server: BoundedHTTPServer
    timeout = REQUEST_TIMEOUT

    def setup(self) -> None:
        super().setup()
        self.rfile = io.BufferedReader(DeadlineReader(self.connection, self.server), 8192)


class MetricsServer:
    """HTTP on ``address:port``: ``/metrics`` and ``/healthz`` (200 when ``healthy()``)."""

    def __init__(self, metrics: Exposing, address: str, port: int,
                 healthy: Callable[[], Tuple[bool, str]], max_connections: int = MAX_CONNECTIONS,
                 request_timeout: float = REQUEST_TIMEOUT) -> None:
        self.metrics = metrics
        outer = self

        class Handler(_BoundedHandler):
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
                self.send_header("Connection", "close")
                self.end_headers()
                self.connection.settimeout(WRITE_TIMEOUT)
                self.wfile.write(body)

            def log_message(self, format, *args):  # pylint: disable=redefined-builtin
                return None

        self.httpd = BoundedHTTPServer((address, port), Handler, max_connections, request_timeout)
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
