"""The controller's side of the rolling driver upgrade (clusteroperator/driver_rollout.py): the CR's
upgradePolicy and Node objects in, Node patches and status.driverUpgrade out."""
from __future__ import annotations

import pathlib

import pytest
import yaml
from hypothesis import given, settings, strategies as st

from ansible_collections.metax.gpu.plugins.module_utils import names as N
from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator.driver_rollout import (
    driver_rollout, rollout_nodes, upgrade_policy)
from ansible_collections.metax.gpu.plugins.module_utils.driver.rollout import Step

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "clusteroperator-0.9.2.txt"
T0 = 1_790_000_000.0


def gpu_node(name, version="2.14.6", mode="cloud", cordoned=False, ready=True, state=None, annotations=None,
             driver_ready=True, payload=("2.40.1", None)):
    """A GPU node; ``payload``: what its driver-manager declares (payload version, kernel driver), or None."""
    labels = {N.LABEL_GPU_INSTALLED: "true", N.LABEL_DRIVER_MODE: mode}
    annotations = dict(annotations or {})
    if payload:
        annotations[N.ANNOTATION_DRIVER_PAYLOAD_VERSION] = payload[0]
        if payload[1]:
            annotations[N.ANNOTATION_DRIVER_PAYLOAD_DRIVER] = payload[1]
    if version:
        labels.update(zip((N.LABEL_DRIVER_MAJOR, N.LABEL_DRIVER_MINOR, N.LABEL_DRIVER_PATCH), version.split(".")))
    if driver_ready:
        labels[N.LABEL_DRIVER_READY] = "true"
    if state:
        labels[N.LABEL_DRIVER_UPGRADE_STATE] = state
    return {"metadata": {"name": name, "labels": labels, "annotations": annotations},
            "spec": {"unschedulable": True} if cordoned else {},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def spec(version="2.40.1", policy=None, deploy_policy="IfNotPresent", rolling=True):
    """The CR's spec.driver; ``rolling``: enableRollout true (the rolling upgrade), unless the policy says."""
    upgrade = dict({"enableRollout": True, "upgradeSteps": []} if rolling else {}, **dict(policy or {}))
    return {"driver": {"deployPolicy": deploy_policy, "payload": {"version": version}, "upgradePolicy": upgrade}}


def test_the_real_cr_upgrade_policy():
    """0.9.2's CR: maxParallel 100%, maxUnavailable 0%, a one-node step with a 30 s (30000 ms) pause."""
    text = FIXTURE.read_text()
    cr = yaml.safe_load(text[text.index("apiVersion:"):])
    policy = upgrade_policy(cr["spec"]["driver"])
    assert policy.steps == (Step(1, 30.0), Step("100%", 0.0))
    assert (policy.max_parallel, policy.max_unavailable, policy.max_failures, policy.fallback) == \
        ("100%", "0%", 5, "pause")
    assert policy.enabled is False and policy.paused is False
    # unset is the same policy, field by field; a field set alone keeps the others' defaults
    assert upgrade_policy({}) == policy == upgrade_policy({"upgradePolicy": {}})
    assert upgrade_policy({"upgradePolicy": {"enableRollout": True}}).steps == policy.steps
    assert upgrade_policy({"upgradePolicy": {"upgradeSteps": []}}).steps == ()


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
    newer = [gpu_node(n["metadata"]["name"], version=v, payload=("2.41.0", None))
             for n, v in zip(nodes, ("2.40.1", "2.14.6", "2.14.6"))]
    fresh = driver_rollout(spec("2.41.0", policy=policy), newer, T0 + 30, later.status)
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


def test_an_unset_upgrade_policy_never_cordons_and_starts_every_outdated_node_in_place():
    """The real CR's default (enableRollout false): a changed payload version is installed in place."""
    nodes = [gpu_node("a"), gpu_node("b", cordoned=True), gpu_node("c", version="2.40.1"), gpu_node("d")]
    for cr in ({"driver": {"payload": {"version": "2.40.1"}}},
               {"driver": {"payload": {"version": "2.40.1"}, "upgradePolicy": {}}},
               spec(rolling=False)):
        plan = driver_rollout(cr, nodes, T0)
        assert plan.decision is not None and not plan.decision.cordon
        assert [(p.node, p.action) for p in plan.patches] == [("a", "start"), ("b", "start"), ("d", "start")]
        for patch in plan.patches:
            assert "spec" not in patch.body                      # never a cordon, never an uncordon
            assert patch.body["metadata"]["annotations"] == {N.ANNOTATION_DRIVER_UPGRADE_TARGET: "2.40.1",
                                                             N.ANNOTATION_DRIVER_UPGRADE_IN_PLACE: "true"}
        assert plan.status["message"].startswith("in place (enableRollout false")


def test_an_in_place_node_finishes_without_touching_its_schedulability():
    in_place = {N.ANNOTATION_DRIVER_UPGRADE_IN_PLACE: "true"}
    nodes = [gpu_node("a", version="2.40.1", state="done", annotations=in_place),
             gpu_node("b", version="2.40.1", state="done", annotations=in_place, cordoned=True),
             gpu_node("c", state="upgrade-required", annotations=dict(in_place, **{
                 N.ANNOTATION_DRIVER_UPGRADE_MESSAGE: "pending: in use (pod ml/train requests metax-tech.com/gpu)"}))]
    plan = driver_rollout(spec(rolling=False), nodes, T0)
    patches = {p.node: p for p in plan.patches}
    assert set(patches) == {"a", "b"} and all(p.action == "finish" for p in patches.values())
    assert all("spec" not in p.body for p in patches.values())   # b's cordon is the administrator's
    assert patches["a"].body["metadata"]["annotations"][N.ANNOTATION_DRIVER_UPGRADE_IN_PLACE] is None
    assert plan.status["inProgress"] == ["c"]
    # the same nodes under a rolling policy: still not uncordoned, the upgrade never cordoned them
    rolled = driver_rollout(spec(), nodes, T0)
    assert all("spec" not in p.body for p in rolled.patches if p.action == "finish")


@pytest.mark.parametrize("payload,kmd", [("2.29.0.13", "2.12.13"), ("2.40.1", None)])
def test_a_payload_that_numbers_its_kernel_driver_apart_finishes_and_nobody_stays_cordoned(payload, kmd):
    """Both numbering schemes: the target is the kernel driver the payload declares (labels 2/12/13 for
    payload 2.29.0.13), so a node at it is done and a validated node is uncordoned."""
    want = kmd or payload
    declared = (payload, kmd)
    policy = {"maxParallel": 2, "maxUnavailable": 2}
    nodes = [gpu_node("a", version="2.12.11", payload=declared), gpu_node("b", version="2.12.11", payload=None)]
    plan = driver_rollout(spec(payload, policy=policy), nodes, T0)
    # b's driver-manager of the new payload has not said what it installs: b waits, uncordoned
    assert [(p.node, p.action) for p in plan.patches] == [("a", "start")]
    assert plan.patches[0].body["metadata"]["annotations"][N.ANNOTATION_DRIVER_UPGRADE_TARGET] == payload
    assert plan.decision.reasons("payload-unknown") == ("b",)
    # a installed it: its labels say the kernel driver (never the payload's own number); finished
    nodes = [gpu_node("a", version=want, cordoned=True, state="done", payload=declared),
             gpu_node("b", version="2.12.11", payload=declared)]
    plan = driver_rollout(spec(payload, policy=policy), nodes, T0)
    patches = {p.node: p for p in plan.patches}
    assert patches["a"].action == "finish" and patches["a"].body["spec"] == {"unschedulable": False}
    assert patches["b"].action == "start"
    nodes = [gpu_node("a", version=want, payload=declared),
             gpu_node("b", version=want, cordoned=True, state="done", payload=declared)]
    plan = driver_rollout(spec(payload, policy=policy), nodes, T0)
    assert [(p.node, p.action, p.body.get("spec")) for p in plan.patches] == [("b", "finish", {"unschedulable": False})]
    after = [gpu_node("a", version=want, payload=declared), gpu_node("b", version=want, payload=declared)]
    final = driver_rollout(spec(payload, policy=policy), after, T0)
    assert final.patches == () and final.status["message"] == "every node is at the target"
    assert final.status["upgraded"] == 2


def test_a_payload_number_in_the_labels_is_not_on_target_when_the_payload_declares_another_driver():
    nodes = [gpu_node("a", version="2.29.0", payload=("2.29.0.13", "2.12.13"))]
    plan = driver_rollout(spec("2.29.0.13", policy={"maxParallel": 1, "maxUnavailable": 1}), nodes, T0)
    assert [(p.node, p.action) for p in plan.patches] == [("a", "start")]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(("2.14.6", "2.40.1", "2.12.13")), st.booleans(), st.booleans(),
                          st.sampled_from((None, None, "upgrade-required", "done", "failed")), st.booleans(),
                          st.sampled_from((("2.40.1", None), ("2.40.1", "2.12.13"), ("2.39.0", None), None))),
                max_size=12),
       st.sampled_from(({}, {"upgradePolicy": {}}, {"upgradePolicy": {"maxParallel": 1, "pause": False}})))
