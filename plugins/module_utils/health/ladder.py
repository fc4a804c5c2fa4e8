# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The remediation ladder's decisions (issue 42, docs/health.md "Remediation"). Pure.

While a row with ``remediate: true`` fails on a node (gpu-device marks such
findings ``remediate`` in the MetaXGPUHealthy condition's message),
driver-manager on that node climbs the ladder, one step at a time, each step
waiting for its result before the next:

1. ``cordon``: the node held for owner ``health`` through the node-maintenance
   protocol (maintenance/plan.py), which cordons it and records the cordon as
   ours -- or, already cordoned by an administrator, records theirs and never
   lifts it; result: the node unschedulable;
2. ``evict``: the GPU pods evicted through the Eviction API (a
   PodDisruptionBudget is respected); result: no pod holds a GPU. Pods still
   there after ``evictTimeoutSeconds``: no driver reload under them, the
   ladder goes to the reboot request;
3. ``driver-reload``: the driver unloaded and loaded through the driver
   module's in-use-safe path (refused while a GPU is in use), verified;
   result: the health read again -- within ``settleSeconds`` it recovers, or
   the last step comes;
4. ``reboot-request``: the annotation ``gpu-health.reboot-required`` (and a
   sentinel file when the policy names one) for a reboot tool such as kured.

Healthy again (the remediating findings gone from the condition: gpu-device
cleared them after its clean readings) at any step: the climb stops, our
cordon is lifted (an administrator's stays), the hold and the budget's slot
are released. No more than ``maxNodes`` nodes climb at once (a slot of a
Lease pool, taken before the cordon). An administrator who uncordons the node
(or removes the hold) during an incident stops the ladder for that incident:
it never cordons the node again until the node has recovered.

:func:`decide` takes the ladder's :class:`State` (kept on the node as JSON in
``gpu-health.remediation``) and what the node shows now (:class:`Facts`), and
says what to do (:class:`Plan`); health/remediation.py does it.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Mapping, Optional, Tuple

from .. import names
from .evaluate import REMEDIATE_MARK
from .policy import LADDER_STEPS, Remediation

CORDON, EVICT, DRIVER_RELOAD, REBOOT_REQUEST = LADDER_STEPS
OWNER = names.MAINTENANCE_OWNER_HEALTH
# what decide() may answer
NONE = "none"            # nothing to do
START = "start"          # take a slot, hold and cordon (step cordon)
WAIT = "wait"            # the current step's result is not there yet
RECOVER = "recover"      # healthy again: lift our cordon, release the hold and the slot
STOP = "stop"            # the administrator took the node back: release, never cordon again this incident
# the steps' own actions are the step names (EVICT, DRIVER_RELOAD, REBOOT_REQUEST)
RESULT_OK = "ok"
RESULT_FAILED = "failed"
RESULT_RUNNING = "running"
HISTORY = 8              # step records kept in the state (the condition's message shows them)

# a finding as Finding.describe() writes it: "GPU 5 (0000:0f:00.0) ecc-dram-uncorrectable=1 [critical, ...]"
_FINDING = re.compile(r"GPU (-?\d+) \(([^)]*)\) ([a-z0-9-]+)=(\S+) \[([^\]]*)\]")


def remediating(condition: Optional[Mapping[str, Any]]) -> Tuple[str, ...]:
    """The findings of remediating rows in gpu-device's MetaXGPUHealthy condition (``GPU i (bdf)
    signal=value``), sorted; () while it is not False or names none."""
    if not condition or condition.get("status") != "False":
        return ()
    out = set()
    for match in _FINDING.finditer(str(condition.get("message") or "")):
        marks = [m.strip() for m in match.group(5).split(",")]
        if REMEDIATE_MARK in marks:
            out.add("GPU %s (%s) %s=%s" % match.group(1, 2, 3, 4))
    return tuple(sorted(out))


def health_condition(node: Mapping[str, Any]) -> Optional[Mapping[str, Any]]:
    """The Node's MetaXGPUHealthy condition (None: gpu-device wrote none)."""
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == names.CONDITION_GPU_HEALTHY:
            return cond
    return None


@dataclass(frozen=True)
class State:
    """The ladder on one node during an incident (the annotation ``gpu-health.remediation``)."""

    step: str                              # the step reached (LADDER_STEPS)
    result: str = RESULT_RUNNING           # its result so far: running | ok | failed
    incident: float = 0.0                  # when the ladder started (the out-of-service time counts from it)
    since: float = 0.0                     # when this step started, or (driver-reload ok) the health's settling
    cordon: str = ""                       # "ours" | "admin": whose the cordon was when the ladder held the node
    stopped: str = ""                      # why the ladder stopped for this incident ("": it climbs)
    findings: Tuple[str, ...] = ()         # what it remediates
    history: Tuple[str, ...] = field(default_factory=tuple)   # "step: result" records, oldest first

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    def record(self, text: str) -> "State":
        return replace(self, history=(self.history + (text,))[-HISTORY:])


def parse_state(text: Optional[str]) -> Optional[State]:
    """The annotation's State; None for none, or for one that cannot be read (the ladder starts again)."""
    if not text:
        return None
    try:
        doc = json.loads(text)
        if not isinstance(doc, dict) or doc.get("step") not in LADDER_STEPS:
            return None
        return State(step=doc["step"], result=str(doc.get("result") or RESULT_RUNNING),
                     incident=float(doc.get("incident") or 0), since=float(doc.get("since") or 0),
                     cordon=str(doc.get("cordon") or ""), stopped=str(doc.get("stopped") or ""),
                     findings=tuple(str(f) for f in doc.get("findings") or ()),
                     history=tuple(str(h) for h in doc.get("history") or ()))
    except (ValueError, TypeError):
        return None


@dataclass(frozen=True)
class Facts:
    """What the node shows now."""

    now: float
    findings: Tuple[str, ...]              # remediating findings (remediating()): () is healthy
    cordoned: bool                         # spec.unschedulable
    holder: Optional[str]                  # the maintenance owner holding the node (None: no one)
    gpu_pods: Tuple[str, ...] = ()         # pods holding the node's GPUs (asked only while climbing)


@dataclass(frozen=True)
class Plan:
    action: str                            # NONE, START, WAIT, RECOVER, STOP, or a step (EVICT, ...)
    reason: str = ""


def decide(state: Optional[State], facts: Facts, settings: Remediation) -> Plan:
    """What the ladder does now on this node (see the module's doc)."""
    if state is None:
        if not facts.findings:
            return Plan(NONE)
        if facts.holder not in (None, OWNER):
            return Plan(WAIT, "the node is held by %s's maintenance (%s): the ladder waits for it"
                        % (facts.holder, names.ANNOTATION_MAINTENANCE_OWNER))
        return Plan(START)
    if not facts.findings:
        return Plan(RECOVER)
    if state.stopped:
        return Plan(NONE, state.stopped)
    if facts.holder != OWNER:
        return Plan(STOP, "the hold (%s=%s) was removed: the ladder stops for this incident"
                    % (names.ANNOTATION_MAINTENANCE_OWNER, OWNER))
    if not facts.cordoned:
        return Plan(STOP, "the node was uncordoned during the remediation: the administrator's call, the "
                    "ladder stops for this incident and does not cordon it again")
    if state.step == CORDON:
        return Plan(EVICT)
    if state.step == EVICT:
        if not facts.gpu_pods:
            return Plan(DRIVER_RELOAD)
        waited = facts.now - state.since
        if waited >= settings.evict_timeout_seconds:
            return Plan(REBOOT_REQUEST, "pod(s) %s still on the node %.0f s after their eviction: no driver "
                        "reload under them" % (", ".join(facts.gpu_pods), waited))
        return Plan(EVICT)
    if state.step == DRIVER_RELOAD:
        if state.result != RESULT_OK:
            return Plan(REBOOT_REQUEST, "the driver reload did not succeed")
        waited = facts.now - state.since
        if waited >= settings.settle_seconds:
            return Plan(REBOOT_REQUEST, "still failing %.0f s after the driver reload" % waited)
        return Plan(WAIT, "driver reloaded: the health is read again (up to %d s before the reboot request)"
                    % settings.settle_seconds)
    return Plan(WAIT, "reboot requested (%s): waiting for the node to come back healthy"
                % names.ANNOTATION_REBOOT_REQUIRED)


def condition_state(state: Optional[State], waiting: str = "") -> Tuple[str, str, str]:
    """(status, reason, message) of MetaXGPURemediation: True while the ladder holds the node."""
    if state is None:
        if waiting:
            return "False", "RemediationWaiting", waiting
        return "False", "NoRemediation", "no GPU health remediation on this node"
    if state.stopped:
        return "False", "RemediationStopped", _message(state, state.stopped)
    reason = {CORDON: "Cordoned", EVICT: "EvictingGPUPods", DRIVER_RELOAD: "DriverReloaded",
              REBOOT_REQUEST: "RebootRequested"}[state.step]
    if state.step == DRIVER_RELOAD and state.result != RESULT_OK:
        reason = "DriverReloadFailed"
    return "True", reason, _message(state, waiting)


def _message(state: State, extra: str) -> str:
    parts = ["; ".join(state.history)] if state.history else []
    if extra:
        parts.append(extra)
    if state.findings:
        parts.append("for " + "; ".join(state.findings))
    return (". ".join(parts))[:1000]
