"""Filters of the set_vfnum role."""
from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.metax.gpu.plugins.filter.vfnum import (
    FilterModule, vfnum_budget, vfnum_gpu_pods, vfnum_node_problems, vfnum_state,
)
from ansible_collections.metax.gpu.plugins.module_utils import names as N


def _node(name, ready=True, cordoned=False, labels=None):
    return {"metadata": {"name": name, "labels": labels or {}},
            "spec": {"unschedulable": True} if cordoned else {},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def _pod(name, gpu=True, phase="Running"):
    resources = {"limits": {N.RESOURCE_NAME: "1"}} if gpu else {}
    return {"metadata": {"namespace": "ml", "name": name}, "status": {"phase": phase},
            "spec": {"containers": [{"name": "c", "resources": resources}]}}


# The role's copies of the cluster names (vars/main.yml) and batch.yml's copy of the agents' selector are
# gone with issue 40 (the roles call metax.gpu.node_maintenance); the tests that pinned them went with them:
# tests/unit/maintenance/test_maintenance_yaml.py keeps the roles free of those keys.


def test_vfnum_state_reads_the_label_success_when_absent():
    assert vfnum_state(_node("a", labels={N.LABEL_VFNUM_STATE: "failed"})) == "failed"
    assert vfnum_state(_node("a")) == "success"


def test_budget_counts_a_node_held_by_the_maintenance_record_alone():
    held = {"metadata": {"name": "d", "annotations": {N.ANNOTATION_MAINTENANCE_OWNER: N.MAINTENANCE_OWNER_HEALTH}},
            "spec": {}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    [why] = vfnum_budget([_node("a"), held], ["a", "d"], ["a"], 1)
    assert "1 already are (d)" in why


def test_gpu_pods_only_running_ones_requesting_the_resource():
    pods = [_pod("a"), _pod("b", gpu=False), _pod("c", phase="Succeeded"), _pod("d", phase="Pending")]
    assert vfnum_gpu_pods(pods) == ["ml/a", "ml/d"]


NODES = [_node("a"), _node("b", cordoned=True), _node("c", ready=False),
         _node("d", labels={N.LABEL_AGENTS_PAUSED: "driver-upgrade"}), _node("e"), _node("cp")]
GPU = ["a", "b", "c", "d", "e"]


def test_budget_counts_cordoned_notready_and_paused_nodes_with_the_batch():
    assert vfnum_budget(NODES, GPU, ["a"], 4) == []
    [why] = vfnum_budget(NODES, GPU, ["a", "e"], 4)
    assert "allows 4" in why and "3 already are (b, c, d)" in why and "adds 2 (a, e)" in why


def test_budget_does_not_count_a_batch_node_twice_and_ignores_non_candidates():
    assert vfnum_budget(NODES, ["a", "b"], ["b"], 1) == []


def test_budget_percentage_rounds_down_but_allows_one():
    healthy = [_node(n) for n in "abcd"]
    assert vfnum_budget(healthy, list("abcd"), ["a"], "10%") == []
    assert vfnum_budget(healthy, list("abcd"), ["a", "b"], "50%") == []
    assert vfnum_budget(healthy, list("abcd"), ["a", "b", "c"], "50%")
    with pytest.raises(AnsibleFilterError):
        vfnum_budget(healthy, list("abcd"), ["a"], "many")


def test_budget_names_missing_nodes():
    assert vfnum_budget(NODES, GPU, ["zz"], 1) == ["node(s) zz not found in the cluster"]


def _gpu_node(vfnum, capacity, paused=False):
    labels = {key: "x" for key in (N.LABEL_DRIVER_MAJOR, N.LABEL_DRIVER_MINOR, N.LABEL_DRIVER_PATCH,
                                   N.LABEL_DRIVER_MODE, N.LABEL_GPU_FAMILY, N.LABEL_GPU_MEMORY,
                                   N.LABEL_GPU_PRODUCT, N.LABEL_GPU_SRIOV)}
    labels.update({N.LABEL_GPU_INSTALLED: "true", N.LABEL_DRIVER_READY: "true",
                   N.LABEL_GPU_COUNT: "2", N.LABEL_GPU_VFNUM: str(vfnum)})
    if paused:
        labels[N.LABEL_AGENTS_PAUSED] = "set-vfnum"
    return {"metadata": {"name": "vm-3", "labels": labels},
            "status": {"capacity": {N.RESOURCE_NAME: str(capacity)},
                       "allocatable": {N.RESOURCE_NAME: str(capacity)}}}


def test_node_problems_until_label_and_capacity_agree():
    assert vfnum_node_problems(_gpu_node(4, 8), 4) == []
    assert vfnum_node_problems(_gpu_node(0, 2), 0) == []
    stale = vfnum_node_problems(_gpu_node(0, 2), 4)
    assert stale == ["label metax-tech.com/gpu.vfnum=0, expected 4"]
    lagging = vfnum_node_problems(_gpu_node(4, 2), 4)
    assert any("capacity metax-tech.com/gpu=2, expected 8" in p for p in lagging)
    assert any("still paused" in p for p in vfnum_node_problems(_gpu_node(4, 8, paused=True), 4))


def test_filters_are_registered():
    assert set(FilterModule().filters()) == {"vfnum_gpu_pods", "vfnum_budget", "vfnum_node_problems", "vfnum_state"}
