# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The HTTP service with real kube-scheduler request bodies, errors, concurrency, TLS and shutdown."""
from __future__ import annotations

import datetime
import email.utils
import http.client
import json
import logging
import shutil
import socket
import ssl
import subprocess
import threading

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.extender.cache import NodeCache, WeightsHolder
from ansible_collections.metax.gpu.plugins.module_utils.extender.metrics import ExtenderMetrics
from ansible_collections.metax.gpu.plugins.module_utils.extender.nodeinfo import StateCache
from ansible_collections.metax.gpu.plugins.module_utils.extender.policy import Weights, reason_free
from ansible_collections.metax.gpu.plugins.module_utils.extender.server import (
    DEFAULT_MAX_BODY_BYTES, ExtenderHTTPServer, tls_context)
from ansible_collections.metax.gpu.plugins.module_utils.extender.service import ExtenderService
import polling
from extender_support import annotations, extender_args, gpu_pod, load_fixture, make_node

LOG = logging.getLogger("test-http")
NODES_BODY = load_fixture("kube-scheduler-1.36-nodes.json")
NAMES_BODY = load_fixture("kube-scheduler-1.36-nodenames.json")


class Running:
    def __init__(self, cache=True, synced=True, max_body=DEFAULT_MAX_BODY_BYTES, context=None, weights=None):
        self.metrics = ExtenderMetrics()
        self.states = StateCache()
        self.weights = WeightsHolder(weights or Weights(1, 1, "flags"), self.metrics, LOG, "ns")
        self.nodes = NodeCache(self.states, self.metrics, LOG) if cache else None
        if self.nodes is not None and synced:
            self.nodes.replace(json.loads(NODES_BODY)["Nodes"]["items"])
        self.service = ExtenderService(self.weights, self.metrics, LOG, nodes=self.nodes, states=self.states)
        self.server = ExtenderHTTPServer(("127.0.0.1", 0), self.service, self.metrics, LOG,
                                         max_body_bytes=max_body, ssl_context=context)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)
        self.thread.start()

    @property
    def port(self):
        return self.server.port

    def connection(self, timeout=60):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(self, method, path, body=None, headers=None, conn=None):
        own = conn is None
        conn = conn or self.connection()
        try:
            conn.request(method, path, body=body, headers=headers or {"Content-Type": "application/json"})
            resp = conn.getresponse()
            return resp.status, resp.read(), resp
        finally:
            if own:
                conn.close()

    def post(self, verb, body, **kw):
        status, data, _resp = self.request("POST", "/" + verb, body, **kw)
        return status, json.loads(data)

    def stop(self):
        if not self.server.stopping:
            self.server.graceful_stop(2)


@pytest.fixture
def running():
    servers = []

    def start(**kwargs):
        servers.append(Running(**kwargs))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def test_captured_nodes_form(running):
    srv = running()
    status, result = srv.post("filter", NODES_BODY)
    assert status == 200 and result["Error"] == ""
    sent = json.loads(NODES_BODY)["Nodes"]["items"]
    assert result["Nodes"]["items"] == sent           # both pass, returned exactly as sent
    assert result["FailedNodes"] == {} and result["FailedAndUnresolvableNodes"] == {}
    status, result = srv.post("prioritize", NODES_BODY)
    assert status == 200
    assert sorted(h["Host"] for h in result) == sorted(n["metadata"]["name"] for n in sent)
    assert all(h["Score"] == 10 for h in result)      # equal tables: both best


def test_captured_node_names_form(running):
    srv = running()
    status, result = srv.post("filter", NAMES_BODY)
    assert status == 200 and result["Error"] == ""
    assert result["NodeNames"] == json.loads(NAMES_BODY)["NodeNames"]
    status, result = srv.post("prioritize", NAMES_BODY)
    assert status == 200 and [h["Host"] for h in result] == json.loads(NAMES_BODY)["NodeNames"]


