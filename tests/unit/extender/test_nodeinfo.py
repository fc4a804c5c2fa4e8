# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""What gpu-aware reads from a Node: free/total devices and the per-count tables."""
from __future__ import annotations

import json

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.extender.nodeinfo import (
    ANNOTATION_DEVICES, ANNOTATION_LOSSES, ANNOTATION_SCORES, StateCache, gpu_state, node_fields)
from extender_support import GPU, annotations, make_node


def _node(annots=None, capacity=None, allocatable=None):
    status = {}
    if capacity is not None:
        status["capacity"] = {GPU: capacity, "cpu": "8"}
    if allocatable is not None:
        status["allocatable"] = {GPU: allocatable}
    return {"metadata": {"name": "n", "annotations": annots or {}}, "status": status}


def _state(node):
    return gpu_state(node_fields(node))


def test_devices_annotation_gives_free_and_total():
    state = _state(_node(annotations(8, allocated=[0, 1], unhealthy=[7]), capacity="8", allocatable="7"))
    assert (state.total, state.free, state.source) == (8, 5, "devices")
    assert sorted(state.scores) == [1, 2, 3, 4, 5]
    assert state.table(2) == (state.scores[2], state.losses[2])
    assert state.table(6) is None
    assert state.problems == ()


def test_scores_fallback_then_allocatable():
    annots = annotations(8, allocated=[0, 1, 2])
    del annots[ANNOTATION_DEVICES]
    state = _state(_node(annots, capacity="8", allocatable="8"))
    assert (state.total, state.free, state.source) == (8, 5, "scores")
    state = _state(_node({}, capacity="8", allocatable="6"))
    assert (state.total, state.free, state.source, state.scores) == (8, 6, "allocatable", None)
    state = _state(_node({}, allocatable="4"))
    assert (state.total, state.free) == (4, 4)
    state = _state(_node({}))
    assert (state.total, state.free, state.source) == (0, 0, "none")


def test_empty_tables_mean_no_free_device():
    state = _state(_node({ANNOTATION_SCORES: "{}", ANNOTATION_LOSSES: "{}"}, capacity="8", allocatable="8"))
    assert (state.total, state.free) == (8, 0)


@pytest.mark.parametrize("annots, problem", [
    ({ANNOTATION_DEVICES: "not json"}, ANNOTATION_DEVICES),
    ({ANNOTATION_DEVICES: "{}"}, ANNOTATION_DEVICES),
    ({ANNOTATION_DEVICES: "[1]"}, ANNOTATION_DEVICES),
    ({ANNOTATION_SCORES: '{"x": 1}', ANNOTATION_LOSSES: '{"1": 1}'}, ANNOTATION_SCORES),
    ({ANNOTATION_SCORES: '{"1": 1}', ANNOTATION_LOSSES: '{"1": "a"}'}, ANNOTATION_LOSSES),
    ({ANNOTATION_SCORES: '{"0": 1}', ANNOTATION_LOSSES: '{"0": 1}'}, ANNOTATION_SCORES),
    ({ANNOTATION_SCORES: '{"1": true}', ANNOTATION_LOSSES: '{"1": 1}'}, ANNOTATION_SCORES),
    ({ANNOTATION_SCORES: '[]', ANNOTATION_LOSSES: '{"1": 1}'}, ANNOTATION_SCORES),
])
def test_malformed_annotations_fall_back(annots, problem):
    state = _state(_node(annots, capacity="8", allocatable="3"))
    assert state.problems and state.problems[0].startswith(problem)
    assert state.free == 3 or state.source == "scores"
    assert state.scores is None or state.losses is not None


def test_tables_need_both_annotations():
    state = _state(_node({ANNOTATION_SCORES: '{"1": 800}'}, capacity="1", allocatable="1"))
    assert state.scores is None and state.losses is None and state.free == 1


def test_health_is_case_insensitive_and_allocated_must_be_false():
    devices = [{"health": "healthy"}, {"health": "Healthy", "allocated": True}, {"health": "Unhealthy"},
               {"health": "HEALTHY", "allocated": False}]
    state = _state(_node({ANNOTATION_DEVICES: json.dumps(devices)}))
    assert (state.total, state.free) == (4, 2)


def test_odd_node_shapes():
    assert node_fields({}) == (None, None, None, None, None)
    assert node_fields({"metadata": [], "status": "x"}) == (None, None, None, None, None)
    assert node_fields({"metadata": {"annotations": None}, "status": {"capacity": None}}) == (None,) * 5
    assert _state({"status": {"capacity": {GPU: "garbage"}}}).total == 0


def test_realistic_node():
    node = make_node(3, allocated=[4, 5])
    state = _state(node)
    assert (state.total, state.free) == (8, 6)
    assert len(json.dumps(node)) > 5000


def test_state_cache_memoises_by_inputs():
    cache = StateCache(limit=2)
    a = node_fields(make_node(1, allocated=[]))
    b = node_fields(make_node(2, allocated=[0]))
    first = cache.state(a)
    assert cache.state(a) is first and cache.hits == 1
    cache.state(b)
    cache.state(node_fields(make_node(3, allocated=[0, 1])))     # reaches the limit: cleared
    assert len(cache) == 1
    assert cache.state(("x", [1], None, None, None)).problems     # unhashable input still works
