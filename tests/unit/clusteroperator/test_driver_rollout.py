"""The controller's side of the rolling driver upgrade (clusteroperator/driver_rollout.py): the CR's
upgradePolicy and Node objects in, Node patches and status.driverUpgrade out."""
from __future__ import annotations

import pathlib

import yaml

from ansible_collections.metax.gpu.plugins.module_utils import names as N
from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator.driver_rollout import (
    driver_rollout, rollout_nodes, upgrade_policy)
from ansible_collections.metax.gpu.plugins.module_utils.driver.rollout import Step

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "clusteroperator-0.9.2.txt"
T0 = 1_790_000_000.0


def gpu_node(name, version="2.14.6", mode="cloud", cordoned=False, ready=True, state=None, annotations=None,
             driver_ready=True):
    labels = {N.LABEL_GPU_INSTALLED: "true", N.LABEL_DRIVER_MODE: mode}
    if version:
        labels.update(zip((N.LABEL_DRIVER_MAJOR, N.LABEL_DRIVER_MINOR, N.LABEL_DRIVER_PATCH), version.split(".")))
    if driver_ready:
        labels[N.LABEL_DRIVER_READY] = "true"
    if state:
        labels[N.LABEL_DRIVER_UPGRADE_STATE] = state
    return {"metadata": {"name": name, "labels": labels, "annotations": dict(annotations or {})},
            "spec": {"unschedulable": True} if cordoned else {},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def spec(version="2.40.1", policy=None, deploy_policy="IfNotPresent"):
    return {"driver": {"deployPolicy": deploy_policy, "payload": {"version": version},
                       "upgradePolicy": dict(policy or {})}}


def test_the_real_cr_upgrade_policy():
    """0.9.2's CR: maxParallel 100%, maxUnavailable 0%, a one-node step with a 30 s (30000 ms) pause."""
    text = FIXTURE.read_text()
    cr = yaml.safe_load(text[text.index("apiVersion:"):])
    policy = upgrade_policy(cr["spec"]["driver"])
    assert policy.steps == (Step(1, 30.0), Step("100%", 0.0))
    assert (policy.max_parallel, policy.max_unavailable, policy.max_failures, policy.fallback) == \
        ("100%", "0%", 5, "pause")
    assert policy.enabled is False and policy.paused is False
    assert upgrade_policy({}).enabled and upgrade_policy({}).max_failures == 1


def test_scope_follows_deploy_policy():
    nodes = [gpu_node("a"), gpu_node("b", mode="native"), gpu_node("c", version=None),
             gpu_node("d", mode="native", state="paused")]
    assert [v.name for v in rollout_nodes(nodes, "2.40.1", "IfNotPresent")] == ["a", "d"]
    assert [v.name for v in rollout_nodes(nodes, "2.40.1", "Always")] == ["a", "b", "d"]
    assert [v.name for v in rollout_nodes(nodes, "2.40.1", "Never")] == ["d"]


def test_start_cordons_and_records_the_administrators_cordon():
    nodes = [gpu_node("a"), gpu_node("b", cordoned=True), gpu_node("c"), gpu_node("d", version="2.40.1")]
    plan = driver_rollout(spec(policy={"maxParallel": 3, "maxUnavailable": 2}), nodes, T0)
    patches = {p.node: p.body for p in plan.patches}
    # the target tells the node's driver-manager which payload's pod is to act
    target = {N.ANNOTATION_DRIVER_UPGRADE_TARGET: "2.40.1"}
    assert patches["a"] == {"spec": {"unschedulable": True},
                            "metadata": {"labels": {N.LABEL_DRIVER_UPGRADE_STATE: "upgrade-required"},
                                         "annotations": target}}
    assert patches["b"] == {"metadata": {"labels": {N.LABEL_DRIVER_UPGRADE_STATE: "upgrade-required"},
                                         "annotations": dict(target, **{N.ANNOTATION_PRE_CORDONED: "true"})}}
    assert set(patches) == {"a", "b"}      # budget 2: b was unavailable already, a takes the last one
    assert plan.status["upgraded"] == 1 and plan.status["inProgress"] == ["a", "b"]


def test_finish_uncordons_only_our_cordon_and_frees_the_budget_at_once():
    pre = {N.ANNOTATION_PRE_CORDONED: "true"}
    nodes = [gpu_node("a", version="2.40.1", cordoned=True, state="done"),
             gpu_node("b", version="2.40.1", cordoned=True, state="done", annotations=pre),
             gpu_node("c"), gpu_node("d", version="2.40.1", cordoned=True, state="done", driver_ready=False)]
    plan = driver_rollout(spec(policy={"maxParallel": 1, "maxUnavailable": 3}), nodes, T0)
    patches = {p.node: p for p in plan.patches}
    assert patches["a"].body["spec"] == {"unschedulable": False}
    assert "spec" not in patches["b"].body                           # the administrator's cordon stays
    assert patches["b"].body["metadata"]["annotations"][N.ANNOTATION_PRE_CORDONED] is None
    assert patches["a"].body["metadata"]["annotations"][N.ANNOTATION_DRIVER_UPGRADE_TARGET] is None  # nothing left
    assert "d" not in patches                                          # driver.ready not back yet
    # a, b, d were cordoned (budget 3 used up); a's uncordon frees a place: c starts in the same reconcile
    assert patches["c"].action == "start"


def test_failure_threshold_pauses_and_failed_nodes_stay():
    nodes = [gpu_node("a", cordoned=True, state="failed",
                      annotations={N.ANNOTATION_DRIVER_UPGRADE_MESSAGE: "validate: driver.ready missing"}),
             gpu_node("b"), gpu_node("c")]
    plan = driver_rollout(spec(policy={"maxParallel": 2, "maxUnavailable": 3, "maxFailureThreshold": 1}), nodes, T0)
    assert plan.patches == () and plan.status["paused"]
    assert plan.status["failed"] == [{"node": "a", "reason": "validate: driver.ready missing"}]
    assert "maxFailureThreshold 1" in plan.status["message"]


def test_step_pause_is_kept_in_the_status_and_ends_on_time():
    policy = {"maxParallel": "100%", "maxUnavailable": "100%",
              "upgradeSteps": [{"replicas": 1, "pauseDuration": 30000}, {"replicas": "100%", "pauseDuration": 0}]}
    nodes = [gpu_node("a", version="2.40.1"), gpu_node("b"), gpu_node("c")]
    plan = driver_rollout(spec(policy=policy), nodes, T0)
    assert plan.patches == () and plan.status["stepPause"]["step"] == 0
    assert plan.status["message"].startswith("between steps")
    assert driver_rollout(spec(policy=policy), nodes, T0 + 29, plan.status).patches == ()
    later = driver_rollout(spec(policy=policy), nodes, T0 + 30, plan.status)
    assert [p.node for p in later.patches] == ["b", "c"] and later.status["step"] == 2
    # a new target starts its steps over
    fresh = driver_rollout(spec("2.41.0", policy=policy), nodes, T0 + 30, later.status)
    assert [p.node for p in fresh.patches] == ["a"]


def test_invalid_policy_reports_and_changes_nothing_but_finishing():
    nodes = [gpu_node("a", version="2.40.1", cordoned=True, state="done"), gpu_node("b")]
    plan = driver_rollout(spec(policy={"maxParallel": 0}), nodes, T0)
    assert "maxParallel must be at least 1" in plan.error
    assert [(p.node, p.action) for p in plan.patches] == [("a", "finish")]


def test_no_target_or_no_driver_component_means_no_rollout():
    nodes = [gpu_node("a")]
    assert driver_rollout({"driver": {"payload": {}}}, nodes, T0).patches == ()
    assert driver_rollout({"driver": {"deploy": False, "payload": {"version": "2.40.1"}}}, nodes, T0).status == {}