def test_node_names_unknown_and_unsynced(running):
    srv = running()
    body = extender_args(gpu_pod(1), names=["gpu-aware-capture-a", "new-node"])
    status, result = srv.post("filter", body)
    assert result["NodeNames"] == ["gpu-aware-capture-a"] and "new-node" in result["FailedNodes"]
    srv2 = running(synced=False)
    status, result = srv2.post("filter", NAMES_BODY)
    assert status == 200 and "not synced" in result["Error"]
    status = srv2.post("prioritize", NAMES_BODY)[0]
    assert status == 503
    assert srv2.request("GET", "/readyz")[0] == 503
    srv3 = running(cache=False)
    status, result = srv3.post("filter", NAMES_BODY)
    assert "nodeCacheCapable: false" in result["Error"]
    assert srv3.request("GET", "/readyz")[0] == 200


def test_filter_and_prioritize_decide_by_the_tables(running):
    srv = running(weights=Weights(1, 0))
    nodes = [make_node(0, allocated=[]),                      # 8 free
             make_node(1, allocated=[0, 1, 2, 3, 4, 5, 6]),   # 1 free
             make_node(2, allocated=[0, 1, 4, 5])]           # 4 free, split over both groups
    nodes.append(make_node(3, devices=2, gpu_annotations=annotations(2)))
    nodes[3]["status"]["capacity"]["metax-tech.com/gpu"] = "2"
    status, result = srv.post("filter", extender_args(gpu_pod(4), nodes))
    assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["gpu-node-00000", "gpu-node-00002"]
    assert result["FailedNodes"] == {"gpu-node-00001": reason_free(4)}
    assert list(result["FailedAndUnresolvableNodes"]) == ["gpu-node-00003"]
    passing = [nodes[0], nodes[2]]
    scores = srv.post("prioritize", extender_args(gpu_pod(4), passing))[1]
    by_score = {h["Host"]: h["Score"] for h in scores}
    # 4 inside one MetaXLink group (node 0) beats 2+2 across groups (node 2).
    assert by_score == {"gpu-node-00000": 10, "gpu-node-00002": 0}
    srv.weights.configmap({"scoreWeight": "0", "lossWeight": "1"})      # a ConfigMap change, no restart
    scores = srv.post("prioritize", extender_args(gpu_pod(4), passing))[1]
    # taking a whole group of 8 free damages more than taking the 4 that are left on node 2
    assert {h["Host"]: h["Score"] for h in scores} == {"gpu-node-00000": 0, "gpu-node-00002": 10}


def test_cache_mode_answers_follow_the_pod_and_the_nodes(running):
    # Nothing but the decoded Pod and its demand is kept between calls: a pod asking for more, or a
    # node whose gpu-device annotations change, changes the answer to the same names at once.
    srv = running()
    nodes = [make_node(0, allocated=[]), make_node(1, allocated=[0, 1, 2, 3, 4, 5, 6])]   # 8 free, 1 free
    srv.nodes.replace(nodes)
    names = ["gpu-node-00000", "gpu-node-00001"]
    one, four = extender_args(gpu_pod(1), names=names), extender_args(gpu_pod(4), names=names)
    assert srv.post("filter", one)[1]["NodeNames"] == names
    assert srv.post("prioritize", one)[0] == 200
    result = srv.post("filter", four)[1]
    assert result["NodeNames"] == ["gpu-node-00000"] and result["FailedNodes"] == {"gpu-node-00001": reason_free(4)}
    assert srv.post("filter", one)[1]["NodeNames"] == names                  # back to the first pod
    busy = make_node(0, allocated=[0, 1, 2, 3, 4, 5, 6, 7])
    srv.nodes.apply("MODIFIED", busy)                                          # node 0 is now full
    result = srv.post("filter", one)[1]
    assert result["NodeNames"] == ["gpu-node-00001"] and result["FailedNodes"] == {"gpu-node-00000": reason_free(1)}
    srv.nodes.apply("MODIFIED", make_node(0, allocated=[]))
    assert srv.post("filter", four)[1]["NodeNames"] == ["gpu-node-00000"]