def test_an_unset_enable_rollout_never_patches_a_nodes_schedulability(fleet, extra):
    """Whatever the nodes, a changed payload under enableRollout unset never cordons; the only uncordon is
    the finish of a node an earlier rolling upgrade (no in-place mark) had cordoned."""
    nodes = [gpu_node("n%02d" % i, version=version, cordoned=cordoned, ready=ready, state=state, payload=payload,
                      annotations={N.ANNOTATION_DRIVER_UPGRADE_IN_PLACE: "true"} if state and in_place else None)
             for i, (version, cordoned, ready, state, in_place, payload) in enumerate(fleet)]
    cr = {"driver": dict({"payload": {"version": "2.40.1"}}, **extra)}
    plan = driver_rollout(cr, nodes, T0)
    assert not plan.error
    for patch in plan.patches:
        assert "spec" not in patch.body or patch.action == "finish" and \
            N.ANNOTATION_DRIVER_UPGRADE_IN_PLACE not in dict(nodes[int(patch.node[1:])]["metadata"]["annotations"])
    assert not any("spec" in p.body for p in plan.patches if p.action == "start")


def test_the_first_declared_node_starts_ahead_of_earlier_names_until_every_node_has_declared():
    """The cluster rollback test's order (vm, vm-2, vm-3 at 2.16.0; payload 2.16.1; maxParallel 1):
    the planner takes the nodes by name only among those whose driver-manager of the new payload has
    declared it. The DaemonSet replaces its pods in its own order, so the node whose pod came first
    (vm-3) starts alone while vm and vm-2 wait ``payload-unknown``, and finishes on the new driver
    before vm starts. Held (``pause: true``) until every node has declared it, vm goes first and its
    failure pauses the rollout before vm-2 or vm-3 starts."""
    old, new = ("2.16.0", None), ("2.16.1", None)
    policy = {"maxParallel": 1, "maxUnavailable": 2, "maxFailureThreshold": 1, "fallback": "pause"}

    def fleet(declared, **states):
        return [gpu_node(name, version="2.16.0", payload=new if name in declared else old,
                         cordoned=name in states, state=states.get(name)) for name in ("vm", "vm-2", "vm-3")]

    early = driver_rollout(spec("2.16.1", policy, "Always"), fleet({"vm-3"}), T0)
    assert [(p.node, p.action) for p in early.patches] == [("vm-3", "start")]
    assert early.decision.reasons("payload-unknown") == ("vm", "vm-2")
    # held until every node's driver-manager has declared the payload, then released
    held = driver_rollout(spec("2.16.1", dict(policy, pause=True), "Always"), fleet({"vm-3", "vm-2"}), T0)
    assert held.patches == () and held.status["paused"] is True
    released = driver_rollout(spec("2.16.1", dict(policy, pause=False), "Always"), fleet({"vm", "vm-2", "vm-3"}), T0)
    assert [(p.node, p.action) for p in released.patches] == [("vm", "start")]
    assert released.decision.reasons("max-parallel") == ("vm-2", "vm-3")
    failed = driver_rollout(spec("2.16.1", policy, "Always"), fleet({"vm", "vm-2", "vm-3"}, vm="failed"), T0)
    assert failed.patches == () and failed.status["paused"] is True and failed.decision.failed == ("vm",)
