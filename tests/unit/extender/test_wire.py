# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""ExtenderArgs parsing (strict, spans kept) and the result encodings."""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible_collections.metax.gpu.plugins.module_utils.extender import wire
from ansible_collections.metax.gpu.plugins.module_utils.extender.wire import (
    BadRequest, error_result, filter_result_names, filter_result_nodes, parse_args, priority_list)
from extender_support import extender_args, gpu_pod, load_fixture, make_node


def _names(node):
    return node["metadata"]["name"]


def test_captured_nodes_form():
    body = load_fixture("kube-scheduler-1.36-nodes.json")
    args = parse_args(body, _names)
    document = json.loads(body)
    assert not args.node_names_form
    assert args.pod == document["Pod"]
    assert args.names == ["gpu-aware-capture-a", "gpu-aware-capture-b"] or \
        args.names == [n["metadata"]["name"] for n in document["Nodes"]["items"]]
    assert args.extracted == args.names
    for (start, end), node in zip(args.spans, document["Nodes"]["items"]):
        assert json.loads(args.text[start:end]) == node


def test_captured_node_names_form():
    body = load_fixture("kube-scheduler-1.36-nodenames.json")
    args = parse_args(body, _names)
    assert args.node_names_form
    assert args.names == json.loads(body)["NodeNames"]
    assert args.extracted == [] and args.spans == []


def test_filter_result_echoes_the_original_nodes():
    nodes = [make_node(i) for i in range(3)]
    args = parse_args(extender_args(gpu_pod(1), nodes), _names)
    result = json.loads(b"".join(filter_result_nodes(args, [0, 2], {"gpu-node-00001": "busy"}, {})))
    assert result["Nodes"]["items"] == [nodes[0], nodes[2]]
    assert result["FailedNodes"] == {"gpu-node-00001": "busy"}
    assert result["FailedAndUnresolvableNodes"] == {}
    assert result["Error"] == ""


def test_other_results():
    assert json.loads(filter_result_names(["a"], {}, {"b": "x"})) == {
        "NodeNames": ["a"], "FailedNodes": {}, "FailedAndUnresolvableNodes": {"b": "x"}, "Error": ""}
    assert json.loads(filter_result_names([], {}, {}))["NodeNames"] == []
    expected = [{"Host": "a", "Score": 3}, {"Host": "b\"c", "Score": 10}]
    assert json.loads(priority_list(["a", "b\"c"], [3, 10])) == expected
    assert json.loads(priority_list([], [])) == []
    assert json.loads(error_result("bad")) == {"Error": "bad"}


def test_whitespace_case_and_extra_fields():
    body = b' { "pod" : {"metadata":{}} , "nodes" : { "kind":"NodeList", "ITEMS" : [ {"metadata":{"name":"a"}} ,' \
           b'\n{"metadata":{"name":"b"}} ] , "x":[1,{"y":null}] } , "Other": 1 }\n'
    args = parse_args(body, _names)
    assert args.names == ["a", "b"]
    assert args.text[args.spans[1][0]:args.spans[1][1]] == '{"metadata":{"name":"b"}}'


def test_empty_and_null_items():
    assert parse_args(b'{"Pod":{},"Nodes":{"metadata":{},"items":null},"NodeNames":null}', _names).names == []
    assert parse_args(b'{"Pod":{},"Nodes":{"items":[]}}', _names).names == []
    assert parse_args(b'{"Pod":{},"Nodes":null,"NodeNames":[]}', _names).node_names_form


def test_non_ascii_is_kept_exactly():
    nodes = [{"metadata": {"name": "n\u00e9", "labels": {"k": "\u6c90\u66e6 \\ \""}}}]
    body = json.dumps({"Pod": {}, "Nodes": {"items": nodes}}, ensure_ascii=False).encode()
    args = parse_args(body, _names)
    out = json.loads(b"".join(filter_result_nodes(args, [0], {}, {})).decode())
    assert out["Nodes"]["items"] == nodes


