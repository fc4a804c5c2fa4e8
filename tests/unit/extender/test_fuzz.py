# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Mutated copies of real kube-scheduler bodies through the real HTTP server (issue 12).

Every body stays valid JSON but gets wrong types, missing keys, repeated or
unknown node names ('fake-gpu-node'), a NodeNames that disagrees with Nodes...
gpu-aware must answer each with 2xx or 4xx, never 5xx, and a 4xx must name
the field that is wrong: the field its ``Error`` starts with (or a node it
refers to) lies on the path of one of the mutations.

Seeded, so a failure replays: the assertion message carries the seed, the
case number and the mutations.
"""
from __future__ import annotations

import copy
import json
import logging
import random
import re
from typing import Any, List, Sequence, Tuple, Union

import pytest

from extender_support import extender_args, gpu_pod, load_fixture, make_node
from test_http import Running

SEED = 12
CASES = 2500            # bodies; each is POSTed to /filter and /prioritize
Path = Tuple[Union[str, int], ...]

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_REFERENCE = re.compile(r"(Nodes\.items\[\d+\]|NodeNames\[\d+\])")
_PALETTE: List[Any] = [True, False, 0, -3, 1.5, 1e308, "", "x", "2", "fake-gpu-node", None, [], {}, [True],
                       ["fake-gpu-node"], {"a": 1.5}, [[1]], {"items": False}]


def render(path: Sequence[Union[str, int]]) -> str:
    """A path as gpu-aware writes fields: ``Pod.spec.containers[0].resources.limits["metax-tech.com/gpu"]``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += "[%d]" % part
        elif _IDENT.match(part):
            out += ("." if out else "") + part
        else:
            out += '["%s"]' % part
    return out


def _paths(value: Any, path: Path = ()) -> List[Path]:
    found = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, path + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _paths(item, path + (index,))
    return found


def _at(document: Any, path: Path) -> Any:
    for part in path:
        document = document[part]
    return document


def _node_names(document: Any) -> List[str]:
    """The names in Nodes.items that earlier mutations left intact."""
    nodes = document.get("Nodes")
    items = nodes.get("items") if isinstance(nodes, dict) else None
    names: List[str] = []
    for node in items if isinstance(items, list) else ():
        metadata = node.get("metadata") if isinstance(node, dict) else None
        name = metadata.get("name") if isinstance(metadata, dict) else None
        if isinstance(name, str):
            names.append(name)
    return names


def mutate(document: Any, rng: random.Random) -> Tuple[Any, List[str]]:
    """1-3 mutations of a copy of ``document``; returns it and the rendered paths touched."""
    document = copy.deepcopy(document)
    touched: List[str] = []
    for _round in range(rng.randint(1, 3)):
        paths = [p for p in _paths(document) if p]
        path = rng.choice(paths)
        parent = _at(document, path[:-1])
        key = path[-1]
        names = _node_names(document)
        roll = rng.random()
        if roll < 0.15 and isinstance(parent, dict):
            del parent[key]                                   # a missing key
        elif roll < 0.25 and isinstance(parent, list):
            parent.append(copy.deepcopy(parent[int(key)]))    # a repeated entry (a repeated node)
            path = path[:-1] + (len(parent) - 1,)
        elif roll < 0.35 and names and isinstance(document.get("Nodes"), dict):
            # the scheduler's two forms at once, naming a node that is not among the Nodes
            listed = names + ["fake-gpu-node"] if rng.random() < 0.5 else rng.sample(names, len(names))
            document["NodeNames"] = listed
            path = ("NodeNames",)
        elif roll < 0.45 and path[-1] == "name" and names:
            parent[key] = rng.choice(names + ["fake-gpu-node"])
        else:
            parent[key] = copy.deepcopy(rng.choice(_PALETTE))
        touched.append(render(path))
    return document, touched


def fields_named(error: str) -> List[str]:
    """The fields an ``Error`` names: the one before ': ' and the nodes it refers to."""
    head = error.split(": ", 1)[0]
    return head.split(" and ") + _REFERENCE.findall(error)


def related(field: str, path: str) -> bool:
    return field.startswith(path) or path.startswith(field)


