# -*- coding: utf-8 -*-
"""The eviction guard (plugins/module_utils/eviction_webhook.py): driver-manager evicts its own node's pods only."""

from __future__ import annotations

import argparse
import http.client
import json
import shutil
import socket
import ssl
import subprocess
import time

import pytest

from ansible_collections.metax.gpu.plugins.module_utils import eviction_webhook as ew

DM = "system:serviceaccount:metax-operator:driver-manager"
USERS = (DM,)


def request(user=DM, node="node-a", namespace="team", name="train-0", extra=None, **over):
    req = {"uid": "u-1", "kind": {"group": "policy", "version": "v1", "kind": "Eviction"},
           "resource": {"group": "", "version": "v1", "resource": "pods"}, "subResource": "eviction",
           "requestKind": {"group": "policy", "version": "v1", "kind": "Eviction"},
           "name": name, "namespace": namespace, "operation": "CREATE",
           "userInfo": {"username": user, "groups": ["system:serviceaccounts"],
                        "extra": extra if extra is not None else (
                            {ew.NODE_NAME_EXTRA: [node]} if node is not None else {})},
           "object": {"apiVersion": "policy/v1", "kind": "Eviction",
                      "metadata": {"name": name, "namespace": namespace}}}
    req.update(over)
    return req


# -- the pure decision --------------------------------------------------------------------
def test_own_node_is_allowed():
    assert ew.decide(request(), USERS, True, "node-a") == ew.Decision(True)


def test_other_node_is_denied_and_named():
    d = ew.decide(request(), USERS, True, "node-b")
    assert not d.allowed and d.code == 403
    assert "own node node-a" in d.message and "team/train-0 on node node-b" in d.message


def test_unscheduled_pod_is_denied():
    """spec.nodeName "" (pending, unscheduled): no node's agent may evict it."""
    for pod_node in ("", None):
        d = ew.decide(request(), USERS, True, pod_node)
        assert not d.allowed and "unscheduled" in d.message


def test_token_without_node_is_denied():
    """A token not bound to a pod (a TokenRequest without boundObjectRef, a legacy Secret token)."""
    for extra in ({}, {ew.NODE_NAME_EXTRA: []}, {ew.NODE_NAME_EXTRA: ["node-a", "node-b"]}, {ew.NODE_NAME_EXTRA: [""]}):
        d = ew.decide(request(extra=extra), USERS, True, "node-a")
        assert not d.allowed and d.code == 403 and "names no node" in d.message, extra


def test_missing_pod_is_a_404_denial():
    """Not found: denied (nothing to approve) with 404, which kube/evict.py reads as "already gone"."""
    d = ew.decide(request(), USERS, False, None)
    assert not d.allowed and d.code == 404


def test_other_users_are_not_guarded():
    """An administrator, the kubelet, another controller: allowed, whatever the node."""
    for user in ("kubernetes-admin", "system:serviceaccount:kube-system:disruption-controller",
                 "system:serviceaccount:other-ns:driver-manager"):
        assert ew.decide(request(user=user, node=None), USERS, True, "node-b").allowed


def test_a_guarded_user_may_do_nothing_else_here():
    """Sent something other than a pod's eviction (a misconfigured webhook): denied for the guarded user."""
    for over in ({"subResource": ""}, {"operation": "DELETE"}, {"resource": {"group": "", "resource": "nodes"}},
                 {"resource": {"group": "apps", "resource": "pods"}}, {"name": ""}, {"namespace": None}):
        d = ew.decide(request(**over), USERS, True, "node-a")
        assert not d.allowed and "only the eviction of a pod" in d.message, over


def test_response_shape():
    allowed = ew.response("u-1", ew.Decision(True))
    assert allowed == {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "response": {"uid": "u-1", "allowed": True}}
    denied = ew.response("u-2", ew.Decision(False, "no", 404))["response"]
    assert denied["status"] == {"code": 404, "message": "no", "reason": "NotFound"}


def test_service_account_users():
    assert ew.service_account_users("ns", ["driver-manager"]) == ("system:serviceaccount:ns:driver-manager",)


# -- the review, with the pod lookup --------------------------------------------------------
class Pods:
    """A pod lookup over a dict, which records what it was asked (or raises ``error``)."""

    def __init__(self, pods, error=None):
        self.pods = pods
        self.error = error
        self.asked = []

    def __call__(self, namespace, name):
        self.asked.append((namespace, name))
        if self.error is not None:
            raise self.error
        return self.pods.get((namespace, name))