@pytest.mark.parametrize("body, fragment", [
    (b"{bad json", "malformed JSON"),
    (b'{"Pod":{"spec":{"containers":[{"resources":{"requests":{"metax-tech.com/gpu":"two"}}}]}},"NodeNames":[]}',
     "Pod"),
    (b"", "expected"),
])
def test_bad_requests_answer_400_with_error(running, body, fragment):
    srv = running()
    for verb in ("filter", "prioritize"):
        status, result = srv.post(verb, body)
        assert status == 400 and fragment in result["Error"]
    assert srv.request("GET", "/healthz")[0] == 200          # still serving


def test_http_level_errors(running):
    srv = running(max_body=4096)
    assert srv.request("POST", "/bind", b"{}")[0] == 404
    assert srv.request("GET", "/nothing")[0] == 404
    status, data, _resp = srv.request("POST", "/filter", b"x" * 5000)
    assert status == 413 and b"--max-body-bytes" in data
    # no Content-Length
    with socket.create_connection(("127.0.0.1", srv.port), timeout=60) as sock:
        sock.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(100).startswith(b"HTTP/1.1 411")
    with socket.create_connection(("127.0.0.1", srv.port), timeout=60) as sock:
        sock.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: -4\r\n\r\n")
        assert sock.recv(100).startswith(b"HTTP/1.1 400")
    # chunked bodies are accepted (and limited)
    conn = srv.connection()
    conn.putrequest("POST", "/filter")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    for piece in (NAMES_BODY[:100], NAMES_BODY[100:]):
        conn.send(b"%x\r\n%s\r\n" % (len(piece), piece))
    conn.send(b"0\r\n\r\n")
    resp = conn.getresponse()
    assert resp.status == 200 and json.loads(resp.read())["NodeNames"]
    conn.close()
    conn = srv.connection()
    conn.request("POST", "/filter", body=iter([b"x" * 3000, b"x" * 3000]), encode_chunked=True,
                 headers={"Transfer-Encoding": "chunked"})
    assert conn.getresponse().status == 413
    conn.close()


def _read_to_close(sock):
    """Everything the server sends on ``sock`` until it closes the connection."""
    data = b""
    while True:
        piece = sock.recv(65536)
        if not piece:
            return data
        data += piece


def _raw_exchange(port, request):
    """The raw head lines and body of one answer to ``request`` (the server closes the connection after it)."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(request)
        data = _read_to_close(sock)
    head, _sep, body = data.partition(b"\r\n\r\n")
    return head.decode("latin-1").split("\r\n"), body


def test_response_head(running):
    # _send writes the head itself; it must say what BaseHTTPRequestHandler's send_response/send_header said.
    srv = running()
    request = (b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
               b"Content-Length: %d\r\n\r\n%s" % (len(NAMES_BODY), NAMES_BODY))
    lines, body = _raw_exchange(srv.port, request)
    assert lines[0] == "HTTP/1.1 200 OK"
    headers = dict(line.split(": ", 1) for line in lines[1:])
    assert sorted(headers) == ["Connection", "Content-Length", "Content-Type", "Date", "Server"]
    assert headers["Server"] == "gpu-aware" and headers["Content-Type"] == "application/json"
    assert headers["Connection"] == "close" and int(headers["Content-Length"]) == len(body)
    assert email.utils.parsedate_to_datetime(headers["Date"]).utcoffset() == datetime.timedelta(0)
    assert headers["Date"].endswith(" GMT") and json.loads(body)["NodeNames"]
    # HTTP/1.0 without keep-alive: the answer says it closes; HEAD: the length of the body it does not send
    lines, body = _raw_exchange(srv.port, b"GET /nothing HTTP/1.0\r\n\r\n")
    assert lines[0] == "HTTP/1.1 404 Not Found" and "Connection: close" in lines and body == b"not found\n"
    lines, body = _raw_exchange(srv.port, b"HEAD /healthz HTTP/1.0\r\n\r\n")
    assert lines[0] == "HTTP/1.1 200 OK" and "Content-Length: 3" in lines and body == b""


def samples(text):
    """{(sample name, sorted labels): value} of an exposition, read by prometheus_client's parser."""
    parser = pytest.importorskip("prometheus_client.parser")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in parser.text_string_to_metric_families(text) for s in family.samples}


