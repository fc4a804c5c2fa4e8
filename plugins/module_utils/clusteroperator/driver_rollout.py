# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The controller's side of the rolling driver upgrade: ClusterOperator ``spec.driver`` and
the nodes in, the Node patches to make and the status to report out. Pure.

The contract with the node's driver-manager (docs/operator.md, "driver
upgradePolicy"), over one label, ``metax-tech.com/driver.upgrade-state``, with
the playbook's values:

* the node's driver-manager publishes on its node what its payload is and
  which kernel driver that payload installs (``driver.payload.version``,
  ``driver.payload.driver-version``: MetaX's payload 2.29.0.13 installs
  2.12.13); a node is on target when gpu-label's ``gpu.driver.*`` labels say
  the declared kernel driver (``package.driver_matches``), never the
  payload's own number; a node waits until its declaration is there;
* ``upgradePolicy`` unset is the real CR's (:data:`DEFAULT_UPGRADE_POLICY`):
  ``enableRollout: false``, so no node is ever cordoned or evicted: the
  controller starts every outdated node *in place* (``upgrade-required``
  with ``driver.upgrade.in-place=true``, no cordon), and the node's
  driver-manager installs only while its GPUs are not in use, else says
  ``pending: in use`` in ``driver.upgrade.message`` and tries again;
* with ``enableRollout: true`` the controller starts a node: one merge patch
  that cordons it (or, when the administrator had cordoned it, records that
  in ``driver.upgrade.pre-cordoned``) and sets ``upgrade-required``;
* the node's driver-manager whose payload is the target version
  (``driver.upgrade.target``) sees ``upgrade-required`` on its own node and
  runs its part (driver/node_upgrade.py): it installs the payload's driver
  (state ``driver-installed``; a driver in use is refused and retried, the
  state stays), verifies it and recreates its node's gpu-device and gpu-label
  pods (``done``), or rolls back and sets ``failed`` with the reason in
  ``driver.upgrade.message``. It neither pauses the node agents nor evicts
  (the cordon keeps new GPU pods away), and never changes the version of a
  loaded driver without ``upgrade-required``;
* the controller finishes a ``done`` node once gpu-label reports the target
  version and ``driver.ready=true``: uncordon (never a node the administrator
  cordoned, nor one upgraded in place) and remove the state label and the
  annotations; a ``failed`` node is left cordoned (if we cordoned it) for the
  administrator.

Which nodes start and when is :mod:`..driver.rollout`'s decision, the same
planner the ``metax.gpu.driver_upgrade`` playbook uses.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from .. import names as N
from ..driver.rollout import Decision, Policy, PolicyError, RolloutNode, Step, StepPause, decide, finished_node
from ..driver.policy import MODE_CLOUD, rolled
from ..driver.rollout_node import label_version, labels_of, rollout_node

# spec.driver.upgradePolicy's defaults: the real 0.9.2 CR's (clusteroperator-0.9.2.txt), field by field
DEFAULT_UPGRADE_POLICY: Dict[str, Any] = {
    "enableRollout": False, "maxParallel": "100%", "maxUnavailable": "0%", "maxFailureThreshold": 5,
    "fallback": "pause", "pause": False,
    "upgradeSteps": [{"replicas": 1, "pauseDuration": 30000}, {"replicas": "100%", "pauseDuration": 0}],
}


@dataclass(frozen=True)
class NodePatch:
    """A merge patch of one Node (``body`` has ``spec`` and/or ``metadata``)."""

    node: str
    body: Dict[str, Any]
    action: str            # "start" | "finish"


@dataclass(frozen=True)
class RolloutPlan:
    patches: Tuple[NodePatch, ...]
    status: Dict[str, Any]            # ClusterOperator status.driverUpgrade ({} = no rollout)
    decision: Optional[Decision] = None
    error: str = ""                   # an upgradePolicy the planner cannot act on