def review_body(req):
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}).encode()


def test_review_reads_the_named_pod():
    pods = Pods({("team", "train-0"): "node-a", ("team", "train-1"): "node-b"})
    hook = ew.EvictionWebhook(pods, USERS)
    assert hook.review(review_body(request()))["response"] == {"uid": "u-1", "allowed": True}
    out = hook.review(review_body(request(name="train-1")))["response"]
    assert out["allowed"] is False and out["status"]["code"] == 403
    assert pods.asked == [("team", "train-0"), ("team", "train-1")]


def test_review_does_not_read_for_others_or_nodeless_tokens():
    pods = Pods({("team", "train-0"): "node-b"})
    hook = ew.EvictionWebhook(pods, USERS)
    assert hook.review(review_body(request(user="kubernetes-admin")))["response"]["allowed"] is True
    assert hook.review(review_body(request(node=None)))["response"]["allowed"] is False
    assert pods.asked == []


def test_review_fails_closed_when_the_pod_cannot_be_read():
    hook = ew.EvictionWebhook(Pods({}, error=RuntimeError("connection refused")), USERS)
    out = hook.review(review_body(request()))["response"]
    assert out["allowed"] is False and out["status"]["code"] == 503 and "connection refused" in out["status"]["message"]
    assert out["status"]["reason"] == "ServiceUnavailable"
    # a client's long error (headers, a body) is cut in the answer
    hook = ew.EvictionWebhook(Pods({}, error=RuntimeError("x" * 5000)), USERS)
    assert len(hook.review(review_body(request()))["response"]["status"]["message"]) < 400


def test_review_answers_in_the_requests_version():
    hook = ew.EvictionWebhook(Pods({("team", "train-0"): "node-a"}), USERS)
    body = json.dumps({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview",
                       "request": request()}).encode()
    assert hook.review(body)["apiVersion"] == "admission.k8s.io/v1beta1"


@pytest.mark.parametrize("body", [b"", b"\xff", b"[]", b'{"request": null}', b'{"request": {"name": "x"}}'])
def test_review_refuses_what_is_not_a_review(body):
    with pytest.raises(ew.ReviewError):
        ew.EvictionWebhook(Pods({}), USERS).review(body)


class FakeResponse:
    def __init__(self, data):
        self.data = data
        self.released = False

    def release_conn(self):
        self.released = True


class FakeCore:
    """CoreV1Api's read_namespaced_pod as the kubernetes client answers it (raw, _preload_content=False)."""

    def __init__(self, pods):
        self.pods = pods
        self.responses = []

    def read_namespaced_pod(self, name, namespace, _preload_content=True, _request_timeout=None):
        assert _preload_content is False and _request_timeout
        if (namespace, name) not in self.pods:
            exc = Exception("Not Found")
            exc.status = 404
            raise exc
        resp = FakeResponse(json.dumps(self.pods[(namespace, name)]).encode())
        self.responses.append(resp)
        return resp


def test_kube_pod_node():
    core = FakeCore({("team", "a"): {"spec": {"nodeName": "node-a"}}, ("team", "p"): {"spec": {}}})
    lookup = ew.kube_pod_node(core)
    assert lookup("team", "a") == "node-a"
    assert lookup("team", "p") == ""
    assert lookup("team", "gone") is None
    assert all(r.released for r in core.responses)


def test_kube_pod_node_raises_other_errors():
    class Broken:
        def read_namespaced_pod(self, *a, **kw):
            exc = Exception("Forbidden")
            exc.status = 403
            raise exc
    with pytest.raises(Exception, match="Forbidden"):
        ew.kube_pod_node(Broken())("team", "a")


# -- the HTTPS round trip ------------------------------------------------------------------
@pytest.fixture(name="tls")
def tls_fixture(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=metax-eviction-guard", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key),
                    "-out", str(cert)], check=True, capture_output=True)
    return tmp_path


@pytest.fixture(name="serving")
def serving_fixture(tls):
    servers = []

    def start(pods, **kw):
        args = argparse.Namespace(eviction_webhook_port=0, eviction_webhook_address="127.0.0.1",
                                  eviction_webhook_tls_dir=str(tls), eviction_webhook_guard=None,
                                  namespace="metax-operator")
        srv = ew.serve_from_flags(FakeCore(pods), args)
        for name, value in kw.items():
            setattr(srv, name, value)
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.stop()


