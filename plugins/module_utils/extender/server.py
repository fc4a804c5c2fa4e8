# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The gpu-aware HTTP service: ``POST /filter``, ``POST /prioritize``,
``GET /healthz``, ``GET /readyz``, ``GET /metrics``.

Standard library only (``http.server``): one thread per connection, HTTP/1.1
keep-alive (kube-scheduler reuses connections), optional TLS, and a graceful
stop that lets requests in progress finish.

Any pod that can reach the Service can send it anything, so every resource a
client can hold is bounded (docs/security.md, threat model):

* connections: at most ``max_connections`` (one thread each); at the cap the
  connection idle the longest is closed for the new one, and when none is
  idle the new one is answered 503;
* time: a connection waits ``idle_timeout`` for a request; once its first
  byte arrives, the head and body must be in within ``request_timeout`` and
  no single read may wait longer than ``read_timeout`` (a client sending a
  byte a second is cut off);
* memory: a body is refused beyond ``max_body_bytes``; bodies are read as
  they arrive (never allocated at their declared length); the bodies held at
  once are bounded by two pools, one for large bodies (``max_body_bytes``)
  and one for small ones (the ``nodeCacheCapable: true`` form and small
  clusters), so a client holding large bodies cannot starve the small
  requests; large bodies are decided one at a time (their parse and answer
  take about 3.4 times the body).
