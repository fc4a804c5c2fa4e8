# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""A pod's metax-tech.com/gpu demand, as kube-scheduler computes it."""
from __future__ import annotations

import json
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.metax.gpu.plugins.module_utils.names import RESOURCE_NAME
from ansible_collections.metax.gpu.plugins.module_utils.extender.demand import (
    PodSpecError, QuantityError, parse_quantity, pod_demand, quantity_count)
from extender_support import load_fixture


@pytest.mark.parametrize("text, value", [
    ("2", 2), ("0", 0), ("+3", 3), ("1k", 1000), ("1Ki", 1024), ("500m", Fraction(1, 2)), ("1e3", 1000),
    ("1E-3", Fraction(1, 1000)), ("1.5", Fraction(3, 2)), (".5", Fraction(1, 2)), ("2M", 2 * 10 ** 6),
    ("1Gi", 2 ** 30), (" 4 ", 4), (7, 7), (2.5, Fraction(5, 2)),
])
def test_parse_quantity(text, value):
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "abc", "1x", "1.2.3", "--1", "1e", "Ki", None, True, [], float("nan"),
                                  "1e999"])
def test_parse_quantity_rejects(text):
    with pytest.raises(QuantityError):
        parse_quantity(text)


def test_quantity_count_rounds_up_and_never_negative():
    assert quantity_count("1500m") == 2
    assert quantity_count("-1") == 0
    assert quantity_count("8") == 8


def _pod(containers=(), init=(), overhead=None):
    def container(item):
        if isinstance(item, tuple):
            value, sidecar = item
        else:
            value, sidecar = item, False
        c = {"name": "c", "resources": {"requests": {RESOURCE_NAME: str(value)}} if value is not None else {}}
        if sidecar:
            c["restartPolicy"] = "Always"
        return c
    spec = {"containers": [container(c) for c in containers], "initContainers": [container(c) for c in init]}
    if overhead is not None:
        spec["overhead"] = {RESOURCE_NAME: str(overhead)}
    return {"metadata": {"name": "p"}, "spec": spec}


@pytest.mark.parametrize("containers, init, expected", [
    ((2,), (), 2),
    ((2, 3), (), 5),                       # containers add up
    ((2,), (4,), 4),                       # a plain init container needs its own peak
    ((2, 1), (1, 2), 3),                   # max(sum, max init)
    ((None,), (), 0),
    ((1,), ((1, True),), 2),               # a sidecar runs next to the containers
    ((1,), ((1, True), 4), 5),             # an init container after a sidecar runs next to it
    ((1,), (4, (1, True)), 4),             # ... but not one before it
    ((), ((2, True), (1, True), 2), 5),    # peak of the last init container: 2 + 1 + 2
])
def test_pod_demand_follows_the_scheduler(containers, init, expected):
    assert pod_demand(_pod(containers, init)) == expected


def test_pod_demand_overhead_and_limits_only():
    assert pod_demand(_pod((2,), overhead=1)) == 3
    pod = {"spec": {"containers": [{"resources": {"limits": {RESOURCE_NAME: "3"}}}]}}
    assert pod_demand(pod) == 3        # the API server defaults requests to limits for extended resources
    pod = {"spec": {"containers": [{"resources": {"limits": {RESOURCE_NAME: "3"}, "requests": {RESOURCE_NAME: "2"}}}]}}
    assert pod_demand(pod) == 2


@pytest.mark.parametrize("pod", [None, {}, {"spec": None}, {"spec": {"containers": None}},
                                 {"spec": {"containers": [{"resources": None}, {"resources": {"limits": None}}],
                                           "initContainers": None, "overhead": None}}])
def test_pod_demand_reads_null_as_empty(pod):
    assert pod_demand(pod) == 0          # Go decodes null into a nil slice / map


@pytest.mark.parametrize("pod, field", [
    ([], "Pod: expected an object"),
    ({"spec": 1}, "Pod.spec: expected an object or null, got number"),
    ({"spec": {"containers": True}}, "Pod.spec.containers: expected an array or null, got boolean"),
    ({"spec": {"containers": 1.5}}, "Pod.spec.containers: expected an array or null, got number"),
    ({"spec": {"containers": ["x"]}}, "Pod.spec.containers[0]: expected an object, got string"),
    ({"spec": {"containers": [{}, {"resources": "y"}]}}, "Pod.spec.containers[1].resources: expected an object"),
    ({"spec": {"containers": [{"resources": {"requests": [1]}}]}},
     "Pod.spec.containers[0].resources.requests: expected an object or null, got array"),
    ({"spec": {"containers": [{"resources": {"limits": {RESOURCE_NAME: True}}}]}},
     'Pod.spec.containers[0].resources.limits["%s"]: True is not a quantity' % RESOURCE_NAME),
    ({"spec": {"initContainers": [{"restartPolicy": 1}]}}, "Pod.spec.initContainers[0].restartPolicy"),
    ({"spec": {"initContainers": {}}}, "Pod.spec.initContainers: expected an array"),
    ({"spec": {"overhead": "1"}}, "Pod.spec.overhead: expected an object"),
    ({"spec": {"overhead": {RESOURCE_NAME: "x"}}}, 'Pod.spec.overhead["%s"]' % RESOURCE_NAME),
])
def test_pod_demand_names_the_wrong_field(pod, field):
    with pytest.raises(PodSpecError) as caught:
        pod_demand(pod)
    assert str(caught.value).startswith(field)


def test_captured_scheduler_pod():
    pod = json.loads(load_fixture("kube-scheduler-1.36-nodes.json"))["Pod"]
    assert pod_demand(pod) == 2
    assert pod_demand(pod, "cpu") == 0


def _reference(containers, init):
    """kube-scheduler's AggregateContainerRequests, transcribed literally."""
    reqs = sum(v for v in containers)
    restartable = 0
    init_max = 0
    for value, sidecar in init:
        if sidecar:
            reqs += value
            restartable += value
            current = restartable
        else:
            current = value + restartable
        init_max = max(init_max, current)
    return max(reqs, init_max)


@settings(deadline=None, max_examples=150)
@given(st.lists(st.integers(0, 8), max_size=4), st.lists(st.tuples(st.integers(0, 8), st.booleans()), max_size=4))
def test_pod_demand_matches_reference(containers, init):
    assert pod_demand(_pod(containers, init)) == _reference(containers, init)