def post(tls, port, body, path=ew.PATH):
    client = ssl.create_default_context(cafile=str(tls / "tls.crt"))
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=client, timeout=60)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"null")
    finally:
        conn.close()


def test_https_round_trip(serving, tls):
    """As the API server calls it: HTTPS (the CA the configuration's caBundle holds), an AdmissionReview."""
    srv = serving({("team", "train-0"): {"spec": {"nodeName": "node-a"}},
                   ("team", "train-1"): {"spec": {"nodeName": "node-b"}}})
    status, doc = post(tls, srv.port, review_body(request()))
    assert status == 200 and doc["response"] == {"uid": "u-1", "allowed": True}
    status, doc = post(tls, srv.port, review_body(request(name="train-1")))
    assert status == 200 and doc["response"]["allowed"] is False
    assert "not pod team/train-1 on node node-b" in doc["response"]["status"]["message"]
    status, doc = post(tls, srv.port, review_body(request(name="gone")))
    assert doc["response"]["status"]["code"] == 404
    # someone else's eviction is not the guard's business
    status, doc = post(tls, srv.port, review_body(request(user="kubernetes-admin", name="train-1")))
    assert doc["response"]["allowed"] is True


def test_https_refuses_bad_requests(serving, tls):
    srv = serving({})
    assert post(tls, srv.port, b"{}")[0] == 400
    assert post(tls, srv.port, review_body(request()), path="/other")[0] == 404
    # a body over the limit is refused from its Content-Length, before it is read
    client = ssl.create_default_context(cafile=str(tls / "tls.crt"))
    conn = http.client.HTTPSConnection("127.0.0.1", srv.port, context=client, timeout=60)
    conn.putrequest("POST", ew.PATH)
    conn.putheader("Content-Length", str(ew.MAX_BODY_BYTES + 1))
    conn.endheaders()
    assert conn.getresponse().status == 413
    conn.close()


def test_plain_and_idle_clients_do_not_wedge_it(serving, tls):
    """A plain-HTTP client, and idle connections past the cap: real reviews are still answered."""
    srv = serving({("team", "train-0"): {"spec": {"nodeName": "node-a"}}}, request_timeout=1.0)
    with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as sock:
        sock.sendall(b"POST /validate-eviction HTTP/1.1\r\n\r\n")
        sock.settimeout(5)
        try:
            sock.recv(100)
        except OSError:
            pass
    idle = [socket.create_connection(("127.0.0.1", srv.port), timeout=60) for _conn in range(ew.MAX_CONNECTIONS + 8)]
    try:
        started = time.monotonic()
        status, doc = post(tls, srv.port, review_body(request()))
        assert status == 200 and doc["response"]["allowed"] is True
        assert time.monotonic() - started < 5
        assert srv.connections <= ew.MAX_CONNECTIONS
    finally:
        for sock in idle:
            sock.close()


def test_flags_default_to_off():
    parser = argparse.ArgumentParser()
    ew.add_flags(parser)
    args = parser.parse_args([])
    assert args.eviction_webhook_port == 0 and args.eviction_webhook_guard is None
    args = parser.parse_args(["--eviction-webhook-port", "9443", "--eviction-webhook-guard", "dm"])
    assert args.eviction_webhook_port == 9443 and args.eviction_webhook_guard == ["dm"]


# -- the guard's own process (the Extensions chart's Deployment) -----------------------------
KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


def test_agent_refuses_a_bad_port_and_a_missing_certificate(tmp_path):
    pytest.importorskip("kubernetes")
    from ansible_collections.metax.gpu.plugins.module_utils.agents import eviction_webhook as agent
    from ansible_collections.metax.gpu.plugins.module_utils.agents.common import UsageError
    config = tmp_path / "kubeconfig"
    config.write_text(KUBECONFIG)
    common = ["--kubeconfig", str(config), "--log-format", "text"]
    with pytest.raises(UsageError, match="1-65535"):
        agent.main(common + ["--eviction-webhook-port", "0"])
    with pytest.raises(UsageError, match="certificate in %s" % tmp_path):
        agent.main(common + ["--eviction-webhook-tls-dir", str(tmp_path)])
    args = agent.build_parser().parse_args([])
    assert args.eviction_webhook_port == agent.DEFAULT_PORT and args.eviction_webhook_guard is None