def _documents() -> List[Any]:
    documents = [json.loads(load_fixture("kube-scheduler-1.36-nodes.json")),
                 json.loads(load_fixture("kube-scheduler-1.36-nodenames.json"))]
    # Nodes that fail for both reasons, so that the FailedNodes and the FailedAndUnresolvableNodes
    # paths see the mutated names too.
    small = make_node(2, devices=2)
    small["status"]["capacity"]["metax-tech.com/gpu"] = "2"
    nodes = [make_node(0), make_node(1, allocated=[0, 1, 2, 3, 4, 5, 6]), small]
    for node in nodes:
        node["status"]["images"] = node["status"]["images"][:2]      # smaller bodies, more cases per second
    documents.append(json.loads(extender_args(gpu_pod(3), nodes)))
    return documents


def _hosts(document: Any) -> List[str]:
    """The candidate names of a body gpu-aware accepted (so its shape is known good)."""
    if document.get("NodeNames") is not None:
        return document["NodeNames"]
    return [node["metadata"]["name"] for node in document["Nodes"].get("items") or ()]


def _check(verb: str, status: int, answer: Any, touched: List[str], document: Any) -> str:
    """'' when the answer is acceptable, else what is wrong with it."""
    if status >= 500 or not 200 <= status < 500 or 300 <= status < 400:
        return "status %d" % status
    if status >= 400:
        error = answer.get("Error", "") if isinstance(answer, dict) else ""
        if not error or not any(related(f, p) for f in fields_named(error) for p in touched):
            return "%d whose Error %r names none of the fields touched" % (status, error)
        return ""
    if verb == "filter":
        if not isinstance(answer, dict) or answer.get("Error") != "":
            return "200 filter answer without an empty Error: %r" % (answer,)
        return ""
    if not isinstance(answer, list) or any(not 0 <= h["Score"] <= 10 for h in answer):
        return "200 prioritize answer is not a HostPriorityList: %r" % (answer,)
    if [h["Host"] for h in answer] != _hosts(document):
        return "200 prioritize answer is for other hosts: %r" % ([h["Host"] for h in answer],)
    return ""


@pytest.fixture
def server():
    logger = logging.getLogger("test-http")
    level = logger.level
    logger.setLevel(logging.ERROR)          # 400s are logged as warnings: thousands of them here
    srv = Running()
    yield srv
    srv.stop()
    logger.setLevel(level)


def test_mutated_scheduler_bodies_get_2xx_or_a_4xx_naming_the_field(server):
    rng = random.Random(SEED)
    documents = _documents()
    conn = server.connection()
    statuses = {"filter": {}, "prioritize": {}}
    failures: List[str] = []
    for case in range(CASES):
        document, touched = mutate(rng.choice(documents), rng)
        body = json.dumps(document, separators=(",", ":")).encode()
        for verb in ("filter", "prioritize"):
            status, data, _resp = server.request("POST", "/" + verb, body, conn=conn)
            statuses[verb][status] = statuses[verb].get(status, 0) + 1
            problem = _check(verb, status, json.loads(data), touched, document)
            if problem:
                failures.append("seed %d case %d %s, mutations at %s: %s" % (SEED, case, verb, touched, problem))
    conn.close()
    assert not failures, "%d bad answers, first ones:\n%s" % (len(failures), "\n".join(failures[:10]))
    for verb, seen in statuses.items():
        # the mutations exercise both outcomes, or the test proves nothing
        assert seen.get(200, 0) > CASES // 10 and seen.get(400, 0) > CASES // 10, (verb, seen)
    assert server.request("GET", "/healthz")[0] == 200


@pytest.mark.parametrize("path, expected", [
    (("Pod",), "Pod"),
    (("Nodes", "items", 0, "metadata", "annotations", "metax-tech.com/gpu.devices"),
     'Nodes.items[0].metadata.annotations["metax-tech.com/gpu.devices"]'),
])
def test_render(path, expected):
    assert render(path) == expected


def test_related_fields():
    assert related("Pod.spec.containers[0]", "Pod.spec")
    assert related("Pod.spec", "Pod.spec.containers[0].resources")
    assert not related("Pod.spec", "Nodes.items[0]")
    assert fields_named('NodeNames: lacks "a", which Nodes.items[2] names') == ["NodeNames", "Nodes.items[2]"]
    assert fields_named("Nodes and NodeNames: both missing or null") == ["Nodes", "NodeNames"]