@pytest.mark.parametrize("body, message", [
    (b"", "expected '{'"),
    (b"{bad", "object key"),
    (b"[]", "expected '{'"),
    (b'{"Pod":{}', "end of body"),
    (b'{"Pod":{}}', "Nodes and NodeNames: both missing or null"),
    (b'{"Nodes":{"items":[]}}', "Pod"),
    (b'{"Pod":[],"Nodes":{"items":[]}}', "Pod"),
    (b'{"Pod":{},"NodeNames":"a"}', "NodeNames: expected an array of strings or null, got string"),
    (b'{"Pod":{},"NodeNames":[1]}', "NodeNames"),
    (b'{"Pod":{},"Nodes":{"items":[1]}}', "Nodes.items[0]: expected an object, got number"),
    (b'{"Pod":{},"Nodes":{"items":[{"metadata":{"name":"a"}},{"metadata":{"name":"a"}}]}}',
     'Nodes.items[1].metadata.name: "a" repeats Nodes.items[0]'),
    (b'{"Pod":{},"NodeNames":["a","b","a"]}', 'NodeNames[2]: "a" repeats NodeNames[0]'),
    (b'{"Pod":{},"NodeNames":["a",false]}', "NodeNames[1]: expected a string, got boolean"),
    (b'{"Pod":{},"Nodes":{"items":[{"metadata":{"name":"a"}}]},"NodeNames":["fake-gpu-node"]}',
     'NodeNames[0]: "fake-gpu-node" is not among Nodes.items'),
    (b'{"Pod":{},"Nodes":{"items":[{"metadata":{"name":"a"}}]},"NodeNames":[]}',
     'NodeNames: lacks "a", which Nodes.items[0] names'),
    (b'{"Pod":{},"Nodes":true}', "Nodes: expected an object or null, got boolean"),
    (b'{"Pod":{},"Nodes":{"items":2.5}}', "Nodes.items: expected an array or null, got number"),
    (b'{"Pod":{},"Nodes":{"items":[{"metadata":[]}]}}', "Nodes.items[0].metadata: expected an object, got array"),
    (b'{"Pod":{},"Nodes":{"items":[{"metadata":{"name":"a","annotations":{"metax-tech.com/gpu.topology.scores":{}}}}]}}',
     'Nodes.items[0].metadata.annotations["metax-tech.com/gpu.topology.scores"]: expected a string, got object'),
    (b'{"Pod":{},"Nodes":{"items":[{"metadata":{"name":"a"},"status":{"capacity":{"metax-tech.com/gpu":true}}}]}}',
     'Nodes.items[0].status.capacity["metax-tech.com/gpu"]: True is not a quantity'),
    (b'{"Pod":{},"Nodes":{"items":[{"metadata":{"name":"a"},"status":{"allocatable":[]}}]}}',
     "Nodes.items[0].status.allocatable: expected an object or null, got array"),
    (b'{"Pod":false,"NodeNames":[]}', "Pod: expected an object, got boolean"),
    (b'{"NodeNames":[]}', "Pod: missing"),
    (b'[1, 2]', "ExtenderArgs: expected '{' (the body is a JSON array"),
    (b'{"Pod":{},"Nodes":{"items":[{"metadata":{}}]}}', "metadata.name"),
    (b'{"Pod":{},"Nodes":{"items":[{"metadata":{"name":"a"}}}}', "Nodes.items"),
    (b'{"Pod":{},"Nodes":{"items":{}}}', "Nodes.items"),
    (b'{"Pod":{},"Nodes":[]}', "an object"),
    (b'{"Pod":{},"Nodes":{"items":[]}} x', "extra data"),
    (b'{"Pod":{},"Nodes":{"items":[]},}', "object key"),
    (b'{"Pod":{"a":tru},"Nodes":null}', "malformed JSON"),
    (b'\xff\xfe', "UTF-8"),
    (b'{"Pod":' + b"[" * 100000 + b"]" * 100000 + b"}", "malformed JSON"),
])
def test_malformed_bodies(body, message):
    with pytest.raises(BadRequest) as caught:
        parse_args(body, _names)
    assert message in str(caught.value)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=10)


