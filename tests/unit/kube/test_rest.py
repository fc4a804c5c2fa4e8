# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""kube/rest.JsonApi against a real HTTP server on 127.0.0.1 that records each request and answers what
the test gives it: the paths and query parameters of the client's operation names, the content types,
JSON in and out, the raw answer, error answers as the client's ApiException. The credentials and
headers of every kind of connection: test_client_auth.py; the real API server: the integration tests."""

from __future__ import annotations

import datetime
import http.server
import json
import threading
from typing import Any, Dict, Iterator, List, Tuple
from urllib.parse import parse_qsl, urlsplit

import pytest
from kubernetes import client as k8s_client

from ansible_collections.metax.gpu.plugins.module_utils.kube import client as kube
from ansible_collections.metax.gpu.plugins.module_utils.kube.client import ApiException, KubeClientError
from ansible_collections.metax.gpu.plugins.module_utils.kube.pages import NotJson


class _Server:
    """Records (method, path, query, headers, body); answers ``self.answer`` (status, content type, bytes)."""

    def __init__(self) -> None:
        self.seen: List[Dict[str, Any]] = []
        self.answer: Tuple[int, str, bytes] = (200, "application/json", b'{"kind": "Status"}')
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _any(self) -> None:
                url = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                server.seen.append({"method": self.command, "path": url.path, "query": dict(parse_qsl(url.query)),
                                    "headers": self.headers, "body": self.rfile.read(length) if length else b""})
                status, content_type, body = server.answer
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _any

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server()
    yield srv
    srv.httpd.shutdown()
    srv.httpd.server_close()


def _api(server: _Server, **api_key: str) -> Any:
    configuration = k8s_client.Configuration()
    configuration.host = server.url
    configuration.api_key = dict(api_key)
    return kube.json_api(k8s_client.ApiClient(configuration))


def test_a_list_sends_the_clients_query_names_and_answers_the_json(server):
    server.answer = (200, "application/json", json.dumps({"items": [{"metadata": {"name": "p"}}]}).encode())
    found = _api(server).list_namespaced_pod("ml", label_selector="app=x", field_selector="spec.nodeName=n 1",
                                             limit=5, _continue="tok", watch=False, resource_version=None)
    assert found == {"items": [{"metadata": {"name": "p"}}]}
    (request,) = server.seen
    assert (request["method"], request["path"]) == ("GET", "/api/v1/namespaces/ml/pods")
    # None is not sent; a boolean is the API's true/false
    assert request["query"] == {"labelSelector": "app=x", "fieldSelector": "spec.nodeName=n 1", "limit": "5",
                                "continue": "tok", "watch": "false"}
    assert request["headers"]["Accept"] == "application/json"


@pytest.mark.parametrize("body, given, sent", [
    ({"metadata": {"labels": {"a": None}}}, None, "application/strategic-merge-patch+json"),
    ([{"op": "remove", "path": "/spec/unschedulable"}], None, "application/json-patch+json"),
    ({"metadata": {"labels": {"a": None}}}, "application/merge-patch+json", "application/merge-patch+json"),
])
def test_a_patch_goes_with_the_content_type_the_client_would_pick(server, body, given, sent):
    _api(server).patch_node("gpu 1", body, **({"_content_type": given} if given else {}))
    (request,) = server.seen
    assert (request["method"], request["path"]) == ("PATCH", "/api/v1/nodes/gpu%201")
    assert request["headers"]["Content-Type"] == sent and json.loads(request["body"]) == body


def test_a_create_sends_json_with_times_as_the_client_writes_them(server):
    when = datetime.datetime(2026, 11, 29, 17, 0, tzinfo=datetime.timezone.utc)
    _api(server).create_namespaced_event("metax-gpu", {"reason": "Test", "firstTimestamp": when})
    (request,) = server.seen
    assert (request["method"], request["path"]) == ("POST", "/api/v1/namespaces/metax-gpu/events")
    assert request["headers"]["Content-Type"] == "application/json"
    assert json.loads(request["body"]) == {"reason": "Test", "firstTimestamp": "2026-11-29T17:00:00+00:00"}


def test_the_paths_of_leases_workloads_and_any_group(server):
    api = _api(server)
    api.replace_namespaced_lease("slot-0", "ns", {"metadata": {"name": "slot-0"}})
    api.delete_namespaced_lease("slot-0", "ns", body={"preconditions": {"resourceVersion": "7"}})
    api.read_namespaced_daemon_set("metax-gpu-device", "ns")
    api.get_namespaced_custom_object("resource.k8s.io", "v1", "ns", "resourceclaims", "claim")
    api.delete_cluster_custom_object("resource.k8s.io", "v1", "resourceslices", "slice")
    api.delete_namespaced_pod("p", "ns", grace_period_seconds=0)
    assert [(r["method"], r["path"]) for r in server.seen] == [
        ("PUT", "/apis/coordination.k8s.io/v1/namespaces/ns/leases/slot-0"),
        ("DELETE", "/apis/coordination.k8s.io/v1/namespaces/ns/leases/slot-0"),
        ("GET", "/apis/apps/v1/namespaces/ns/daemonsets/metax-gpu-device"),
        ("GET", "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/claim"),
        ("DELETE", "/apis/resource.k8s.io/v1/resourceslices/slice"),
        ("DELETE", "/api/v1/namespaces/ns/pods/p")]
    assert json.loads(server.seen[1]["body"]) == {"preconditions": {"resourceVersion": "7"}}
    assert server.seen[-1]["query"] == {"gracePeriodSeconds": "0"} and server.seen[-1]["body"] == b""


def test_an_error_answer_is_the_clients_api_exception_with_the_servers_message(server):
    server.answer = (404, "application/json", b'{"kind": "Status", "message": "nodes \\"x\\" not found"}')
    with pytest.raises(ApiException) as caught:
        _api(server).read_node("x", _preload_content=False)
    assert caught.value.status == 404 and caught.value.reason == "Not Found"
    assert json.loads(caught.value.body)["message"] == 'nodes "x" not found'


def test_the_raw_answer_is_left_to_the_caller_and_an_empty_one_is_no_object(server):
    server.answer = (200, "application/json", b'{"metadata": {"name": "x"}}')
    raw = _api(server).read_node("x", _preload_content=False)
    assert json.loads(raw.data) == {"metadata": {"name": "x"}}
    raw.release_conn()
    server.answer = (200, "application/json", b"")
    assert _api(server).read_node("x") == {}


def test_a_success_that_is_not_json_is_an_error_not_an_empty_list(server):
    server.answer = (200, "text/html", b"<html>a proxy's page</html>")
    with pytest.raises(NotJson):
        _api(server).list_pod_for_all_namespaces(field_selector="spec.nodeName=n")


def test_the_token_goes_under_either_key_the_client_versions_keep_it(server):
    _api(server, BearerToken="Bearer new-key").list_node()
    _api(server, authorization="Bearer old-key").list_node()      # kubernetes <= 36's key
    assert [r["headers"]["authorization"] for r in server.seen] == ["Bearer new-key", "Bearer old-key"]


@pytest.mark.parametrize("name", ["..", ".", ""])
def test_a_dot_segment_or_empty_name_is_refused_before_any_request(server, name):
    api = _api(server)
    with pytest.raises(KubeClientError):
        api.delete_namespaced_pod(name, "ns")          # urllib3 would resolve "..": the namespace itself
    with pytest.raises(KubeClientError):
        api.read_namespaced_pod("p", name)
    assert server.seen == []


def test_a_name_with_a_slash_stays_one_segment(server):
    _api(server).read_namespaced_pod("../secrets", "ns")
    assert server.seen[0]["path"] == "/api/v1/namespaces/ns/pods/..%2Fsecrets"
