# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The verify role's checks (plugins/filter/gpu_extensions.py) over Node objects.

Nodes are built from what the real agents publish for a simulated host:
gpu-label's labels from plugins/module_utils/gpu, capacity from the device count.
"""

from __future__ import annotations

import json

import pytest

from ansible_collections.metax.gpu.plugins.filter.gpu_extensions import (
    REQUIRED_LABELS, FilterModule, daemonset_problems, gpu_node_problems, gpu_node_report, gpu_nodes_report)
from ansible_collections.metax.gpu.plugins.module_utils import names as N
from ansible_collections.metax.gpu.plugins.module_utils.gpu.discovery import discover
from ansible_collections.metax.gpu.plugins.module_utils.gpu.labels import node_labels


def node_from(labels, capacity, allocatable, devices=None):
    annotations = {}
    if devices is not None:
        annotations[N.ANNOTATION_DEVICES] = json.dumps(devices)
    return {"metadata": {"name": "n1", "labels": labels, "annotations": annotations},
            "status": {"capacity": {N.RESOURCE_NAME: str(capacity)},
                       "allocatable": {N.RESOURCE_NAME: str(allocatable)}}}


@pytest.fixture
def labels_8xc500(make_node):
    root = make_node("8xC500")
    return node_labels(discover(root), "native")


def test_the_eleven_labels_of_a_real_labeller(labels_8xc500):
    assert len(REQUIRED_LABELS) == 11
    assert set(REQUIRED_LABELS) <= set(labels_8xc500)


def test_a_healthy_node_has_no_problem(labels_8xc500):
    devices = [{"id": str(i), "health": "Healthy"} for i in range(8)]
    assert gpu_node_problems(node_from(labels_8xc500, 8, 8, devices)) == []


def test_capacity_and_allocatable_mismatches_are_named(labels_8xc500):
    devices = [{"id": str(i), "health": "Healthy" if i else "Unhealthy"} for i in range(8)]
    problems = gpu_node_problems(node_from(labels_8xc500, 6, 8, devices))
    assert any("capacity %s=6, expected 8" % N.RESOURCE_NAME in p for p in problems)
    assert any("allocatable %s=8, expected 7 healthy" % N.RESOURCE_NAME in p for p in problems)
    # a faulty device lowers allocatable by one: that is the expected state
    assert gpu_node_problems(node_from(labels_8xc500, 8, 7, devices)) == []


def test_missing_labels_and_resource():
    node = {"metadata": {"name": "n1", "labels": {N.LABEL_GPU_INSTALLED: "false"}}, "status": {}}
    problems = gpu_node_problems(node)
    assert any(p.startswith("missing labels") and N.LABEL_GPU_VFNUM in p for p in problems)
    assert any("found no MetaX GPU" in p for p in problems)
    assert any("no %s in capacity" % N.RESOURCE_NAME in p for p in problems)


def test_vfs_multiply_capacity(labels_8xc500):
    labels = dict(labels_8xc500, **{N.LABEL_GPU_VFNUM: "4", N.LABEL_GPU_COUNT: "2"})
    assert gpu_node_problems(node_from(labels, 8, 8)) == []
    assert gpu_node_problems(node_from(labels, 2, 2))


def test_report_names_the_node(labels_8xc500):
    assert gpu_node_report({"item": "vm", "resources": [node_from(labels_8xc500, 8, 8)]}) == ""
    assert gpu_node_report({"item": "vm-9", "resources": []}).startswith("node vm-9: not in the cluster")
    # until: never held for a node that does not exist: the task failed, but the lookup answered
    assert gpu_node_report({"item": "vm-9", "failed": True, "attempts": 5, "resources": [],
                            "msg": "Task failed: Action failed: Unknown error."}
                           ).startswith("node vm-9: not in the cluster")
    assert gpu_node_report({"item": "vm", "failed": True, "msg": "Unauthorized"}) == "node vm: cannot be read (Unauthorized)"
    assert gpu_node_report({"item": "vm", "failed": True, "attempts": 5,
                            "resources": [node_from(labels_8xc500, 1, 1)]}).startswith("node vm: capacity")
    assert gpu_node_report({"item": "vm", "resources": [node_from(labels_8xc500, 1, 1)]}).startswith("node vm: capacity")


def test_report_over_a_list_of_every_node_names_the_asked_ones_in_order(labels_8xc500):
    """The verify role's one paged list: only the nodes asked about count, each missing or wrong one named."""
    def named(name, node):
        return dict(node, metadata=dict(node["metadata"], name=name))
    nodes = [named("ok", node_from(labels_8xc500, 8, 8)), named("short", node_from(labels_8xc500, 6, 8)),
             named("not-asked", node_from({}, 0, 0))]
    assert gpu_nodes_report(nodes, ["ok"]) == []
    report = gpu_nodes_report(nodes, ["gone", "ok", "short"])
    assert [line.split(":", 1)[0] for line in report] == ["node gone", "node short"]
    assert report[0] == "node gone: not in the cluster (check metax_gpu_node_name)"
    assert report[1].startswith("node short: capacity")
    assert gpu_nodes_report([], []) == []


def test_daemonset_problems():
    ready = {"metadata": {"name": "gpu-label"}, "status": {"desiredNumberScheduled": 3, "numberReady": 3}}
    slow = {"metadata": {"name": "gpu-device"}, "status": {"desiredNumberScheduled": 3, "numberReady": 1}}
    assert daemonset_problems([ready]) == []
    assert daemonset_problems([ready, slow]) == ["gpu-device: 1 of 3 pods ready"]
    assert set(FilterModule().filters()) == {
        "gpu_node_problems", "gpu_node_report", "gpu_nodes_report", "daemonset_problems"}


def test_a_node_in_dra_mode_expects_no_device_plugin_capacity_and_flags_both_serving(labels_8xc500):
    labels = dict(labels_8xc500, **{N.LABEL_DEVICE_MODE: N.DEVICE_MODE_DRA})
    node = {"metadata": {"name": "n1", "labels": labels}, "status": {"capacity": {}, "allocatable": {}}}
    assert gpu_node_problems(node) == []
    # a gone device plugin's resource, which the kubelet keeps at 0, is fine
    assert gpu_node_problems(node_from(labels, 8, 0)) == []
    problems = gpu_node_problems(node_from(labels, 8, 8))
    assert problems == ["%s=dra but the device plugin serves allocatable %s=8 too" % (N.LABEL_DEVICE_MODE,
                                                                                      N.RESOURCE_NAME)]
    # the labels are still checked
    assert "missing labels" in gpu_node_problems({"metadata": {"labels": {N.LABEL_DEVICE_MODE: "dra"}}})[0]
