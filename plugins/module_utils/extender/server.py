# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The gpu-aware HTTP service: ``POST /filter``, ``POST /prioritize``,
``GET /healthz``, ``GET /readyz``, ``GET /metrics``.

Standard library only (``http.server``): one thread per connection, HTTP/1.1
keep-alive (kube-scheduler reuses connections), optional TLS, a request body
limit, and a graceful stop that lets requests in progress finish.
"""

from __future__ import annotations

import logging
import socket
import sys
import ssl
import threading
import time
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import compress
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .cache import NodeCache, WeightsHolder
from .demand import PodSpecError, pod_demand
from .metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from .metrics import ExtenderMetrics
from .nodeinfo import GpuState, StateCache, metadata_field, node_fields
from .policy import filter_nodes, filter_outcome, prioritize, scores_from_tables
from .wire import (
    BadRequest, ParsedArgs, error_result, filter_result_names, filter_result_nodes, parse_args,
    priority_list)

DEFAULT_PORT = 8080
# A full NodeList of 5,000 real nodes runs to tens of MB (a node with labels,
# annotations, conditions and its image list is 5-20 KB); leave room.
DEFAULT_MAX_BODY_BYTES = 256 * 1024 * 1024
JSON = "application/json"
Response = Tuple[int, List[bytes]]


class ExtenderService:
    """filter / prioritize from request bytes to (status, body chunks). Thread-safe."""

    def __init__(self, weights: WeightsHolder, metrics: ExtenderMetrics, logger: logging.Logger,
                 nodes: Optional[NodeCache] = None, states: Optional[StateCache] = None) -> None:
        self.weights = weights
        self.metrics = metrics
        self.log = logger
        self.nodes = nodes
        self.states = states or StateCache()
        self._reported: Dict[Tuple[str, ...], bool] = {}
        self._last_demand: Tuple[Optional[Dict[str, Any]], int] = (None, 0)

    # ------------------------------------------------------------- helpers
    def _extract(self, node: Dict[str, Any]) -> GpuState:
        state = self.states.state(node_fields(node))
        if state.problems and state.problems not in self._reported:
            self._reported[state.problems] = True
            self.metrics.annotation_errors.inc()
            self.log.warning("node %s: unusable annotation (%s)", metadata_field(node, "name"),
                             "; ".join(state.problems))
        return state

    def ready(self) -> bool:
        return self.nodes is None or self.nodes.synced.is_set()

    def _parse(self, body: bytes) -> Tuple[ParsedArgs, int]:
        args = parse_args(body, self._extract)
        # parse_args hands prioritize the very Pod object filter decoded (wire.POD_MEMO): its demand
        # is known then. The tuple is read once, so a concurrent request never pairs a Pod with
        # another's demand; holding the Pod keeps its id from being reused.
        pod, demand = self._last_demand
        if pod is args.pod:
            return args, demand
        try:
            demand = pod_demand(args.pod)
        except PodSpecError as exc:
            raise BadRequest(str(exc)) from None
        self._last_demand = (args.pod, demand)
        return args, demand

    def _cache(self) -> NodeCache:
        """The node cache for a NodeNames request, or :class:`_CacheUnavailable`."""
        if self.nodes is None:
            raise _CacheUnavailable("gpu-aware runs without a node cache (--no-node-cache); "
                                    "set nodeCacheCapable: false in the scheduler's extender configuration")
        if not self.nodes.synced.is_set():
            raise _CacheUnavailable("gpu-aware's node cache has not synced with the API server yet")
        return self.nodes

    @staticmethod
    def _pod_ref(args: ParsedArgs) -> str:
        return "%s/%s" % (metadata_field(args.pod, "namespace") or "", metadata_field(args.pod, "name") or "")

    # --------------------------------------------------------------- verbs
    def filter(self, body: bytes) -> Response:
        try:
            args, demand = self._parse(body)
        except BadRequest as exc:
            return 400, [error_result(str(exc))]
        names = args.names
        if args.node_names_form:
            try:
                cache = self._cache()
            except _CacheUnavailable as exc:
                return 200, [error_result(str(exc))]
            fits = cache.fits(names, demand)
            outcome = filter_outcome(demand, names, fits, cache.state_of)
        else:
            outcome = filter_nodes(demand, names, args.extracted)
        self.metrics.nodes.inc("passed", amount=len(outcome.passed))
        if outcome.failed:
            self.metrics.nodes.inc("failed", amount=len(outcome.failed))
        if outcome.unresolvable:
            self.metrics.nodes.inc("unresolvable", amount=len(outcome.unresolvable))
        if self.log.isEnabledFor(logging.DEBUG):
            self.log.debug("filter %s: demand %d, %d nodes, %d pass, %d fail, %d unresolvable", self._pod_ref(args),
                           demand, len(names), len(outcome.passed), len(outcome.failed),
                           len(outcome.unresolvable))
        if args.node_names_form:
            return 200, [filter_result_names(list(compress(names, fits)), outcome.failed, outcome.unresolvable,
                                             args.plain_names)]
        return 200, filter_result_nodes(args, outcome.passed, outcome.failed, outcome.unresolvable)

    def prioritize(self, body: bytes) -> Response:
        try:
            args, demand = self._parse(body)
        except BadRequest as exc:
            return 400, [error_result(str(exc))]
        weights = self.weights.current
        if args.node_names_form:
            try:
                cache = self._cache()
            except _CacheUnavailable as exc:
                return 503, [error_result(str(exc))]
            if demand <= 0:
                scores = prioritize(demand, [None] * len(args.names), weights)
            else:
                scores = scores_from_tables(cache.tables(args.names, demand), weights)
        else:
            scores = prioritize(demand, args.extracted, weights)
        if self.log.isEnabledFor(logging.DEBUG):
            best = sorted(zip(scores, args.names), reverse=True)[:5]
            self.log.debug("prioritize %s: demand %d, weights %s/%s, top %s", self._pod_ref(args), demand,
                           weights.score, weights.loss, best)
        return 200, [priority_list(args.names, scores, args.plain_names)]


class _CacheUnavailable(Exception):
    pass


# ------------------------------------------------------------------- HTTP

_HEAD = "HTTP/1.1 %d %s\r\nServer: %s\r\nDate: %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s\r\n"
_DATE = (0, "")      # (second, its HTTP date): formatted once a second, not once a request


def _http_date() -> str:
    global _DATE  # pylint: disable=global-statement
    now = int(time.time())
    second, text = _DATE       # one read of one tuple: threads never see a half-updated pair
    if second != now:
        text = formatdate(now, usegmt=True)
        _DATE = (now, text)
    return text


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "gpu-aware"
    disable_nagle_algorithm = True
    timeout = 300          # idle keep-alive connections are dropped after this
    server: "ExtenderHTTPServer"

    def setup(self) -> None:
        if isinstance(self.request, ssl.SSLSocket):
            self.request.settimeout(10)
            self.request.do_handshake()
        super().setup()
        self.busy = False
        self.server.register(self)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.unregister(self)

    def handle_one_request(self) -> None:
        self.server.set_busy(self, False)
        if self.server.stopping:
            self.close_connection = True
            return
        super().handle_one_request()

    def parse_request(self) -> bool:
        self.server.set_busy(self, True)
        ok = super().parse_request()
        if self.server.stopping:
            self.close_connection = True
        return ok

    def log_message(self, format: str, *args: Any) -> None:  # pylint: disable=redefined-builtin
        if self.server.log.isEnabledFor(logging.DEBUG):
            self.server.log.debug("%s %s", self.address_string(), format % args)

    def version_string(self) -> str:
        return self.server_version

    def _send(self, code: int, chunks: Sequence[bytes], content_type: str = JSON) -> None:
        if self.server.stopping:
            self.close_connection = True
        if self.server.log.isEnabledFor(logging.DEBUG):
            self.log_request(code)
        # The head send_response and send_header would build, in one format and with the Date of the
        # second: they encode header by header and format a fresh Date each time (docs/scale.md).
        head = (_HEAD % (code, self.responses[code][0] if code in self.responses else "", self.server_version,
                         _http_date(), content_type, sum(len(c) for c in chunks),
                         "Connection: close\r\n" if self.close_connection else "")).encode("latin-1", "strict")
        # Headers and a small body leave in one segment (no Nagle / delayed-ACK stall).
        if self.command == "HEAD":
            self.wfile.write(head)
            return
        chunks = [c for c in chunks if c]
        if chunks and len(chunks[0]) <= 65536:
            head += chunks.pop(0)
        self.wfile.write(head)
        for chunk in chunks:
            self.wfile.write(chunk)

    def _read_body(self) -> Optional[bytes]:
        """The request body, or None after answering an error."""
        limit = self.server.max_body_bytes
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return self._read_chunked(limit)
        length_text = self.headers.get("Content-Length")
        if length_text is None:
            self.close_connection = True
            self._send(411, [error_result("Content-Length required")])
            return None
        try:
            length = int(length_text)
            if length < 0:
                raise ValueError(length_text)
        except ValueError:
            self.close_connection = True
            self._send(400, [error_result("bad Content-Length %r" % length_text)])
            return None
        if length > limit:
            self.close_connection = True
            self._send(413, [error_result("request body of %d bytes exceeds the limit of %d (--max-body-bytes)"
                                          % (length, limit))])
            return None
        body = self.rfile.read(length)
        if len(body) != length:
            self.close_connection = True
            return None
        return body

    def _read_chunked(self, limit: int) -> Optional[bytes]:
        parts: List[bytes] = []
        size = 0
        while True:
            line = self.rfile.readline(1024)
            try:
                chunk = int(line.split(b";")[0].strip(), 16)
            except ValueError:
                self.close_connection = True
                self._send(400, [error_result("bad chunked encoding")])
                return None
            if chunk == 0:
                while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(parts)
            size += chunk
            if size > limit:
                self.close_connection = True
                self._send(413, [error_result("request body exceeds the limit of %d bytes (--max-body-bytes)"
                                              % limit)])
                return None
            data = self.rfile.read(chunk)
            self.rfile.readline(3)
            if len(data) != chunk:
                self.close_connection = True
                return None
            parts.append(data)

    def do_POST(self) -> None:  # noqa: N802 (http.server naming)
        path = self.path.split("?", 1)[0].rstrip("/")
        verb = path.rsplit("/", 1)[-1]
        service = self.server.service
        if verb not in ("filter", "prioritize"):
            self.close_connection = True
            self._send(404, [error_result("unknown verb %r: POST /filter or /prioritize" % self.path)])
            return
        started = time.perf_counter()
        body = self._read_body()
        if body is None:
            self.server.metrics.requests.inc(verb, "rejected")
            return
        try:
            code, chunks = service.filter(body) if verb == "filter" else service.prioritize(body)
        except Exception as exc:  # pylint: disable=broad-except
            self.server.log.exception("%s failed", verb)
            code, chunks = 500, [error_result("gpu-aware internal error: %s" % exc)]
        del body
        if code == 400:
            self.server.log.warning("%s: bad request: %s", verb, chunks[0][:300].decode("utf-8", "replace"))
        # Recorded before the answer leaves, so a client that has the answer also sees it counted.
        self.server.metrics.requests.inc(verb, str(code))
        self.server.metrics.duration.observe(verb, value=time.perf_counter() - started)
        self._send(code, chunks)

    def do_GET(self) -> None:  # noqa: N802
        path = self.path.split("?", 1)[0]
        if path == "/healthz":
            self._send(200, [b"ok\n"], "text/plain; charset=utf-8")
        elif path == "/readyz":
            ready = self.server.service.ready()
            self._send(200 if ready else 503, [b"ok\n" if ready else b"node cache not synced\n"],
                       "text/plain; charset=utf-8")
        elif path == "/metrics":
            self._send(200, [self.server.metrics.registry.render()], METRICS_CONTENT_TYPE)
        else:
            self._send(404, [b"not found\n"], "text/plain; charset=utf-8")

    do_HEAD = do_GET


class ExtenderHTTPServer(ThreadingHTTPServer):
    """ThreadingHTTPServer that knows its connections, for a graceful stop."""

    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: Tuple[str, int], service: ExtenderService, metrics: ExtenderMetrics,
                 logger: logging.Logger, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 ssl_context: Optional[ssl.SSLContext] = None) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)
        if ssl_context is not None:
            self.socket = ssl_context.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)
        self.service = service
        self.metrics = metrics
        self.log = logger
        self.max_body_bytes = max_body_bytes
        self.stopping = False
        self._lock = threading.Condition()
        self._handlers: Dict[int, _Handler] = {}

    @property
    def port(self) -> int:
        return self.server_address[1]

    def register(self, handler: _Handler) -> None:
        with self._lock:
            self._handlers[id(handler)] = handler

    def unregister(self, handler: _Handler) -> None:
        with self._lock:
            self._handlers.pop(id(handler), None)
            self._lock.notify_all()

    def set_busy(self, handler: _Handler, busy: bool) -> None:
        with self._lock:
            handler.busy = busy

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that breaks (client gone, timeout, TLS garbage) is routine, not a traceback."""
        exc = sys.exc_info()[1]
        if isinstance(exc, (OSError, ssl.SSLError)):
            self.log.debug("connection from %s ended: %s", client_address, exc)
        else:
            self.log.error("request from %s failed", client_address, exc_info=True)

    def graceful_stop(self, timeout: float = 10.0) -> bool:
        """Stop accepting, close idle connections, let requests in progress finish (up to ``timeout``)."""
        self.shutdown()
        deadline = time.monotonic() + timeout
        with self._lock:
            self.stopping = True
            for handler in self._handlers.values():
                if not handler.busy:
                    _abort(handler.connection)
            while self._handlers and time.monotonic() < deadline:
                self._lock.wait(max(0.01, min(0.5, deadline - time.monotonic())))
                for handler in self._handlers.values():
                    if not handler.busy:
                        _abort(handler.connection)
            clean = not self._handlers
        self.server_close()
        return clean


def _abort(sock: Any) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def tls_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    return context
