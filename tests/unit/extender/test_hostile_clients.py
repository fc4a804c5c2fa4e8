# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""gpu-aware against hostile clients, on real sockets (issue 39, finding 6).

Any pod that reaches the Service can open connections and send bodies. The
agent runs as a subprocess (its threads and memory are its own, read from
/proc/<pid>/status) with its default bounds; the in-process tests drive each
bound of :class:`ExtenderHTTPServer` on its own with small numbers.

Deadlines here are functional (generous: the test machine is shared), never
latency targets.
"""
from __future__ import annotations

import http.client
import json
import logging
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.extender.cache import WeightsHolder
from ansible_collections.metax.gpu.plugins.module_utils.extender.metrics import ExtenderMetrics
from ansible_collections.metax.gpu.plugins.module_utils.extender.policy import Weights
from ansible_collections.metax.gpu.plugins.module_utils.extender.server import DEFAULT_MAX_CONNECTIONS, ExtenderHTTPServer
from ansible_collections.metax.gpu.plugins.module_utils.extender.service import ExtenderService
from extender_support import extender_args, gpu_pod, load_fixture, make_node
import polling
from ports import free_port

MODULE = "ansible_collections.metax.gpu.plugins.module_utils.agents.gpu_aware"
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
VALUES = os.path.join(_REPO, "files", "charts", "metax-gpu-extensions", "values.yaml")
NODES_BODY = load_fixture("kube-scheduler-1.36-nodes.json")   # a request kube-scheduler 1.36 sent
MIB = 1024 * 1024
LOG = logging.getLogger("test-hostile")


def chart_memory_limit() -> int:
    """gpuAware.resources.limits.memory of the Extensions chart, in bytes."""
    import yaml
    with open(VALUES, encoding="utf-8") as handle:
        text = yaml.safe_load(handle)["gpuAware"]["resources"]["limits"]["memory"]
    number, unit = re.fullmatch(r"(\d+)(Mi|Gi)", text).groups()
    return int(number) * (MIB if unit == "Mi" else 1024 * MIB)


def proc_status(pid: int) -> dict:
    fields = {}
    with open("/proc/%d/status" % pid, encoding="ascii") as handle:
        for line in handle:
            key, _sep, value = line.partition(":")
            fields[key] = value.split()[0] if value.split() else ""
    return {"rss": int(fields["VmRSS"]) * 1024, "peak": int(fields["VmHWM"]) * 1024,
            "threads": int(fields["Threads"])}


def post(port: int, verb: str, body: bytes, timeout: float = 60):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", "/" + verb, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def closed_by_server(sock: socket.socket, deadline: float, trickle: bytes = b"") -> bool:
    """True when the server closes ``sock`` before ``deadline``; sends ``trickle`` a byte a second meanwhile."""
    sent = 0
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, min(1.0, deadline - time.monotonic())))
        try:
            if not sock.recv(65536):
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


@pytest.fixture(scope="module")
def agent():
    port = free_port()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.join(_REPO, ".build", "collections"),
                                                    env.get("PYTHONPATH")) if p)
    env.pop("KUBERNETES_SERVICE_HOST", None)
    env.pop("POD_NAMESPACE", None)
    log = tempfile.TemporaryFile()
    # The defaults but the request deadline, shortened so that the test sees it end.
    proc = subprocess.Popen([sys.executable, "-m", MODULE, "--address", "127.0.0.1", "--port", str(port),
                             "--no-node-cache", "--request-timeout", "6", "--log-format", "text"],
                            stdout=log, stderr=subprocess.STDOUT, env=env)

    def healthy():
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            conn.request("GET", "/healthz")
            return conn.getresponse().status == 200
        except OSError:
            return False
    try:
        polling.wait_until(healthy, 120, "gpu-aware to serve /healthz", interval=0.2)
        yield proc, port
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.seek(0)
        print(log.read().decode("utf-8", "replace")[-4000:])
        log.close()


def test_idle_connections_and_half_sent_bodies_do_not_stop_real_requests(agent):
    proc, port = agent
    limit = chart_memory_limit()
    nodes = [make_node(i) for i in range(60)]
    real = extender_args(gpu_pod(2), nodes)                 # a 60-node cluster's request, as sent (0.8 MB)
    expected = {verb: json.loads(post(port, verb, real)[1]) for verb in ("filter", "prioritize")}
    assert expected["filter"]["Error"] == "" and expected["filter"]["Nodes"]["items"]
    before = proc_status(proc.pid)

    idle = []
    for _index in range(300):
        idle.append(socket.create_connection(("127.0.0.1", port), timeout=60))
    # four bodies that declare 60 MiB and send half
    piece = b"x" * MIB
    partial = []
    answers = []
    for _index in range(4):
        sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        sock.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % (60 * MIB))
        # The first two are expected to be read (nothing answered: a 1 s wait that finds nothing); the
        # other two to be refused, and the wait for that answer is generous for a loaded machine.
        sock.settimeout(1.0 if _index < 2 else 60)
        try:
            answers.append(sock.recv(200))     # refused at once when the large-body pool is full
        except socket.timeout:
            answers.append(b"")
        sock.settimeout(60)
        if not answers[-1]:
            for _mib in range(30):
                sock.sendall(piece)
        partial.append(sock)
    held = proc_status(proc.pid)
    try:
        # the server keeps answering the real request, the same way
        for verb in ("filter", "prioritize", "filter"):
            status, data = post(port, verb, real)
            assert status == 200 and json.loads(data) == expected[verb]
        assert post(port, "filter", NODES_BODY)[0] == 200
        during = proc_status(proc.pid)
        # threads: the connections within the cap, the accepting thread and the main one
        assert during["threads"] <= DEFAULT_MAX_CONNECTIONS + 4, during
        assert held["threads"] <= DEFAULT_MAX_CONNECTIONS + 4, held
        for sample in (held, during):
            assert sample["rss"] < limit and sample["peak"] < limit, (sample, limit)
        # two half bodies fit the large pool (120 of 128 MiB); the other two were refused
        assert [a[:12] for a in answers] == [b"", b"", b"HTTP/1.1 503", b"HTTP/1.1 503"], answers
        # the server closed the idle connections beyond the cap (the longest idle first), or refused them
        # (polled: on a loaded machine a close may still be on its way, or arrive after a 503 read first)
        closed = 0
        deadline = time.monotonic() + 60
        while True:
            closed = sum(1 for sock in idle if closed_by_server(sock, time.monotonic() + 0.05))
            if closed >= 300 - DEFAULT_MAX_CONNECTIONS or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert closed >= 300 - DEFAULT_MAX_CONNECTIONS, closed
        # the half-sent bodies are cut at the request deadline (6 s here) and their memory is released:
        # a request as large as the pool allows is answered afterwards
        deadline = time.monotonic() + 60
        assert all(closed_by_server(sock, deadline) for sock in partial)
        large = extender_args(gpu_pod(2), [make_node(i) for i in range(2000)])
        assert 20 * MIB < len(large) < 128 * MIB - 60 * MIB
        assert post(port, "filter", large, timeout=120)[0] == 200
        after = proc_status(proc.pid)
        assert after["peak"] < limit and after["threads"] <= DEFAULT_MAX_CONNECTIONS + 4
        assert before["rss"] < limit
    finally:
        for sock in idle + partial:
            sock.close()


def test_a_slowloris_is_cut_off_while_real_requests_go_on(agent):
    _proc, port = agent
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    try:
        sock.sendall(b"POST /filter HTTP/1.1\r\n")
        # a header a byte a second: each read is quick, the request never completes
        started = time.monotonic()
        assert post(port, "filter", NODES_BODY)[0] == 200
        assert closed_by_server(sock, started + 45, trickle=b"X-Slow: " + b"a" * 60)
    finally:
        sock.close()


# --------------------------------------------------------- in-process bounds

@pytest.fixture
def serve():
    servers = []

    def start(**kwargs):
        metrics = ExtenderMetrics()
        service = ExtenderService(WeightsHolder(Weights(1, 1, "flags"), metrics, LOG, "ns"), metrics, LOG)
        server = ExtenderHTTPServer(("127.0.0.1", 0), service, metrics, LOG, **kwargs)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.graceful_stop(2)


def wait_for_large_pool_use(server, amount: int) -> None:
    """Until a request's declared body is reserved from the large pool (its head read, then its length)."""
    polling.wait_until(lambda: server._pools[True][0] == amount, 60,  # pylint: disable=protected-access
                       "%d bytes reserved from the large pool" % amount, interval=0.05)


