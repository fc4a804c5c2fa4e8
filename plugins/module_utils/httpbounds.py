# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Bounds on what an HTTP client can hold in our ``http.server`` services.

Shared by gpu-aware's extender server and the ``/metrics`` servers of
gpu-device and gpu-exporter (docs/security.md, threat model). Standard
library only, Python 3.8.
"""

from __future__ import annotations

import io
import socket
import time
from typing import Any, Optional, Protocol

REFUSED = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class Timeouts(Protocol):  # pylint: disable=too-few-public-methods
    """Where :class:`DeadlineReader` reads its timeouts (the server: they may be set after it starts)."""

    idle_timeout: float       # a connection waiting for (the first byte of) a request
    request_timeout: float    # from a request's first byte to its last
    read_timeout: float       # one read within a request


class DeadlineReader(io.RawIOBase):
    """A connection's bytes, with the request deadline on every read.

    A socket timeout bounds one read only: a client sending a byte at a time
    renews it forever. Before a request starts a read waits up to the idle
    timeout; the first byte of a request starts its deadline, and each later
    read waits at most what is left of it (never more than the read timeout).
    Call :meth:`next_request` before reading the next request of a keep-alive
    connection. Wrap it in ``io.BufferedReader`` for ``rfile``.
    """

    def __init__(self, sock: socket.socket, timeouts: Timeouts) -> None:
        super().__init__()
        self._sock = sock
        self._timeouts = timeouts
        self.deadline: Optional[float] = None

    def readable(self) -> bool:
        return True

    def next_request(self) -> None:
        self.deadline = None

    def readinto(self, buffer: Any) -> int:
        if self.deadline is None:
            timeout = self._timeouts.idle_timeout
        else:
            timeout = min(self._timeouts.read_timeout, self.deadline - time.monotonic())
            if timeout <= 0:
                raise socket.timeout("request not received within %ss" % self._timeouts.request_timeout)
        self._sock.settimeout(timeout)
        count = self._sock.recv_into(buffer)
        if self.deadline is None and count:
            self.deadline = time.monotonic() + self._timeouts.request_timeout
        return count


def abort(sock: Any) -> None:
    """End a connection another thread is reading (its read returns at once)."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def refuse(sock: Any) -> None:
    """Answer 503 on a connection not yet read, without waiting on the client, and close it."""
    try:
        sock.setblocking(False)
        sock.send(REFUSED)
    except (OSError, ValueError):
        pass
    try:
        sock.close()
    except OSError:
        pass
