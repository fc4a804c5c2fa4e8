"""metax.gpu.gpu_device_mode against a local HTTP API server: the refusal while pods hold the node's GPUs (either
mode's), check mode and diff, a node already in its mode, bad input refused before any request, and a whole
switch through the real client (the writes in their order; the pool deleted on the way back).

The server answers what the module reads (the Node, the node's pods, the ResourceClaims, the node's pool) and
records every request, so "nothing changed" is checked as "no write reached the API server". The switch itself
(hold, evict, agents gone, label, release) runs against an in-memory cluster in tests/unit/dra/test_dra_switch.py
and against the real cluster in tests/integration/test_dra_switch_cluster.py.
"""
from __future__ import annotations

import http.server
import json
import os
import sys
import threading
from typing import Any, Dict, List, Tuple

import pytest

pytest.importorskip("kubernetes")

from ansible_collections.metax.gpu.plugins.module_utils import names as N  # noqa: E402
from ansible_collections.metax.gpu.plugins.modules import gpu_device_mode  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from module_runner import run_module  # noqa: E402


def pod(name, resources):
    return {"metadata": {"namespace": "ml", "name": name}, "spec": {"nodeName": "gpu-1", "containers": [
        {"name": "c", "resources": resources}]}, "status": {"phase": "Running"}}


class Api:
    """The API server's answers, and the requests seen as (method, path)."""

    def __init__(self, labels=None, pods=(), claims=()):
        self.node = {"kind": "Node", "apiVersion": "v1", "metadata": {
            "name": "gpu-1", "resourceVersion": "5", "labels": dict(labels or {}), "annotations": {}},
            "spec": {}, "status": {"allocatable": {N.RESOURCE_NAME: "8"}}}
        self.pods = list(pods)
        self.claims = list(claims)
        self.slices: List[Dict[str, Any]] = []
        self.seen: List[Tuple[str, str]] = []

    def answer(self, method: str, path: str, body: Any = None) -> Tuple[int, Dict[str, Any]]:
        self.seen.append((method, path))
        if method != "GET":
            return self.write(method, path, body)
        lists = {"/api/v1/pods": ("PodList", self.pods),
                 "/apis/resource.k8s.io/v1/resourceclaims": ("ResourceClaimList", self.claims),
                 "/apis/resource.k8s.io/v1/resourceslices": ("ResourceSliceList", self.slices),
                 "/api/v1/namespaces/metax-gpu/pods": ("PodList", [])}       # the agents' pods: gone
        if path == "/api/v1/nodes/gpu-1":
            return 200, self.node
        if path in lists:
            kind, items = lists[path]
            return 200, {"kind": kind, "apiVersion": "v1", "metadata": {"resourceVersion": "9"}, "items": items}
        return 404, {"kind": "Status", "status": "Failure", "code": 404, "message": "not found"}

    def writes(self):
        return [s for s in self.seen if s[0] != "GET"]

    # -- the writes a switch makes, and the kubelet's part ----------------------------------------------
    def write(self, method: str, path: str, body: Any) -> Tuple[int, Dict[str, Any]]:
        if method == "PATCH" and path == "/api/v1/nodes/gpu-1":
            meta = body.get("metadata") or {}
            if meta.get("resourceVersion") not in (None, self.node["metadata"]["resourceVersion"]):
                return 409, {"kind": "Status", "code": 409, "reason": "Conflict"}
            _merge(self.node, {k: v for k, v in body.items() if k != "metadata"})
            _merge(self.node["metadata"], {k: v for k, v in meta.items() if k != "resourceVersion"})
            self.node["metadata"]["resourceVersion"] = str(int(self.node["metadata"]["resourceVersion"]) + 1)
            if N.LABEL_AGENTS_PAUSED in self.node["metadata"]["labels"]:
                # the paused agents leave at once here; the kubelet zeroes the gone plugin's devices
                self.node["status"]["allocatable"][N.RESOURCE_NAME] = "0"
            return 200, self.node
        if method == "POST" and path.endswith("/eviction"):
            name = path.split("/")[-2]
            self.pods = [p for p in self.pods if p["metadata"]["name"] != name]
            return 201, {"kind": "Eviction", "apiVersion": "policy/v1", "metadata": {"name": name}}
        if method == "DELETE" and path.startswith("/apis/resource.k8s.io/v1/resourceslices/"):
            name = path.rsplit("/", 1)[1]
            self.slices = [s for s in self.slices if s["metadata"]["name"] != name]
            return 200, {"kind": "Status", "status": "Success"}
        return 405, {"kind": "Status", "code": 405}


def _merge(have: Dict[str, Any], patch: Dict[str, Any]) -> None:
    for key, value in patch.items():
        if value is None:
            have.pop(key, None)
        elif isinstance(value, dict):
            _merge(have.setdefault(key, {}), value)
        else:
            have[key] = value


@pytest.fixture
def server(tmp_path):
    holder: Dict[str, Api] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def _serve(self):
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            code, body = holder["api"].answer(self.command, self.path.split("?", 1)[0], json.loads(raw or b"null"))
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_PATCH = do_POST = do_DELETE = _serve  # noqa: N815

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: k\n  cluster:\n    server: "
        "http://127.0.0.1:%d\ncontexts:\n- name: c\n  context:\n    cluster: k\n    user: u\nusers:\n- name: u\n"
        "  user:\n    token: abc\n" % httpd.server_address[1])

    def start(api):
        holder["api"] = api
        return str(kubeconfig)
    yield start
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.parametrize("check_mode", [False, True])
def test_refused_while_a_device_plugin_pod_holds_a_gpu_and_nothing_is_written(server, check_mode):
    api = Api(pods=[pod("train", {"limits": {N.RESOURCE_NAME: "1"}})])
    failed, result = run_module(gpu_device_mode, {"node_name": "gpu-1", "mode": "dra", "kubeconfig": server(api)},
                                check_mode=check_mode)
    assert failed and "refusing to switch node gpu-1 from device-plugin to dra" in result["msg"], result
    assert "ml/train" in result["msg"] and "evict=true" in result["msg"] and result["in_use"] == ["ml/train"]
    assert api.writes() == []