def test_keep_alive_and_metrics(running):
    srv = running()
    conn = srv.connection()
    for _round in range(3):
        status, _data, resp = srv.request("POST", "/filter", NODES_BODY, conn=conn)
        assert status == 200 and resp.getheader("Connection") != "close"
    srv.request("POST", "/prioritize", b"{", conn=conn)
    conn.close()
    status, text, resp = srv.request("GET", "/metrics")
    text = text.decode()
    assert status == 200 and resp.getheader("Content-Type").startswith("text/plain")
    found = samples(text)       # parsed: the order of labels and the form of numbers are the library's
    assert found[("gpu_aware_requests_total", (("code", "200"), ("verb", "filter")))] == 3
    assert found[("gpu_aware_requests_total", (("code", "400"), ("verb", "prioritize")))] == 1
    assert found[("gpu_aware_request_duration_seconds_count", (("verb", "filter"),))] == 3
    assert found[("gpu_aware_weight", (("name", "score"),))] == 1
    assert found[("gpu_aware_config_valid", ())] == 1 and found[("gpu_aware_node_cache_nodes", ())] == 2
    assert found[("gpu_aware_filter_nodes_total", (("result", "passed"),))] == 6
    assert srv.request("GET", "/healthz")[1] == b"ok\n"
    assert srv.request("HEAD", "/healthz")[0] == 200


def test_concurrent_requests(running):
    srv = running()
    nodes = [make_node(i) for i in range(150)]
    bodies = [extender_args(gpu_pod(n), nodes) for n in (1, 2, 4, 8)]
    expected = {}
    for body in bodies:
        expected[body] = (srv.post("filter", body)[1], srv.post("prioritize", body)[1])
    errors = []

    def worker(seed):
        try:
            conn = srv.connection()
            for i in range(6):
                body = bodies[(seed + i) % len(bodies)]
                verb = "filter" if (seed + i) % 2 else "prioritize"
                status, data, _resp = srv.request("POST", "/" + verb, body, conn=conn)
                want = expected[body][0 if verb == "filter" else 1]
                if status != 200 or json.loads(data) != want:
                    errors.append((seed, i, status))
            conn.close()
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []


def test_graceful_stop_finishes_requests_in_progress(running):
    srv = running()
    idle = srv.connection()
    assert srv.request("GET", "/healthz", conn=idle)[0] == 200            # an idle keep-alive connection
    # (polled, not slept: on a loaded machine the server's threads may lag the client's)
    polling.wait_until(lambda: srv.server.busy_connections == 0, 60, "the keep-alive connection idle", interval=0.02)
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
    sock.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(NODES_BODY)
                 + NODES_BODY[:100])
    polling.wait_until(lambda: srv.server.busy_connections == 1, 60, "the request in progress", interval=0.02)
    # the stop's bound is generous: the request in progress is expected to finish (clean is asserted)
    stopper = threading.Thread(target=lambda: setattr(srv, "clean", srv.server.graceful_stop(60)))
    stopper.start()
    polling.wait_until(lambda: srv.server.stopping, 60, "the graceful stop to begin", interval=0.02)
    sock.sendall(NODES_BODY[100:])
    data = _read_to_close(sock)
    sock.close()
    stopper.join(60)
    head, _sep, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"Connection: close" in head
    assert json.loads(body)["Error"] == ""
    assert srv.clean is True
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", srv.port), timeout=2).sendall(b"GET /healthz HTTP/1.1\r\n\r\n")
        raise OSError("still accepting")
    idle.close()


