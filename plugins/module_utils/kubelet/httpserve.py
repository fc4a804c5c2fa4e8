# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The bounded HTTP server of the agents' small endpoints: ``/metrics``, ``/healthz``, the eviction guard.

These endpoints are reachable by every pod that can reach the pod IP, so a
client holds little (docs/security.md, threat model): a connection must send
its request within ``REQUEST_TIMEOUT`` of connecting (a client sending a byte
at a time is cut off), each answer closes its connection and must leave
within ``WRITE_TIMEOUT``, and at most ``MAX_CONNECTIONS`` are served at once,
one thread each; beyond that the connection open the longest is closed for
the new one (a scrape or a probe takes milliseconds; one held open is not a
scrape). An IPv6 address listens on IPv6. Standard library only, Python 3.8.

gpu-aware's scheduler-facing server (``extender/server.py``) has bounds of its
own (keep-alive, request bodies, pools) over the same :mod:`..httpbounds`.
"""

from __future__ import annotations

import io
import socket
import sys
import threading
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Tuple

from ..httpbounds import DeadlineReader, abort

# Prometheus (one or two replicas), the kubelet's liveness and readiness probes
# and a person with curl; more at once is not a scrape.
MAX_CONNECTIONS = 16
REQUEST_TIMEOUT = 10.0     # from connecting to the end of the request head (GET has no body)
WRITE_TIMEOUT = 30.0       # the whole answer (sendall's timeout covers the call)
TEXT = "text/plain; charset=utf-8"


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

    @property
    def port(self) -> int:
        return int(self.server_address[1])

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

    def serve_in_thread(self, name: str) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, name=name, daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class BoundedHandler(BaseHTTPRequestHandler):
    """One request per connection (HTTP/1.0), read within the server's deadline; quiet (no access log)."""

    server: BoundedHTTPServer
    timeout = REQUEST_TIMEOUT

    def setup(self) -> None:
        super().setup()
        self.rfile = io.BufferedReader(DeadlineReader(self.connection, self.server), 8192)

    def send_body(self, code: int, body: bytes, content_type: str = TEXT) -> None:
        """The whole answer, then the connection closes; a slow reader gets ``WRITE_TIMEOUT`` for all of it."""
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.connection.settimeout(WRITE_TIMEOUT)
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # pylint: disable=redefined-builtin
        return None