def test_refused_while_a_dra_claim_of_the_node_is_reserved_for_a_pod(server):
    claim = {"metadata": {"namespace": "ml", "name": "c"}, "status": {
        "allocation": {"devices": {"results": [{"request": "g", "driver": N.DRA_DRIVER, "pool": "gpu-1",
                                                "device": "gpu-0000-3b-00-0"}]}},
        "reservedFor": [{"resource": "pods", "name": "infer", "uid": "u"}]}}
    api = Api(labels={N.LABEL_DEVICE_MODE: N.DEVICE_MODE_DRA}, pods=[pod("infer", {"claims": [{"name": "g"}]})],
              claims=[claim])
    failed, result = run_module(gpu_device_mode, {"node_name": "gpu-1", "mode": "device-plugin",
                                                  "kubeconfig": server(api)})
    assert failed and result["in_use"] == ["ml/infer"] and "from dra to device-plugin" in result["msg"], result
    assert api.writes() == []


def test_check_mode_with_evict_reports_the_switch_the_diff_and_the_pods_it_would_evict(server):
    api = Api(pods=[pod("train", {"limits": {N.RESOURCE_NAME: "2"}})])
    failed, result = run_module(gpu_device_mode, {"node_name": "gpu-1", "mode": "dra", "evict": True,
                                                  "kubeconfig": server(api)}, check_mode=True, diff=True)
    assert not failed and result["changed"], result
    assert (result["mode_before"], result["mode"], result["selected"], result["evicted"]) == (
        "device-plugin", "dra", ["ml/train"], [])
    assert result["diff"] == {"before": {"mode": "device-plugin"}, "after": {"mode": "dra"}}
    assert api.writes() == []


def test_a_node_in_its_mode_is_no_change_whatever_holds_it(server):
    api = Api(labels={N.LABEL_DEVICE_MODE: N.DEVICE_MODE_DRA}, pods=[pod("train", {"limits": {N.RESOURCE_NAME: "1"}})])
    failed, result = run_module(gpu_device_mode, {"node_name": "gpu-1", "mode": "dra", "kubeconfig": server(api)})
    assert not failed and not result["changed"] and result["mode"] == "dra", result
    assert api.writes() == []


@pytest.mark.parametrize("args, message", [
    ({"node_name": "a,b"}, "not a node name"),
    ({"node_name": ""}, "not a node name"),
    ({"timeout": -1}, "timeout must not be negative"),
    ({"poll_delay": 0}, "poll_delay must be at least 1"),
    ({"mode": "both"}, "value of mode must be one of"),
])
def test_bad_input_is_refused_before_any_request(server, args, message):
    api = Api()
    full = {"node_name": "gpu-1", "mode": "dra", "kubeconfig": server(api)}
    full.update(args)
    failed, result = run_module(gpu_device_mode, full)
    assert failed and message in result["msg"], result
    assert api.seen == []


def test_a_switch_with_evict_holds_evicts_pauses_labels_and_releases_in_that_order(server):
    api = Api(pods=[pod("train", {"limits": {N.RESOURCE_NAME: "1"}})])
    failed, result = run_module(gpu_device_mode, {"node_name": "gpu-1", "mode": "dra", "evict": True, "poll_delay": 1,
                                                  "kubeconfig": server(api)}, diff=True)
    assert not failed and result["changed"] and result["evicted"] == ["ml/train"], result
    assert result["diff"] == {"before": {"mode": "device-plugin"}, "after": {"mode": "dra"}}
    meta = api.node["metadata"]
    assert meta["labels"] == {N.LABEL_DEVICE_MODE: N.DEVICE_MODE_DRA} and meta["annotations"] == {}
    assert not api.node["spec"].get("unschedulable")
    writes = [w[0] + " " + w[1].rsplit("/", 1)[-1] for w in api.writes()]
    # hold + cordon, the eviction while the agents still run, the pause, the label, the release
    assert writes == ["PATCH gpu-1", "POST eviction", "PATCH gpu-1", "PATCH gpu-1", "PATCH gpu-1"], writes


def test_back_to_the_device_plugin_deletes_what_is_left_of_the_pool(server):
    api = Api(labels={N.LABEL_DEVICE_MODE: N.DEVICE_MODE_DRA})
    api.node["status"]["allocatable"][N.RESOURCE_NAME] = "0"
    api.slices = [{"metadata": {"name": "gpu-1-gpu.metax-tech.com-0"}, "spec": {
        "driver": N.DRA_DRIVER, "nodeName": "gpu-1", "pool": {"name": "gpu-1", "generation": 3},
        "devices": [{"name": "gpu-0000-3b-00-0"}]}}]
    failed, result = run_module(gpu_device_mode, {"node_name": "gpu-1", "mode": "device-plugin", "poll_delay": 1,
                                                  "kubeconfig": server(api)})
    assert not failed and result["changed"] and result["slices_deleted"] == ["gpu-1-gpu.metax-tech.com-0"], result
    assert api.slices == [] and api.node["metadata"]["labels"] == {N.LABEL_DEVICE_MODE: N.DEVICE_MODE_PLUGIN}
