# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The agents' /metrics server (kubelet/metrics.py) against hostile clients (issue 39, finding 6).

Real sockets on 127.0.0.1 against the real servers: :class:`MetricsServer` as
gpu-device and gpu-exporter start it, and the operator-controller's /metrics
(``serve_metrics``, which replaced prometheus_client's unbounded
``start_http_server``) and /healthz (``Health.serve``), both on
kubelet/httpserve.py. Deadlines are functional, not latency targets.
"""
from __future__ import annotations

import http.client
import json
import socket
import threading
import time

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.agents import operator_controller as oc
from ansible_collections.metax.gpu.plugins.module_utils.kube.leader import LeaderElector
from ansible_collections.metax.gpu.plugins.module_utils.kubelet.httpserve import MAX_CONNECTIONS
from ansible_collections.metax.gpu.plugins.module_utils.kubelet.metrics import HAS_PROMETHEUS, MetricsServer

EXPOSITION = b"# HELP metax_test_up a test\n# TYPE metax_test_up gauge\nmetax_test_up 1\n"
STANDBY = {"leader": False, "identity": "pod-a"}


class _Metrics:
    def exposition(self) -> bytes:
        return EXPOSITION


class Served:
    """One of the servers under test: its port, its BoundedHTTPServer, the answer a good client gets."""

    def __init__(self, kind, **bounds):
        self.kind = kind
        self.path = "/metrics"
        if kind == "metrics-server":
            self.handle = MetricsServer(_Metrics(), "127.0.0.1", 0, lambda: (True, "ok"), **bounds)
            self.httpd = self.handle.httpd
            self.handle.start()
            return
        health = oc.Health(LeaderElector(None, "metax-operator", "metax-operator-controller", "pod-a"))
        if kind == "operator-metrics":
            self.handle = oc.serve_metrics(0, health, address="127.0.0.1")
            self.httpd = self.handle.httpd
        else:
            self.httpd = self.handle = health.serve(0, address="127.0.0.1")
            self.path = "/healthz"
        # the operator's servers take the defaults; the bounds are the server's, read at each request
        for name, value in bounds.items():
            if name == "request_timeout":
                self.httpd.idle_timeout = self.httpd.request_timeout = self.httpd.read_timeout = value
            else:
                setattr(self.httpd, name, value)

    @property
    def port(self):
        return self.httpd.port

    def good(self, answer):
        """Whether ``answer`` (status, body) of a GET of :attr:`path` is what this server serves."""
        status, body = answer
        if self.kind == "metrics-server":
            return (status, body) == (200, EXPOSITION)
        if self.kind == "operator-metrics":    # the process's default registry (process and platform collectors)
            return status == 200 and (b"process_resident_memory_bytes" in body and b"python_info" in body
                                      if HAS_PROMETHEUS else b"not installed" in body)
        return (status, json.loads(body)) == (200, STANDBY)

    def stop(self):
        self.handle.stop()


@pytest.fixture(params=["metrics-server", "operator-metrics", "operator-health"])
def server(request):
    servers = []

    def start(**bounds):
        srv = Served(request.param, **bounds)
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.stop()


def scrape(port: int, path: str = "/metrics"):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def closed_within(sock: socket.socket, seconds: float, trickle: bytes = b"") -> bool:
    """True when the server closes ``sock`` within ``seconds``; sends ``trickle`` a byte at a time meanwhile."""
    deadline = time.monotonic() + seconds
    sent = 0
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, min(0.5, deadline - time.monotonic())))
        try:
            if not sock.recv(4096):
                return True
        except socket.timeout:
            pass
        except OSError:
            return True
        if sent < len(trickle):
            try:
                sock.sendall(trickle[sent:sent + 1])
            except OSError:
                return True
            sent += 1
    return False


def test_scrape_and_health(server):
    srv = server()
    assert srv.good(scrape(srv.port, srv.path))
    if srv.kind == "operator-metrics":
        assert scrape(srv.port, "/healthz") == (200, json.dumps(STANDBY).encode() + b"\n")
    elif srv.kind == "metrics-server":
        assert scrape(srv.port, "/healthz") == (200, b"ok\n")
    assert scrape(srv.port, "/nothing")[0] == 404


def test_300_idle_connections_hold_a_bounded_number_of_threads(server):
    srv = server()
    threads_before = threading.active_count()
    idle = []
    for index in range(300):
        # (generous: a connection that meets a full queue is retried by the kernel, 1 s, 3 s, 7 s, ... in)
        idle.append(socket.create_connection(("127.0.0.1", srv.port), timeout=60))
        # Keep the listen queue short: socketserver listens with a backlog of 5, and a connection
        # that meets a full queue is retried by the kernel only after a second (47 of the 300 did,
        # 48 s in all). What is tested is the server's threads once it has them all, not that queue.
        deadline = time.monotonic() + 2.0
        while srv.httpd.connections + srv.httpd.evicted < index - 2 and time.monotonic() < deadline:
            time.sleep(0.001)
    try:
        # the evicted connections' threads end on their own: polled (a loaded machine may take a while)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (threading.active_count() - threads_before <= MAX_CONNECTIONS + 2
                                                   and srv.httpd.connections <= MAX_CONNECTIONS):
            time.sleep(0.1)
        assert threading.active_count() - threads_before <= MAX_CONNECTIONS + 2
        assert srv.httpd.connections <= MAX_CONNECTIONS
        assert srv.good(scrape(srv.port, srv.path))            # a scrape still gets through
        assert srv.httpd.evicted >= 300 - MAX_CONNECTIONS
    finally:
        for sock in idle:
            sock.close()


def test_a_client_that_never_finishes_its_request_is_cut_off(server):
    srv = server(request_timeout=1.0)
    quiet = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
    slow = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
    try:
        slow.sendall(b"GET /metrics HTTP/1.1\r\n")
        # the 1 s request timeout is what is tested; how soon after it the close arrives is not (generous)
        assert closed_within(quiet, 60)
        # a header a byte at a time: each read is quick, the request is never done
        assert closed_within(slow, 60, trickle=b"X-Slow: " + b"a" * 100)
        assert srv.good(scrape(srv.port, srv.path))
    finally:
        quiet.close()
        slow.close()


def test_at_the_cap_the_oldest_connection_goes(server):
    srv = server(max_connections=2)
    first = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
    time.sleep(0.1)
    second = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
    time.sleep(0.1)
    try:
        assert srv.good(scrape(srv.port, srv.path))
        assert closed_within(first, 60)
        second.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
        assert second.recv(100).startswith(b"HTTP/1.0 200")
    finally:
        first.close()
        second.close()