def test_default_body_limit_admits_5000_real_nodes():
    # The largest request kube-scheduler sends: 5,000 full Nodes, each with the kubelet's maximum of
    # 50 images (nodeStatusMaxImages), in the Pod's ExtenderArgs; the limit leaves 1.6 times its size.
    nodes = [json.dumps(make_node(i, images=50), separators=(",", ":")) for i in range(50)]
    body = len(extender_args(gpu_pod(2), [])) + 100 * sum(len(n) + 1 for n in nodes)
    assert 75 * 10 ** 6 < body and 1.6 * body < DEFAULT_MAX_BODY_BYTES


def test_a_large_request(running):
    srv = running()
    nodes = [make_node(i) for i in range(1000)]
    body = extender_args(gpu_pod(2), nodes)
    assert len(body) > 8 * 10 ** 6
    status, result = srv.post("filter", body)
    assert status == 200
    passed = {n["metadata"]["name"] for n in result["Nodes"]["items"]}
    assert len(passed) + len(result["FailedNodes"]) == 1000 and passed


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_https(running, tmp_path):
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=gpu-aware", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out",
                    str(cert)], check=True, capture_output=True)
    srv = running(context=tls_context(str(cert), str(key)))
    client = ssl.create_default_context(cafile=str(cert))
    conn = http.client.HTTPSConnection("127.0.0.1", srv.port, context=client, timeout=60)
    conn.request("POST", "/filter", body=NODES_BODY)
    resp = conn.getresponse()
    assert resp.status == 200 and json.loads(resp.read())["Error"] == ""
    conn.close()
    # a plain-HTTP client does not wedge the server
    with socket.create_connection(("127.0.0.1", srv.port), timeout=60) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\n\r\n")
        sock.recv(100)
    conn = http.client.HTTPSConnection("127.0.0.1", srv.port, context=client, timeout=60)
    conn.request("GET", "/healthz")
    assert conn.getresponse().status == 200
    conn.close()


def test_both_forms_decide_alike(running):
    """nodeCacheCapable true (cache path) and false (full nodes) give the same answers for the same nodes."""
    rng = __import__("random").Random(5)
    nodes = [make_node(i, rng) for i in range(60)]
    nodes[3]["status"]["capacity"]["metax-tech.com/gpu"] = "2"                  # unresolvable for 4
    nodes[3]["metadata"]["annotations"]["metax-tech.com/gpu.devices"] = "[]"
    nodes[4]["metadata"]["annotations"] = {}                                     # allocatable only
    srv = running()
    srv.nodes.replace(nodes)
    names = [n["metadata"]["name"] for n in nodes] + ["not-a-node"]
    for demand in (0, 1, 2, 4, 8):
        pod = gpu_pod(demand)
        full = srv.post("filter", extender_args(pod, nodes))[1]
        cached = srv.post("filter", extender_args(pod, names=names))[1]
        assert [n["metadata"]["name"] for n in full["Nodes"]["items"]] == cached["NodeNames"]
        assert cached["FailedNodes"].pop("not-a-node")
        assert full["FailedNodes"] == cached["FailedNodes"]
        assert full["FailedAndUnresolvableNodes"] == cached["FailedAndUnresolvableNodes"]
        for weights in ({"scoreWeight": "1", "lossWeight": "0"}, {"scoreWeight": "2", "lossWeight": "3"}):
            srv.weights.configmap(weights)
            by_full = srv.post("prioritize", extender_args(pod, nodes))[1]
            by_cache = srv.post("prioritize", extender_args(pod, names=names[:-1]))[1]
            assert by_full == by_cache