@settings(deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(json_values, st.lists(st.tuples(st.text(min_size=1, max_size=10), json_values), max_size=5,
                             unique_by=lambda pair: pair[0]),
       st.booleans(), st.sampled_from([None, 0, 2]))
def test_parse_agrees_with_json(pod_extra, nodes, names_form, indent):
    pod = {"metadata": {"name": "p"}, "x": pod_extra}
    items = [{"metadata": {"name": name}, "extra": extra} for name, extra in nodes]
    if names_form:
        document = {"Pod": pod, "Nodes": None, "NodeNames": [pair[0] for pair in nodes]}
    else:
        document = {"Pod": pod, "Nodes": {"metadata": {}, "items": items}, "NodeNames": None}
    body = json.dumps(document, indent=indent).encode()
    args = parse_args(body, lambda node: node)
    assert args.pod == pod
    assert args.names == [pair[0] for pair in nodes]
    if not names_form:
        assert args.extracted == items
        assert [json.loads(args.text[a:b]) for a, b in args.spans] == items


@settings(deadline=None, max_examples=300)
@given(st.binary(max_size=200) | st.text(alphabet='{}[]":,0123456789 .-etruflasnNPodeIm', max_size=120)
       .map(lambda s: s.encode()))
def test_garbage_never_escapes_as_another_error(body):
    try:
        parse_args(body, lambda node: node)
    except BadRequest:
        pass


@settings(deadline=None, max_examples=150)
@given(st.lists(st.text(max_size=12), max_size=8, unique=True), st.data())
def test_encoders_round_trip(names, data):
    scores = data.draw(st.lists(st.integers(0, 10), min_size=len(names), max_size=len(names)))
    reasons = data.draw(st.lists(st.sampled_from(["busy", 'odd "reason"', "r\\x", "\u6c90"]), min_size=len(names),
                                 max_size=len(names)))
    failed = dict(zip(names, reasons))
    plain = parse_args(extender_args({}, names=names), _names).plain_names
    for hint in sorted({plain, False}):
        assert json.loads(priority_list(names, scores, hint)) == [{"Host": n, "Score": s}
                                                                  for n, s in zip(names, scores)]
        result = json.loads(filter_result_names(names, failed, {}, hint))
        assert result["NodeNames"] == names and result["FailedNodes"] == failed
        same = dict.fromkeys(names, "gpu-aware: same reason")
        assert json.loads(filter_result_names([], same, same, hint))["FailedAndUnresolvableNodes"] == same


@pytest.mark.parametrize("name, plain", [
    ("kwok-gpu-00001", True), ("gpu-node.example.com", True), ("", True),
    ('a"b', False), ("a\\b", False), ("a\nb", False), ("a\x00b", False), ("a\x1fb", False), ("a\x7fb", False),
    ("\u6c90", False), ("caf\u00e9", False),
])
def test_plain_names_is_false_exactly_when_a_name_needs_escaping(name, plain):
    # plain_names lets the encoders copy names without escaping: a wrong True would emit broken JSON.
    args = parse_args(extender_args({}, names=["kwok-gpu-00000", name]), _names)
    assert args.plain_names is plain
    assert json.loads(priority_list(args.names, [1, 2], args.plain_names)) == [
        {"Host": "kwok-gpu-00000", "Score": 1}, {"Host": name, "Score": 2}]


def _go_body(pod, names):
    """kube-scheduler's own encoding of the NodeNames form (compact, struct field order)."""
    return json.dumps({"Pod": pod, "Nodes": None, "NodeNames": names}, separators=(",", ":")).encode()


@settings(deadline=None, max_examples=150)
@given(json_values, st.lists(st.text(min_size=1, max_size=10), max_size=5, unique=True))
def test_kube_schedulers_encoding_parses_as_any_other(pod_extra, names):
    # _go_names_form takes kube-scheduler's exact shape without the general walk: same result.
    pod = {"metadata": {"name": "p"}, "x": pod_extra}
    fast = parse_args(_go_body(pod, names), _names)
    walked = parse_args(json.dumps({"Pod": pod, "Nodes": None, "NodeNames": names}, indent=1).encode(), _names)
    assert (fast.pod, fast.names, fast.node_names_form, fast.plain_names) == (
        walked.pod, walked.names, walked.node_names_form, walked.plain_names) == (pod, names, True, fast.plain_names)


@pytest.mark.parametrize("body, message", [
    # kube-scheduler's shape, but wrong inside: the general walk words the error as before
    (b'{"Pod":[],"Nodes":null,"NodeNames":["a"]}', "Pod: expected an object, got array"),
    (b'{"Pod":{},"Nodes":null,"NodeNames":["a",1]}', "NodeNames[1]: expected a string, got number"),
    (b'{"Pod":{},"Nodes":null,"NodeNames":["a","a"]}', 'NodeNames[1]: "a" repeats NodeNames[0]'),
    (b'{"Pod":{},"Nodes":null,"NodeNames":null}', "Nodes and NodeNames: both missing or null"),
    (b'{"Pod":{},"Nodes":null,"NodeNames":["a"]}}', "malformed JSON: extra data"),
    (b'{"Pod":{"a":1,"Nodes":null,"NodeNames":[]},"Nodes":null,"NodeNames":{"x":1}}',
     "NodeNames: expected an array of strings or null, got object"),
    (b'{"Pod":{},"Nodes":null,"NodeNames":[{"a":{},"Nodes":null,"NodeNames":["b"]}]}',
     "NodeNames[0]: expected a string, got object"),
])
def test_kube_schedulers_shape_with_bad_values(body, message):
    with pytest.raises(BadRequest) as caught:
        parse_args(body, _names)
    assert message in str(caught.value)


def test_a_pod_decoded_once_serves_the_calls_that_send_it():
    # filter and prioritize of one pod send it byte for byte: the second call gets the same object.
    memo = wire.POD_MEMO
    names = ["n%d" % i for i in range(3)]
    first = parse_args(_go_body(gpu_pod(1, "a"), names), _names).pod
    assert parse_args(_go_body(gpu_pod(1, "a"), names[:1]), _names).pod is first
    # another pod, or the same pod changed (its requests), is decoded anew
    other = parse_args(_go_body(gpu_pod(2, "a"), names), _names).pod
    assert other is not first and other == gpu_pod(2, "a")
    # bounded: the oldest of more than size pods is forgotten
    for index in range(memo.size):
        parse_args(_go_body(gpu_pod(1, "p%d" % index), names), _names)
    again = parse_args(_go_body(gpu_pod(1, "a"), names), _names).pod
    assert again is not first and again == first
    assert len(memo._pods) <= memo.size      # pylint: disable=protected-access


def test_a_captured_kube_scheduler_body_takes_the_direct_path():
    # The direct path must match what a real kube-scheduler sends, or it would never be taken: only that
    # path keeps the Pod, so the second parse of the captured body returns the first one's object.
    body = load_fixture("kube-scheduler-1.36-nodenames.json")
    assert parse_args(body, _names).pod is parse_args(body, _names).pod
    nodes_form = load_fixture("kube-scheduler-1.36-nodes.json")
    assert parse_args(nodes_form, _names).pod is not parse_args(nodes_form, _names).pod