def _head_only(port: int, length: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    sock.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n{" % length)
    return sock


def test_at_the_cap_the_longest_idle_connection_makes_room(serve):
    server = serve(max_connections=2)
    first = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    # the first connection's thread has started (its idle time counts from there), then it idles a while
    polling.wait_until(lambda: len(server._handlers) == 1, 60, "the first connection's thread",  # pylint: disable=protected-access
                       interval=0.05)
    time.sleep(0.2)
    second = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    polling.wait_until(lambda: server.connections == 2, 60, "two connections", interval=0.05)
    assert post(server.port, "filter", NODES_BODY)[0] == 200
    assert closed_by_server(first, time.monotonic() + 60)          # the oldest idle one
    second.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert second.recv(100).startswith(b"HTTP/1.1 200")
    first.close()
    second.close()


def test_at_the_cap_with_every_connection_in_a_request_new_ones_get_503(serve):
    server = serve(max_connections=2)
    busy = [_head_only(server.port, 1000) for _index in range(2)]
    polling.wait_until(lambda: server.busy_connections == 2, 60, "two connections in a request", interval=0.05)
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        assert sock.recv(100).startswith(b"HTTP/1.1 503")        # answered without reading it
    for sock in busy:                       # they complete: the requests are answered (400: "{" + padding)
        sock.sendall(b" " * 999)
        assert sock.recv(100).startswith(b"HTTP/1.1 400")
        sock.close()
    # the server sees the closes on its own threads: until then both still count as in a request
    polling.wait_until(lambda: server.busy_connections == 0, 60, "the answered connections idle", interval=0.05)
    assert post(server.port, "filter", NODES_BODY)[0] == 200


def test_large_bodies_have_a_pool_and_small_ones_another(serve):
    server = serve(max_body_bytes=4 * MIB, small_bodies_bytes=2 * MIB)
    held = _head_only(server.port, 3 * MIB)
    polling.wait_until(lambda: server.busy_connections == 1, 60, "a connection in a request", interval=0.05)
    wait_for_large_pool_use(server, 3 * MIB)
    with _head_only(server.port, 2 * MIB) as sock:                       # 3 + 2 > 4 MiB
        assert sock.recv(200).startswith(b"HTTP/1.1 503")
    assert post(server.port, "filter", NODES_BODY)[0] == 200            # small: its own pool
    held.close()
    polling.wait_until(lambda: server.reserve(4 * MIB, large=True), 60, "the large pool to empty", interval=0.05)
    server.release(4 * MIB, large=True)


def test_a_declared_length_is_not_allocated_before_it_arrives(serve):
    server = serve(max_body_bytes=512 * MIB, request_timeout=3)
    before = proc_status(os.getpid())["rss"]
    sock = _head_only(server.port, 500 * MIB)
    sock.sendall(b"x" * MIB)
    time.sleep(0.5)
    assert proc_status(os.getpid())["rss"] - before < 100 * MIB
    assert closed_by_server(sock, time.monotonic() + 60)          # the request deadline
    sock.close()


def test_an_idle_connection_waits_the_idle_timeout_only(serve):
    server = serve(idle_timeout=1.0)
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        assert closed_by_server(sock, time.monotonic() + 60)


def test_a_chunked_body_moves_to_the_large_pool_as_it_grows(serve):
    server = serve(max_body_bytes=4 * MIB, small_bodies_bytes=2 * MIB)
    held = _head_only(server.port, 3 * MIB)                        # 3 of the 4 MiB large pool
    polling.wait_until(lambda: server.busy_connections == 1, 60, "a connection in a request", interval=0.05)
    wait_for_large_pool_use(server, 3 * MIB)
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        sock.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        piece = b"x" * (512 * 1024)
        answer = b""
        try:
            for _index in range(6):                                # 3 MiB in all: past 1 MiB it needs the large pool
                sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
        except OSError:
            pass
        sock.settimeout(60)
        try:
            answer = sock.recv(200)
        except OSError:
            pass
        assert answer.startswith(b"HTTP/1.1 503"), answer
    held.close()
    # both pools are empty again: a small and a pool-sized body are taken
    polling.wait_until(lambda: server.reserve(4 * MIB, large=True), 60, "the large pool to empty", interval=0.05)
    server.release(4 * MIB, large=True)
    assert server.reserve(2 * MIB, large=False)
    server.release(2 * MIB, large=False)


def test_an_answer_to_a_real_request_after_hostile_ones_is_the_same(serve):
    server = serve(max_connections=4, request_timeout=1.0)
    expected = post(server.port, "filter", NODES_BODY)
    # The client has the answer a moment before the server's thread counts that connection idle; busy,
    # it would make four with the three below, and the cap's 503 for the real request would be right.
    polling.wait_until(lambda: server.busy_connections == 0, 60, "the answered connection idle", interval=0.05)
    junk = [socket.create_connection(("127.0.0.1", server.port), timeout=60) for _index in range(10)]
    for sock in junk[:3]:
        try:
            sock.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 99999\r\n\r\n{")
        except OSError:
            pass
    try:
        assert post(server.port, "filter", NODES_BODY) == expected
        assert server.connections <= 4
    finally:
        for sock in junk:
            sock.close()
