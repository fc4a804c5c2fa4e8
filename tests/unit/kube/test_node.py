# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""kube/node.py: our keys on our own node (raw read, merge patch of only our keys, the 403/404 hints) and
the one routine that strips our keys from nodes."""

from __future__ import annotations

import json
from typing import Any, Dict, List

import pytest

from ansible_collections.metax.gpu.plugins.module_utils import names as N
from ansible_collections.metax.gpu.plugins.module_utils.kube.client import ApiException
from ansible_collections.metax.gpu.plugins.module_utils.kube.node import (
    MERGE_PATCH, NodeChange, NodeUnavailable, OwnNode, matches, merge_patch, patch_metadata, strip, strip_changes)

P = N.PREFIX


class Answer:
    def __init__(self, body: bytes) -> None:
        self.data = body
        self.released = False

    def release_conn(self) -> None:
        self.released = True


class Core:
    """CoreV1Api's node calls as the API server answers them with ``_preload_content=False``."""

    def __init__(self, nodes: Dict[str, Dict[str, Any]], fail: Any = None) -> None:
        self.nodes = nodes
        self.fail = fail
        self.calls: List[tuple] = []
        self.answers: List[Answer] = []

    def _answer(self, body: bytes) -> Answer:
        self.answers.append(Answer(body))
        return self.answers[-1]

    def read_node(self, name, **kwargs):
        self.calls.append(("read", name, kwargs))
        if self.fail is not None:
            raise self.fail
        assert kwargs["_preload_content"] is False
        if name not in self.nodes:
            raise _error(404)
        return self._answer(json.dumps(self.nodes[name]).encode())

    def patch_node(self, name, body, **kwargs):
        self.calls.append(("patch", name, body, kwargs))
        if self.fail is not None:
            raise self.fail
        assert kwargs["_content_type"] == MERGE_PATCH
        meta = self.nodes[name]["metadata"]
        for section, values in body["metadata"].items():
            held = meta.setdefault(section, {})
            for key, value in values.items():
                if value is None:
                    held.pop(key, None)
                else:
                    held[key] = value
        return self._answer(json.dumps(self.nodes[name]).encode())


def _error(status: int) -> ApiException:
    exc = ApiException()
    exc.status, exc.reason = status, {403: "Forbidden", 404: "Not Found"}.get(status, "Error")
    return exc


def node(name, labels=None, annotations=None):
    return {"kind": "Node", "metadata": {"name": name, "labels": labels, "annotations": annotations},
            "status": {"images": [{"names": ["big"]}]}}


def test_our_node_is_read_as_json_and_only_the_keys_given_are_patched():
    core = Core({"n1": node("n1", {"kubernetes.io/hostname": "n1", P + "gpu.count": "8"}, {"other": "x"})})
    own = OwnNode(core, "n1", timeout=3.0)
    assert own.labels() == {"kubernetes.io/hostname": "n1", P + "gpu.count": "8"}
    assert own.annotations() == {"other": "x"}
    assert core.calls[0][2]["_request_timeout"] == 3.0
    assert own.patch({P + "gpu.count": None, P + "gpu.product": "C500"}, {P + "note": "y"})
    assert core.calls[-1][2] == {"metadata": {"labels": {P + "gpu.count": None, P + "gpu.product": "C500"},
                                              "annotations": {P + "note": "y"}}}
    assert own.metadata()["labels"] == {"kubernetes.io/hostname": "n1", P + "gpu.product": "C500"}
    assert own.annotations() == {"other": "x", P + "note": "y"}
    calls = len(core.calls)
    assert not own.patch({}, {}) and not own.patch() and len(core.calls) == calls      # nothing to write: no call
    assert all(answer.released for answer in core.answers)                            # every connection given back


def test_an_answer_that_is_not_json_reads_as_no_metadata():
    core = Core({})
    core.read_node = lambda name, **kwargs: core._answer(b"<html>a proxy's error page</html>")
    assert OwnNode(core, "n1").metadata() == {} and core.answers[-1].released


@pytest.mark.parametrize("status, hint", [(403, "RBAC: the service account needs get and patch on nodes"),
                                          (404, "is --node-name right?")])