def upgrade_policy(driver_spec: Mapping[str, Any]) -> Policy:
    """``spec.driver.upgradePolicy`` as the planner's policy.

    Unset fields take the real CR's defaults (:data:`DEFAULT_UPGRADE_POLICY`):
    rollout off (in place, never a cordon), maxParallel 100%, maxUnavailable
    0% (at least one node), pause after 5 failures, a one-node step with a
    30 s pause then the rest. ``pauseDuration`` is in milliseconds;
    ``upgradeSteps: []`` means no steps.
    """
    spec = dict(DEFAULT_UPGRADE_POLICY)
    spec.update({k: v for k, v in (driver_spec.get("upgradePolicy") or {}).items() if v is not None})
    steps = tuple(Step(step.get("replicas", "100%"), float(step.get("pauseDuration") or 0) / 1000.0)
                  for step in spec.get("upgradeSteps") or ())
    return Policy(max_parallel=spec["maxParallel"], max_unavailable=spec["maxUnavailable"],
                  steps=steps, max_failures=int(spec["maxFailureThreshold"]),
                  fallback=str(spec["fallback"]), paused=bool(spec["pause"]),
                  enabled=bool(spec["enableRollout"]))


def _in_scope(node: Mapping[str, Any], deploy_policy: str) -> bool:
    labels = labels_of(node)
    if labels.get(N.LABEL_DRIVER_UPGRADE_STATE):
        return True          # in the procedure: gpu-label's labels are gone for a while
    if labels.get(N.LABEL_GPU_INSTALLED) != "true":
        return False
    if not rolled(deploy_policy, labels.get(N.LABEL_DRIVER_MODE) == MODE_CLOUD):
        return False         # Never; or the administrator's driver (native) under IfNotPresent/PreferCloud
    return label_version(node) is not None   # no driver yet: an install, not an upgrade


def rollout_nodes(nodes: Sequence[Mapping[str, Any]], target: str, deploy_policy: str) -> List[RolloutNode]:
    """The nodes a rollout to the payload ``target`` concerns, by name; each one's target is the
    kernel driver that payload declares on it."""
    views = [rollout_node(node, payload=target) for node in nodes if _in_scope(node, deploy_policy)]
    return sorted(views, key=lambda v: v.name)


def _iso(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _seconds(text: str) -> float:
    return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=datetime.timezone.utc).timestamp()


def _previous_pause(previous: Mapping[str, Any], target: str) -> Optional[StepPause]:
    record = previous.get("stepPause") or {}
    if previous.get("targetVersion") != target or "step" not in record or "until" not in record:
        return None      # a new target starts its steps over
    try:
        return StepPause(int(record["step"]), _seconds(str(record["until"])))
    except ValueError:
        return None


def start_patch(node: RolloutNode, payload: str, cordon: bool = True) -> NodePatch:
    """Start ``node``'s upgrade to the payload ``payload``; ``cordon`` false: in place (enableRollout false)."""
    # the target tells the node's driver-manager which payload to act with: a
    # pod of the previous payload, not replaced yet by the DaemonSet, waits
    metadata: Dict[str, Any] = {"labels": {N.LABEL_DRIVER_UPGRADE_STATE: N.DRIVER_UPGRADE_REQUIRED},
                                "annotations": {N.ANNOTATION_DRIVER_UPGRADE_TARGET: payload}}
    if not cordon:
        # in place: the node's schedulability is not ours to touch, now or when it finishes
        metadata["annotations"][N.ANNOTATION_DRIVER_UPGRADE_IN_PLACE] = "true"
        return NodePatch(node.name, {"metadata": metadata}, "start")
    if node.cordoned:
        # the administrator's cordon: recorded in the same patch, so no reader
        # ever sees our state on a cordon it could take for ours
        metadata["annotations"][N.ANNOTATION_PRE_CORDONED] = "true"
        return NodePatch(node.name, {"metadata": metadata}, "start")
    return NodePatch(node.name, {"spec": {"unschedulable": True}, "metadata": metadata}, "start")


def finish_patch(node: RolloutNode) -> NodePatch:
    body: Dict[str, Any] = {"metadata": {
        "labels": {N.LABEL_DRIVER_UPGRADE_STATE: None},
        "annotations": {N.ANNOTATION_PRE_CORDONED: None, N.ANNOTATION_DRIVER_UPGRADE_MESSAGE: None,
                        N.ANNOTATION_DRIVER_UPGRADE_TARGET: None, N.ANNOTATION_DRIVER_UPGRADE_IN_PLACE: None}}}
    if not node.admin_cordoned and not node.in_place:
        body["spec"] = {"unschedulable": False}
    return NodePatch(node.name, body, "finish")


