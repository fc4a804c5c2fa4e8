"""The rolling plan of driver_upgrade.yml: batches, budget, skip and pre-cordoned nodes, validation."""
from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.metax.gpu.plugins.filter.driver_upgrade import (
    driver_upgrade_evictions, driver_upgrade_host_map, driver_upgrade_node_plan, driver_upgrade_plan,
    driver_upgrade_failures, driver_upgrade_validation, metax_label_removal)
from ansible_collections.metax.gpu.plugins.module_utils import names as N


def node(name, ready=True, cordoned=False, labels=None):
    return {"metadata": {"name": name, "labels": dict(labels or {})},
            "spec": {"unschedulable": True} if cordoned else {},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


NAMES = ["a", "b", "c", "d"]


def test_serial_batches_within_the_budget():
    plan = driver_upgrade_plan([node(n) for n in NAMES], NAMES, serial=2, max_unavailable=4)
    assert plan["batches"] == [["a", "b"], ["c", "d"]]
    plan = driver_upgrade_plan([node(n) for n in NAMES], NAMES, serial=3, max_unavailable="50%")
    assert plan["batches"] == [["a", "b"], ["c", "d"]] and plan["max_unavailable"] == 2


def test_already_unavailable_nodes_spend_the_budget():
    nodes = [node("a"), node("b", ready=False), node("c"), node("d")]
    plan = driver_upgrade_plan(nodes, NAMES, serial=2, max_unavailable=2)
    assert plan["not_ready"] == ["b"] and plan["batches"] == [["a"], ["c"], ["d"]]
    with pytest.raises(AnsibleFilterError, match="used up"):
        driver_upgrade_plan([node("a", ready=False), node("b"), node("c"), node("d")], NAMES,
                            max_unavailable=1)


def test_pre_cordoned_node_is_upgraded_for_free_and_recorded():
    nodes = [node("a"), node("b", cordoned=True), node("c"), node("d")]
    plan = driver_upgrade_plan(nodes, NAMES, serial=2, max_unavailable=2)
    assert plan["pre_cordoned"] == ["b"]
    assert plan["batches"] == [["a", "b"], ["c"], ["d"]]


def test_skip_label_and_unknown_nodes():
    nodes = [node("a", labels={N.LABEL_DRIVER_UPGRADE_SKIP: "true"}), node("b"), node("c"), node("d")]
    plan = driver_upgrade_plan(nodes, NAMES, serial=1, max_unavailable=1)
    assert plan["skipped"] == ["a"] and plan["batches"] == [["b"], ["c"], ["d"]]
    with pytest.raises(AnsibleFilterError, match="not Kubernetes nodes: x"):
        driver_upgrade_plan(nodes, NAMES + ["x"])
    with pytest.raises(AnsibleFilterError, match="serial"):
        driver_upgrade_plan(nodes, NAMES, serial=0)


def test_label_removal_keeps_the_day_two_labels():
    labels = {N.LABEL_GPU_INSTALLED: "true", N.LABEL_DRIVER_MAJOR: "2", "kubernetes.io/os": "linux",
              N.LABEL_DRIVER_UPGRADE_STATE: "cordoned", N.LABEL_AGENTS_PAUSED: "true"}
    assert metax_label_removal(labels) == {N.LABEL_GPU_INSTALLED: None, N.LABEL_DRIVER_MAJOR: None}


def test_validation_wants_labels_capacity_and_version():
    labels = {N.LABEL_GPU_INSTALLED: "true", N.LABEL_DRIVER_READY: "true", N.LABEL_DRIVER_MAJOR: "2",
              N.LABEL_DRIVER_MINOR: "40", N.LABEL_DRIVER_PATCH: "1", N.LABEL_DRIVER_MODE: "native",
              N.LABEL_GPU_FAMILY: "C500", N.LABEL_GPU_MEMORY: "65536", N.LABEL_GPU_PRODUCT: "C500",
              N.LABEL_GPU_SRIOV: "forbidden", N.LABEL_GPU_VFNUM: "0", N.LABEL_GPU_COUNT: "1"}
    good = node("a", labels=labels)
    good["status"].update({"capacity": {N.RESOURCE_NAME: "1"}, "allocatable": {N.RESOURCE_NAME: "1"}})
    assert driver_upgrade_validation(good, "2.40.1") == []
    assert "driver labels say 2.40.1, expected 2.41.0" in driver_upgrade_validation(good, "2.41.0")
    bare = node("a")
    assert any("missing labels" in p for p in driver_upgrade_validation(bare, "2.40.1"))


def test_a_node_we_left_failed_is_ours_to_uncordon_on_the_next_run():
    failed = node("b", cordoned=True, labels={N.LABEL_DRIVER_UPGRADE_STATE: "failed"})
    admin_and_failed = node("c", cordoned=True, labels={N.LABEL_DRIVER_UPGRADE_STATE: "failed"})
    admin_and_failed["metadata"]["annotations"] = {N.ANNOTATION_PRE_CORDONED: "true"}
    plan = driver_upgrade_plan([node("a"), failed, admin_and_failed, node("d")], NAMES, serial=1,
                               max_unavailable=3)
    assert plan["resumed"] == ["b"] and plan["pre_cordoned"] == ["c"]
    assert plan["batches"] == [["a"], ["b"], ["c"], ["d"]]


def test_the_plan_is_the_rollout_planners_played_forward():
    """A cordoned node (cost 0) joins a batch the budget closed to the node before it; a node of ours
    left failed frees its place once it validates, so the others are not refused."""
    nodes = [node("a"), node("b"), node("c", cordoned=True), node("d")]
    plan = driver_upgrade_plan(nodes, NAMES, serial=3, max_unavailable=2)
    assert plan["batches"] == [["a", "c"], ["b"], ["d"]] and plan["batch_budget"] == 1
    ours = node("a", cordoned=True, labels={N.LABEL_DRIVER_UPGRADE_STATE: "failed"})
    plan = driver_upgrade_plan([ours, node("b"), node("c"), node("d")], NAMES, serial=1, max_unavailable=1)
    assert plan["resumed"] == ["a"] and plan["batches"] == [["a"], ["b"], ["c"], ["d"]]
    assert plan["already_unavailable"] == ["a"] and plan["batch_budget"] == 0


def gpu_pod(name, node, gpu=True, phase="Running"):
    res = {"limits": {N.RESOURCE_NAME: "1"}} if gpu else {}
    return {"metadata": {"name": name, "namespace": "ml"},
            "spec": {"nodeName": node, "containers": [{"name": "c", "resources": res}]}, "status": {"phase": phase}}


def test_evictions_split_one_pod_list_by_node_as_evict_gpu_pods_selects():
    pods = [gpu_pod("a1", "a"), gpu_pod("a2", "a", gpu=False), gpu_pod("b1", "b", phase="Succeeded"),
            gpu_pod("x1", "x"), {"metadata": {"name": "pending"}, "spec": {}}]
    assert driver_upgrade_evictions(pods, ["a", "b", "c"]) == {"a": ["ml/a1"], "b": [], "c": []}
    assert driver_upgrade_evictions(pods, ["a"], drain=True) == {"a": ["ml/a1", "ml/a2"]}


def test_host_map_names_nodes_by_metax_gpu_node_name():
    hostvars = {"h1": {"metax_gpu_node_name": "node-1", "metax_gpu_host_root": "/sim/1"}, "h2": {}}
    assert driver_upgrade_host_map(["h1", "h2"], hostvars) == {
        "node-1": {"host": "h1", "root": "/sim/1"}, "h2": {"host": "h2", "root": "/"}}


def test_node_plan_joins_the_node_checks_and_the_evictions():
    changes = [{"item": "a", "plan": {"from_version": "2.1", "to_version": "2.2", "steps": ["unload"]}},
               {"item": "b", "plan": {"from_version": "2.0", "to_version": "2.2", "steps": []}}]
    rollback = [{"item": changes[0], "plan": {"package": {"path": "/var/cache/metax-driver/a.deb"}}},
                {"item": changes[1], "failed": True, "plan": {"package": {"path": "/x.deb"}}}]
    plan = driver_upgrade_node_plan(["a", "b", "c"], changes, rollback, {"a": ["ml/p"]}, ["b"])
    assert plan["a"] == {"from": "2.1", "to": "2.2", "to_driver": "2.2", "steps": ["unload"], "evict": ["ml/p"],
                         "rollback_package": "/var/cache/metax-driver/a.deb", "pre_cordoned": False}
    assert plan["b"]["rollback_package"] == "" and plan["b"]["pre_cordoned"] is True
    # not asked (driver_upgrade_check_nodes: false in check mode): the plan without versions
    assert plan["c"] == {"from": None, "to": None, "to_driver": None, "steps": [], "evict": [],
                         "rollback_package": "", "pre_cordoned": False}


def test_a_vendor_payload_validates_against_the_kernel_driver_it_declares():
    """Payload 2.29.0.13 installs kernel driver 2.12.13: the node plan carries both, the labels (2/12/13)
    validate against the declared one, and a node whose labels say the payload's number does not."""
    changes = [{"item": "a", "plan": {"from_version": "2.14.6", "to_version": "2.29.0.13",
                                      "to_driver_version": "2.12.13", "steps": ["unload", "install", "load"]}}]
    plan = driver_upgrade_node_plan(["a"], changes, [], {}, [])
    assert (plan["a"]["to"], plan["a"]["to_driver"]) == ("2.29.0.13", "2.12.13")
    labels = {N.LABEL_GPU_INSTALLED: "true", N.LABEL_DRIVER_READY: "true", N.LABEL_DRIVER_MAJOR: "2",
              N.LABEL_DRIVER_MINOR: "12", N.LABEL_DRIVER_PATCH: "13", N.LABEL_DRIVER_MODE: "cloud",
              N.LABEL_GPU_FAMILY: "MXC", N.LABEL_GPU_MEMORY: "64GB", N.LABEL_GPU_PRODUCT: "MXC550",
              N.LABEL_GPU_SRIOV: "forbidden", N.LABEL_GPU_VFNUM: "0", N.LABEL_GPU_COUNT: "1"}
    real = node("a", labels=labels)
    real["status"].update({"capacity": {N.RESOURCE_NAME: "1"}, "allocatable": {N.RESOURCE_NAME: "1"}})
    assert driver_upgrade_validation(real, plan["a"]["to_driver"]) == []
    assert driver_upgrade_failures([real], plan) == []
    # compared with the payload's own number it would never validate: the bug this guards against
    assert driver_upgrade_validation(real, "2.29.0.13") == ["driver labels say 2.12.13, expected 2.29.0"]
    # a plan from before to_driver existed still validates against its payload version
    assert driver_upgrade_failures([real], {"a": {"to": "2.12.13"}}) == []


def test_the_roles_declaration_filter_is_the_driver_modules_parser():
    from ansible_collections.metax.gpu.plugins.filter.driver_upgrade import driver_payload_declaration
    assert driver_payload_declaration("# MetaX\nversion=2.29.0.13\ndriver=2.12.13\n") == {
        "version": "2.29.0.13", "driver": "2.12.13"}
    assert driver_payload_declaration('version="2.40.1"') == {"version": "2.40.1", "driver": "2.40.1"}
    with pytest.raises(AnsibleFilterError, match="driver_upgrade_declaration"):
        driver_payload_declaration("driver=2.12.13\n")        # no version: the copy could not be named


def test_a_node_another_procedure_holds_is_listed_held_and_counts_against_the_budget():
    held = node("b", labels={N.LABEL_AGENTS_PAUSED: N.MAINTENANCE_OWNER_SET_VFNUM})
    plan = driver_upgrade_plan([node("a"), held, node("c"), node("d")], NAMES, serial=2, max_unavailable=2)
    assert plan["held"] == ["b (set-vfnum)"] and plan["already_unavailable"] == ["b"]
    assert plan["batches"] == [["a"], ["c"], ["d"]] and plan["batch_budget"] == 1
    # the driver upgrade's own hold (an earlier run's) is its to take over
    ours = node("b", cordoned=True, labels={N.LABEL_AGENTS_PAUSED: "true", N.LABEL_DRIVER_UPGRADE_STATE: "paused"})
    plan = driver_upgrade_plan([node("a"), ours, node("c"), node("d")], NAMES, serial=1, max_unavailable=1)
    assert plan["held"] == [] and plan["resumed"] == ["b"] and plan["batches"] == [["b"], ["a"], ["c"], ["d"]]


def test_a_held_node_is_named_even_where_its_hold_uses_the_budget_up():
    """Three nodes at 25%: the one held is the whole budget; the plan names it for the role's refusal
    instead of failing on the budget."""
    held = node("c")
    held["metadata"]["annotations"] = {N.ANNOTATION_MAINTENANCE_OWNER: N.MAINTENANCE_OWNER_HEALTH}
    plan = driver_upgrade_plan([node("a"), node("b"), held], ["a", "b", "c"])
    assert plan["held"] == ["c (health)"] and plan["already_unavailable"] == ["c"]