def test_a_refusal_is_one_line_with_its_hint(status, hint):
    core = Core({"n1": node("n1")}, fail=_error(status))
    with pytest.raises(NodeUnavailable) as read:
        OwnNode(core, "n1").labels()
    assert str(read.value) == "get node n1: HTTP %d %s (%s)" % (status, _error(status).reason, hint)
    assert read.value.status == status
    with pytest.raises(NodeUnavailable, match="patch node n1: HTTP %d" % status):
        OwnNode(core, "n1").patch({P + "x": "1"})


def test_an_unreachable_server_is_node_unavailable():
    core = Core({"n1": node("n1")}, fail=ConnectionRefusedError("connection refused"))
    with pytest.raises(NodeUnavailable, match="get node n1: connection refused"):
        OwnNode(core, "n1").metadata()


def test_merge_patch_and_patch_metadata():
    assert merge_patch() == {} and merge_patch({}, {}) == {}
    assert merge_patch(annotations={"a": "1"}) == {"metadata": {"annotations": {"a": "1"}}}
    core = Core({"n1": node("n1", {P + "a": "1"})})
    assert not patch_metadata(core, "n1") and core.calls == []
    assert patch_metadata(core, "n1", {P + "a": None}) and core.nodes["n1"]["metadata"]["labels"] == {}


@pytest.mark.parametrize("key, patterns, found", [
    (P + "gpu.count", [P], True),                     # under a prefix ending in "/"
    (P + "gpu.vfnum.state", [P + "gpu.vfnum."], True),  # ... or in "."
    (P + "gpu.vfnum", [P + "gpu.vfnum."], False),
    (P + "driver.ready", [P + "driver.ready"], True),  # the key itself
    (P + "driver.ready-x", [P + "driver.ready"], False),
    ("x." + P + "k", [P], False),                     # another domain that ends like ours
])
def test_patterns(key, patterns, found):
    assert matches(key, patterns) is found


def test_strip_removes_only_the_matching_keys_from_the_nodes_that_carry_them():
    nodes = {"a": node("a", {P + "gpu.count": "8", "kubernetes.io/hostname": "a"}, {P + "gpu.devices": "[]"}),
             "b": node("b", {"kubernetes.io/hostname": "b"}),
             "c": node("c", None, {P + "gpu.devices": "[]", P + "keep": "1"}),
             "d": node("d", {P + "gpu.count": "2"})}
    listed = [json.loads(json.dumps(n)) for n in nodes.values()]
    assert strip_changes(listed, [P], [P + "gpu."], skip=["d"]) == [
        NodeChange("a", {P + "gpu.count": "8"}, {P + "gpu.devices": "[]"}),
        NodeChange("c", {}, {P + "gpu.devices": "[]"})]
    core = Core(nodes)
    planned = strip(core, listed, [P], [P + "gpu."], skip=["d"], check_mode=True)
    assert [c.name for c in planned] == ["a", "c"] and core.calls == []                # check mode: nothing sent
    done: List[NodeChange] = []
    assert strip(core, listed, [P], [P + "gpu."], skip=["d"], done=done) == done == planned
    assert [(c[1], c[2]) for c in core.calls] == [
        ("a", {"metadata": {"labels": {P + "gpu.count": None}, "annotations": {P + "gpu.devices": None}}}),
        ("c", {"metadata": {"annotations": {P + "gpu.devices": None}}})]
    assert nodes["a"]["metadata"]["labels"] == {"kubernetes.io/hostname": "a"}
    assert nodes["c"]["metadata"]["annotations"] == {P + "keep": "1"} and nodes["d"]["metadata"]["labels"]


def test_strip_reports_what_it_changed_before_a_failure():
    nodes = {"a": node("a", {P + "x": "1"}), "b": node("b", {P + "x": "1"})}
    core = Core(nodes)
    real = core.patch_node

    def second_fails(name, body, **kwargs):
        if name == "b":
            raise _error(403)
        return real(name, body, **kwargs)
    core.patch_node = second_fails
    done: List[NodeChange] = []
    with pytest.raises(ApiException):
        strip(core, list(nodes.values()), [P], [P], done=done)
    assert [c.name for c in done] == ["a"]


def test_the_whole_node_is_read_for_its_status_too():
    core = Core({"n1": dict(node("n1"), status={"nodeInfo": {"containerRuntimeVersion": "containerd://1.7.2"}})})
    assert OwnNode(core, "n1").read()["status"]["nodeInfo"]["containerRuntimeVersion"] == "containerd://1.7.2"