def handback_patches(nodes: Sequence[Mapping[str, Any]]) -> Tuple[List[NodePatch], List[str]]:
    """The driver component goes (switched off, or the CR deleted) during a rollout.

    Nodes it started and that did not fail are handed back as a finished node
    is: our cordon lifted (an administrator's kept), our marks removed. Failed
    nodes are not patched: their names are returned, so that their cordon,
    state and message stay for the administrator, as after any failure.
    """
    patches, failed = [], []
    for node in nodes:
        view = rollout_node(node)
        if view.state in N.DRIVER_UPGRADE_FAILED_STATES:
            failed.append(view.name)
        elif view.state is not None:
            patches.append(finish_patch(view))
    return patches, failed


def validated(node: Mapping[str, Any], view: RolloutNode) -> bool:
    """A ``done`` node whose agents report the target version and a ready driver."""
    return view.state == N.DRIVER_UPGRADE_DONE and not view.outdated and \
        labels_of(node).get(N.LABEL_DRIVER_READY) == "true"


def driver_rollout(spec: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]], now: float,
                   previous: Optional[Mapping[str, Any]] = None) -> RolloutPlan:
    """The patches of one reconcile and ``status.driverUpgrade``.

    ``spec`` is the ClusterOperator spec, ``nodes`` every Node, ``now`` the
    time in seconds since the epoch, ``previous`` the last
    ``status.driverUpgrade`` (it keeps the running step pause).
    """
    driver = spec.get("driver") or {}
    target = str((driver.get("payload") or {}).get("version") or "")
    if not target or driver.get("deploy") is False:
        return RolloutPlan((), {})
    views = rollout_nodes(nodes, target, str(driver.get("deployPolicy") or "IfNotPresent"))
    by_name = {str((n.get("metadata") or {}).get("name")): n for n in nodes}
    # finish first, so the budget they free serves this decision already (a policy the
    # planner refuses does not stop that: a validated node's finish owes nothing to it)
    finish = [v for v in views if validated(by_name[v.name], v)]
    finished = {v.name for v in finish}
    patches = [finish_patch(v) for v in finish]
    views = [finished_node(v) if v.name in finished else v for v in views]
    try:
        decision = decide(views, upgrade_policy(driver), now, _previous_pause(previous or {}, target))
    except (PolicyError, TypeError, ValueError) as exc:
        message = "spec.driver.upgradePolicy: %s" % exc
        return RolloutPlan(tuple(patches), {"targetVersion": target, "message": message}, None, message)
    by_view = {v.name: v for v in views}
    patches.extend(start_patch(by_view[name], target, decision.cordon) for name in decision.start)
    return RolloutPlan(tuple(patches), rollout_status(target, decision, views), decision)


def rollout_status(target: str, decision: Decision, views: Sequence[RolloutNode]) -> Dict[str, Any]:
    """``status.driverUpgrade``: where the rollout is, in counts and the nodes that need a look."""
    reasons = {v.name: v.reason for v in views}
    status: Dict[str, Any] = {
        "targetVersion": target,
        "nodes": len(views),
        "upgraded": len(decision.done),
        "inProgress": sorted(set(decision.in_flight) | set(decision.start)),
        "failed": [{"node": name, "reason": reasons.get(name, "")} for name in decision.failed],
        "waiting": len(decision.waiting),
        "paused": decision.paused,
        "message": rollout_message(decision),
    }
    if decision.step is not None:
        status["step"] = decision.step + 1
    if decision.step_pause is not None:
        status["stepPause"] = {"step": decision.step_pause.step, "until": _iso(decision.step_pause.until)}
    return status


def rollout_message(decision: Decision) -> str:
    text = _rollout_message(decision)
    # enableRollout false: say so, every message is about in-place upgrades
    return text if decision.cordon else "in place (enableRollout false, no cordon): " + text


def _rollout_message(decision: Decision) -> str:
    if decision.paused:
        return "paused: " + decision.pause_reason
    if decision.pause_until is not None:
        return "between steps: the next starts at %s" % _iso(decision.pause_until)
    if decision.stuck:
        return "waiting: maxUnavailable %d is used up by %s" % (
            decision.max_unavailable, ", ".join(decision.unavailable))
    if decision.finished:
        left = ["%s (failed)" % name for name in decision.failed] + \
            ["%s (%s)" % (w.node, w.reason) for w in decision.waiting]
        return "every node is at the target" if not left else "over; not upgraded: " + ", ".join(left)
    moving = sorted(set(decision.in_flight) | set(decision.start))
    return "upgrading %s; %d waiting" % (", ".join(moving) or "none", len(decision.waiting))