"""

from __future__ import annotations

import io
import logging
import socket
import sys
import ssl
import threading
import time
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, Optional, Sequence, Tuple

from ..httpbounds import DeadlineReader, abort, refuse
from .metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from .metrics import ExtenderMetrics
from .service import ExtenderService
from .wire import error_result

DEFAULT_PORT = 8080
# The largest request kube-scheduler sends: ExtenderArgs with the full Nodes of a
# 5,000-node cluster (the Kubernetes scalability limit), each with our labels and
# annotations, Node Feature Discovery's labels and the kubelet's 50-image list
# (nodeStatusMaxImages), measured at 77.9 MB (15.6 KB a node; benchmarks/extender_limits.py).
# 128 MiB leaves 1.7 times that.
DEFAULT_MAX_BODY_BYTES = 128 * 1024 * 1024
# Bodies up to this size are "small" (a NodeNames request of 5,000 names is ~0.1 MB):
# they draw on their own pool and are decided concurrently.
SMALL_BODY_BYTES = 1024 * 1024
DEFAULT_SMALL_BODIES_BYTES = 32 * 1024 * 1024
# kube-scheduler holds one connection per extender while it schedules one pod at a
# time; probes and Prometheus add a few.
DEFAULT_MAX_CONNECTIONS = 64
# Longer than the 90 s after which kube-scheduler's Go transport drops an idle
# connection itself, so the client closes first and never sends on a connection
# the server is closing.
DEFAULT_IDLE_TIMEOUT = 120.0
# kube-scheduler gives an extender call 5 s (httpTimeout); a request whose head
# and body take six times that is not the scheduler.
DEFAULT_REQUEST_TIMEOUT = 30.0
DEFAULT_READ_TIMEOUT = 10.0
WRITE_TIMEOUT = 60.0
JSON = "application/json"


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
    timeout = DEFAULT_READ_TIMEOUT        # replaced read by read by DeadlineReader
    server: "ExtenderHTTPServer"

    def setup(self) -> None:
        if isinstance(self.request, ssl.SSLSocket):
            self.request.settimeout(10)
            self.request.do_handshake()
        super().setup()
        self.reserved = 0
        self.reader = DeadlineReader(self.connection, self.server)
        self.rfile = io.BufferedReader(self.reader, 65536)
        self.busy = False
        self.evicted = False
        self.idle_since = time.monotonic()
        self.server.register(self)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.unregister(self)

    def handle_one_request(self) -> None:
        self.reader.next_request()
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
        # The reads left the socket with what remained of the request deadline; an answer of
        # tens of MB to a slow reader gets its own (sendall's timeout covers the whole call).
        self.connection.settimeout(WRITE_TIMEOUT)
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

    def _read_body(self) -> Optional[bytearray]:
        """The request body, or None after answering an error (or when the client is gone).

        The body is read as it arrives: a client that declares 100 MB and sends
        1 costs 1, not 100. What it declares is reserved from a pool first
        (:meth:`ExtenderHTTPServer.reserve`); the caller gives it back.
        """
        self.reserved = 0
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
        if not self._reserve(length):
            return None
        return self._read_exactly(length)

    def _reserve(self, amount: int) -> bool:
        if self.server.reserve(amount, large=self.reserved + amount > SMALL_BODY_BYTES):
            self.reserved += amount
            return True
        self.close_connection = True
        self._send(503, [error_result("gpu-aware holds as many request bodies as it may (%d bytes); try again"
                                      % self.server.max_body_bytes)])
        return False

    def _read_exactly(self, length: int, into: Optional[bytearray] = None) -> Optional[bytearray]:
        body = bytearray() if into is None else into
        end = len(body) + length
        while len(body) < end:
            piece = self.rfile.read1(min(end - len(body), 1 << 20))
            if not piece:
                self.close_connection = True
                return None
            body += piece
        return body

    def _read_chunked(self, limit: int) -> Optional[bytearray]:
        body = bytearray()
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
                return body
            if len(body) + chunk > limit:
                self.close_connection = True
                self._send(413, [error_result("request body exceeds the limit of %d bytes (--max-body-bytes)"
                                              % limit)])
                return None
            if self.reserved > SMALL_BODY_BYTES or self.reserved + chunk <= SMALL_BODY_BYTES:
                if not self._reserve(chunk):
                    return None
            else:
                # grown out of the small pool: move to the large one
                self.server.release(self.reserved, large=False)
                self.reserved, held = 0, self.reserved
                if not self._reserve(held + chunk):
                    return None
            if self._read_exactly(chunk, body) is None:
                return None
            self.rfile.readline(3)

    def do_POST(self) -> None:  # noqa: N802 (http.server naming)
        path = self.path.split("?", 1)[0].rstrip("/")
        verb = path.rsplit("/", 1)[-1]
        service = self.server.service
        if verb not in ("filter", "prioritize"):
            self.close_connection = True
            self._send(404, [error_result("unknown verb %r: POST /filter or /prioritize" % self.path)])
            return
        started = time.perf_counter()
        try:
            body = self._read_body()
            if body is None:
                self.server.metrics.requests.labels(verb, "rejected").inc()
                return
            # A large body's parse and answer take about 3.4 times its size: one at a time.
            with self.server.deciding(len(body) > SMALL_BODY_BYTES):
                try:
                    code, chunks = service.filter(body) if verb == "filter" else service.prioritize(body)
                except Exception as exc:  # pylint: disable=broad-except
                    self.server.log.exception("%s failed", verb)
                    code, chunks = 500, [error_result("gpu-aware internal error: %s" % exc)]
                del body
        finally:
            self.server.release(self.reserved, large=self.reserved > SMALL_BODY_BYTES)
            self.reserved = 0
        if code == 400:
            self.server.log.warning("%s: bad request: %s", verb, chunks[0][:300].decode("utf-8", "replace"))
        # Recorded before the answer leaves, so a client that has the answer also sees it counted.
        self.server.metrics.requests.labels(verb, str(code)).inc()
        self.server.metrics.duration.labels(verb).observe(time.perf_counter() - started)
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
            self._send(200, [self.server.metrics.exposition()], METRICS_CONTENT_TYPE)
        else:
            self._send(404, [b"not found\n"], "text/plain; charset=utf-8")

    do_HEAD = do_GET


class ExtenderHTTPServer(ThreadingHTTPServer):
    """ThreadingHTTPServer that bounds what clients hold and knows its connections, for a graceful stop."""

    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: Tuple[str, int], service: ExtenderService, metrics: ExtenderMetrics,
                 logger: logging.Logger, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 ssl_context: Optional[ssl.SSLContext] = None, max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 idle_timeout: float = DEFAULT_IDLE_TIMEOUT, request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
                 read_timeout: float = DEFAULT_READ_TIMEOUT,
                 small_bodies_bytes: int = DEFAULT_SMALL_BODIES_BYTES) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)
        if ssl_context is not None:
            self.socket = ssl_context.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)
        self.service = service
        self.metrics = metrics
        self.log = logger
        self.max_body_bytes = max_body_bytes
        self.max_connections = max_connections
        self.idle_timeout = idle_timeout
        self.request_timeout = request_timeout
        self.read_timeout = read_timeout
        self.stopping = False
        self._lock = threading.Condition()
        self._handlers: Dict[int, _Handler] = {}
        self._connections = 0
        # the accepted sockets within the count: id -> (socket, when accepted)
        self._counted: Dict[int, Tuple[Any, float]] = {}
        # bytes of request bodies reserved, per pool: (large, small) -> (used, capacity)
        self._pools = {True: [0, max_body_bytes], False: [0, small_bodies_bytes]}
        self._deciding_large = threading.Lock()
        self._refused = 0

    # ----------------------------------------------------------- the bounds
    def process_request(self, request: Any, client_address: Any) -> None:
        """Start a connection's thread, within ``max_connections`` (runs in the accepting thread)."""
        with self._lock:
            if self._connections >= self.max_connections and not self._evict_idle():
                self._refuse(request, client_address)
                return
            self._connections += 1
            self._counted[id(request)] = (request, time.monotonic())
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._count_out(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._count_out(request)

    def _count_out(self, request: Any) -> None:
        with self._lock:
            if self._counted.get(id(request), (None, 0.0))[0] is request:
                del self._counted[id(request)]
                self._connections -= 1

    def _evict_idle(self) -> bool:
        """Close the connection idle the longest (it waits for a request; its client reconnects). Lock held.

        A connection whose thread has not started yet counts as idle since it was accepted: a burst of
        connections must not find the cap full of threads still starting.
        """
        handlers = {id(h.request): h for h in self._handlers.values()}
        best: Optional[Tuple[float, int]] = None
        for key, (_sock, accepted) in self._counted.items():
            handler = handlers.get(key)
            if handler is None:
                since = accepted
            elif handler.busy or handler.evicted:
                continue
            else:
                since = handler.idle_since
            if best is None or since < best[0]:
                best = (since, key)
        if best is None:
            return False
        sock, _accepted = self._counted.pop(best[1])
        self._connections -= 1          # its read returns at once: counted out now, not when its thread ends
        victim = handlers.get(best[1])
        if victim is not None:
            victim.evicted = True
            victim.close_connection = True
        abort(sock)
        return True

    def _refuse(self, request: Any, client_address: Any) -> None:
        self._refused += 1
        if self._refused in (1, 10, 100) or self._refused % 1000 == 0:
            self.log.warning("%d connections refused: all %d are in a request (--max-connections); latest from %s",
                             self._refused, self.max_connections, client_address)
        refuse(request)

    def reserve(self, amount: int, large: bool) -> bool:
        """Take ``amount`` bytes of body from the large or the small pool; False when it is full."""
        with self._lock:
            pool = self._pools[large]
            if pool[0] + amount > pool[1]:
                return False
            pool[0] += amount
            return True

    def release(self, amount: int, large: bool) -> None:
        if amount:
            with self._lock:
                self._pools[large][0] -= amount

    def deciding(self, large: bool) -> Any:
        return self._deciding_large if large else _NO_LOCK

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
            if not busy:
                handler.idle_since = time.monotonic()

    @property
    def connections(self) -> int:
        """Connections within the cap (each has, or is about to have, a thread)."""
        with self._lock:
            return self._connections

    @property
    def busy_connections(self) -> int:
        """Connections in a request (their head is being read, or later)."""
        with self._lock:
            return sum(1 for handler in self._handlers.values() if handler.busy)

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
                    abort(handler.connection)
            while self._handlers and time.monotonic() < deadline:
                self._lock.wait(max(0.01, min(0.5, deadline - time.monotonic())))
                for handler in self._handlers.values():
                    if not handler.busy:
                        abort(handler.connection)
            clean = not self._handlers
        self.server_close()
        return clean


class _NoLock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


_NO_LOCK = _NoLock()


def tls_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    return context
