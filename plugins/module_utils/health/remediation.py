# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The remediation ladder climbed on one node: driver-manager's procedure (health/ladder.py decides).

Each driver-manager round calls :meth:`Ladder.round` with the Node it read.
Idle (no remediating finding, no incident) it makes no request at all. During
an incident it decides (:func:`.ladder.decide`), acts, reads the node again
and decides again, until a step waits for its result:

* the cordon, and the hold (owner ``health``), through the node-maintenance
  protocol (maintenance/run.py ``pause``/``resume`` over this node's API),
  the ladder's state written with the hold in the same patch;
* the budget: a slot of a Lease pool (kube/slots.py, ``maxNodes`` slots)
  taken before the cordon, given back at the recovery;
* the eviction: NodeApi.evict_gpu_pods (the Eviction API, through the eviction
  guard; a PodDisruptionBudget's refusal is waited out, never overridden);
* the driver reload: the ``reload`` it is given (driver/reload.py, refused
  while a GPU is in use), then the node's gpu-device and gpu-label restarted;
* the reboot request: the annotation ``gpu-health.reboot-required`` (and the
  policy's ``rebootSentinel`` file under the host root).

Every step is in the node's MetaXGPURemediation condition (written when it
changes) and an Event on the Node. Standard library only; the API is
:class:`..nodeapi.RemediationApi` (the unit tests' fake, driver-manager's Kube).
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import time
from dataclasses import replace
from typing import Any, Callable, Dict, List, Mapping, Optional, Protocol, Sequence, Set, Tuple

from .. import maintenance, names
from ..driver.errors import DriverError
from ..host import HostRoot, HostRootError
from ..kube import evict as kube_evict
from ..nodeapi import DRIVER_READERS_SELECTOR, RemediationApi
from . import ladder as L
from .node import duration
from .policy import PolicyError, Remediation, parse_policy

LOG = logging.getLogger("driver-manager")
# How long one round waits for evicted pods to leave (the step's whole budget is evictTimeoutSeconds:
# the next rounds look again), as vfnum's eviction.
EVICT_WAIT = 10.0
# Actions in one round at most (cordon, evict, reload, request, and the reads between).
MAX_ACTIONS = 6
EVENT_REASONS = {L.CORDON: "GPURemediationCordon", L.EVICT: "GPURemediationEvict",
                 L.DRIVER_RELOAD: "GPURemediationDriverReload", L.REBOOT_REQUEST: "GPURemediationRebootRequest"}


class Budget(Protocol):
    """The nodes in remediation at once (kube/slots.py ``Slots``)."""

    holders: Sequence[str]

    def take(self) -> Any:
        """A slot (None: all held by others)."""

    def release(self) -> None:
        """The slot given back (nothing when none is held)."""


class _OnThisNode:
    """maintenance.run's MaintenanceApi over this node's RemediationApi (no agents paused, no eviction)."""

    def __init__(self, api: RemediationApi) -> None:
        self.api = api

    def read_node(self, node: str) -> Mapping[str, Any]:
        return self.api.read_node()

    def patch_node(self, node: str, body: Mapping[str, Any]) -> None:
        self.api.merge_patch_node(body)

    def agent_pods(self, node: str) -> List[str]:
        return []

    def evict(self, node: str, request: Any, check_mode: bool) -> Dict[str, List[str]]:
        raise maintenance.MaintenanceError("the ladder evicts through its node's API, not the protocol's")


def _iso(at: float) -> str:
    return datetime.datetime.fromtimestamp(at, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _meta(node: Mapping[str, Any], field: str) -> Dict[str, str]:
    return dict((node.get("metadata") or {}).get(field) or {})


class Ladder:
    """One node's remediation ladder (see the module's doc)."""

    def __init__(self, api: RemediationApi, node: str, host: Optional[HostRoot], reload: Callable[[], str],
                 budget_of: Callable[[int], Budget], clock: Callable[[], float] = time.time) -> None:
        self.api = api
        self.node = node
        self.host = host
        self.reload = reload
        self.budget_of = budget_of
        self.clock = clock
        self._budget: Optional[Budget] = None
        self._budget_size = 0
        self._policy_text: Optional[str] = None
        self.settings = Remediation()
        self._waiting = ""              # the last wait reported (one Event per distinct wait)

    # -- inputs --------------------------------------------------------------------
    def load_settings(self) -> Remediation:
        """The policy's ``remediation`` (read only during an incident); a policy that cannot be read
        keeps the settings in force, as gpu-device keeps its policy."""
        text = self.api.health_policy()
        if text != self._policy_text:
            self._policy_text = text
            try:
                self.settings = parse_policy(json.loads(text) if text and text.strip() else {}).remediation
            except (ValueError, PolicyError) as exc:
                LOG.error("health policy not used by the remediation ladder: %s", exc)
        return self.settings

    def budget(self, size: int) -> Budget:
        if self._budget is None or (size != self._budget_size and not getattr(self._budget, "held", None)):
            self._budget, self._budget_size = self.budget_of(size), size
        return self._budget

    def facts(self, node: Mapping[str, Any], state: Optional[L.State]) -> L.Facts:
        pods: Tuple[str, ...] = ()
        if state is not None and state.step == L.EVICT and not state.stopped:
            pods = tuple(self.api.gpu_pods())
        return L.Facts(now=self.clock(), findings=L.remediating(L.health_condition(node)),
                       cordoned=bool((node.get("spec") or {}).get("unschedulable")),
                       holder=maintenance.owner_of(maintenance.node_view(node)), gpu_pods=pods)

    # -- the round -----------------------------------------------------------------
    def round(self, node: Optional[Mapping[str, Any]] = None) -> str:
        """Decide and act until a step waits; the last decision's action."""
        node = node if node is not None else self.api.read_node()
        state = L.parse_state(_meta(node, "annotations").get(names.ANNOTATION_HEALTH_REMEDIATION))
        if state is None and not L.remediating(L.health_condition(node)):
            self._settle_idle(node)
            return L.NONE
        settings = self.load_settings()
        if state is not None and not state.stopped:
            self.budget(settings.max_nodes).take()     # ours again after a restart (the Lease is renewed)
        done: Set[str] = set()
        plan = L.Plan(L.NONE)
        for _action in range(MAX_ACTIONS):
            facts = self.facts(node, state)
            plan = L.decide(state, facts, settings)
            if plan.action in done:            # a step acted on this round already waits for its result
                plan = L.Plan(L.WAIT, plan.reason)
            done.add(plan.action)
            state, more = self.act(plan, state, facts, settings, node)
            if not more:
                break
            node = self.api.read_node()
        return plan.action

    def act(self, plan: L.Plan, state: Optional[L.State], facts: L.Facts, settings: Remediation,
            node: Mapping[str, Any]) -> Tuple[Optional[L.State], bool]:
        """Carry out ``plan``; the state after it and whether to decide again now."""
        action = plan.action
        if action == L.NONE:          # stopped for this incident: the condition says so, no more Events
            self.write_condition(L.condition_state(state), node)
            return state, False
        if action == L.WAIT:
            self.wait(state, plan.reason, node)
            return state, False
        if action == L.START:
            state = self.start(facts, settings, node)
            return state, state is not None          # None: waiting for the budget or another hold
        if action == L.RECOVER:
            self.recover(state, facts, node)
            return None, False
        if action == L.STOP:
            return self.stop(state, plan.reason, node), False
        if state is None:
            raise ValueError("internal: step %s without a ladder state" % action)
        if action == L.EVICT:
            return self.evict(state, facts, node)
        if action == L.DRIVER_RELOAD:
            return self.reload_driver(state, facts, node), True
        if action == L.REBOOT_REQUEST:
            return self.request_reboot(state, plan.reason, facts, settings, node), False
        raise ValueError("internal: unknown ladder action %r" % action)

    # -- the steps -------------------------------------------------------------------
    def start(self, facts: L.Facts, settings: Remediation, node: Mapping[str, Any]) -> Optional[L.State]:
        budget = self.budget(settings.max_nodes)
        if budget.take() is None:
            self.wait(None, "waits for one of %d remediation slot(s) (remediation.maxNodes; held by %s): %s"
                      % (settings.max_nodes, ", ".join(budget.holders) or "?", "; ".join(facts.findings)), node)
            return None
        state = L.State(step=L.CORDON, result=L.RESULT_OK, incident=facts.now, since=facts.now,
                        findings=facts.findings)
        try:
            outcome = maintenance.pause(_OnThisNode(self.api), self.node, L.OWNER, cordon=True, pause_agents=False,
                                        message=state.to_json())
        except maintenance.MaintenanceConflict as exc:
            budget.release()
            self.wait(None, "the node is held by %s's maintenance: the ladder waits for it" % exc.holder, node)
            return None
        admin = outcome.change.cordon_kept
        state = replace(state, cordon=names.MAINTENANCE_CORDON_ADMIN if admin else names.MAINTENANCE_CORDON_OURS)
        state = state.record("cordon: " + ("the administrator's cordon kept (never lifted by the ladder)" if admin
                                           else "cordoned"))
        self.save(state)
        self.report(state, L.CORDON, "%s for %s" % (state.history[-1], "; ".join(facts.findings)))
        return state

    def evict(self, state: L.State, facts: L.Facts, node: Mapping[str, Any]) -> Tuple[L.State, bool]:
        if state.step != L.EVICT:
            state = replace(state, step=L.EVICT, result=L.RESULT_RUNNING, since=facts.now)
            self.save(state)
            pods = self.api.gpu_pods()
            self.report(state, L.EVICT, "evicting %s through the Eviction API" % (
                ", ".join(pods) if pods else "the GPU pods (none on the node)"))
        try:
            evicted = self.api.evict_gpu_pods(EVICT_WAIT)
        except kube_evict.EvictionError as exc:
            why = "; ".join("eviction of %s refused: %s" % item for item in sorted(exc.refused.items())) \
                if exc.refused else "pod(s) %s still leaving" % ", ".join(exc.remaining)
            self.wait(state, "evict: %s (retried; up to %d s)" % (why, self.settings.evict_timeout_seconds), node)
            return state, False
        state = state.record("evict: %s" % ("evicted " + ", ".join(evicted) if evicted else "no GPU pod"))
        self.save(state)
        return state, True

    def reload_driver(self, state: L.State, facts: L.Facts, node: Mapping[str, Any]) -> L.State:
        state = replace(state, step=L.DRIVER_RELOAD, result=L.RESULT_RUNNING, since=facts.now)
        self.save(state)
        try:
            text = self.reload()
            result = L.RESULT_OK
        except (DriverError, HostRootError, OSError) as exc:
            text, result = "failed: %s" % exc, L.RESULT_FAILED
        state = replace(state, result=result, since=self.clock()).record("driver-reload: " + text)
        self.save(state)
        if result == L.RESULT_OK:
            # the GPUs were bound anew: gpu-device registers them and reads their health from scratch
            self.api.restart_gpu_device(DRIVER_READERS_SELECTOR)
        self.report(state, L.DRIVER_RELOAD, state.history[-1], warning=result != L.RESULT_OK)
        return state

    def request_reboot(self, state: L.State, why: str, facts: L.Facts, settings: Remediation,
                       node: Mapping[str, Any]) -> L.State:
        state = replace(state, step=L.REBOOT_REQUEST, result=L.RESULT_OK, since=facts.now)
        state = state.record("reboot-request: %s; %s=%s" % (why, names.ANNOTATION_REBOOT_REQUIRED, _iso(facts.now)))
        self.api.patch_node({}, {names.ANNOTATION_HEALTH_REMEDIATION: state.to_json(),
                                 names.ANNOTATION_REBOOT_REQUIRED: _iso(facts.now)})
        if settings.reboot_sentinel and self.host is not None:
            try:
                os.makedirs(os.path.dirname(self.host.join(settings.reboot_sentinel)), exist_ok=True)
                self.host.write_file_atomic(settings.reboot_sentinel, b"metax-gpu health remediation\n")
            except (OSError, HostRootError) as exc:
                LOG.error("cannot write the reboot sentinel /%s: %s", settings.reboot_sentinel, exc)
        self.report(state, L.REBOOT_REQUEST, state.history[-1])
        return state

    def recover(self, state: Optional[L.State], facts: L.Facts, node: Mapping[str, Any]) -> None:
        kept = False
        try:
            outcome = maintenance.resume(_OnThisNode(self.api), self.node, L.OWNER, uncordon=True, message="")
            kept = outcome.change.cordon_kept
        except maintenance.MaintenanceConflict:
            self.api.patch_node({}, {names.ANNOTATION_HEALTH_REMEDIATION: None})
        if names.ANNOTATION_REBOOT_REQUIRED in _meta(node, "annotations"):
            self.api.patch_node({}, {names.ANNOTATION_REBOOT_REQUIRED: None})
        self.remove_sentinel()
        if self._budget is not None:
            self._budget.release()
        out = facts.now - state.incident if state is not None else 0.0
        text = "healthy again after %s in remediation%s" % (
            duration(out), "; the administrator's cordon kept" if kept else "; uncordoned" if facts.cordoned else "")
        self._waiting = ""
        self.write_condition(("False", "Recovered", text), node)
        self.api.node_event("GPURemediationRecovered", text, warning=False)
        LOG.info("remediation: %s", text)

    def stop(self, state: Optional[L.State], why: str, node: Mapping[str, Any]) -> Optional[L.State]:
        if state is None:
            return None
        state = replace(state, stopped=why).record("stopped: " + why)
        try:
            maintenance.resume(_OnThisNode(self.api), self.node, L.OWNER, uncordon=True, message=state.to_json())
        except maintenance.MaintenanceConflict:
            self.save(state)
        # the node is the administrator's again: no reboot asked for on the ladder's behalf
        if names.ANNOTATION_REBOOT_REQUIRED in _meta(node, "annotations"):
            self.api.patch_node({}, {names.ANNOTATION_REBOOT_REQUIRED: None})
        self.remove_sentinel()
        if self._budget is not None:
            self._budget.release()
        self.write_condition(L.condition_state(state), node)
        self.api.node_event("GPURemediationStopped", why)
        LOG.warning("remediation stopped: %s", why)
        return state

    # -- records ---------------------------------------------------------------------
    def save(self, state: L.State) -> None:
        self.api.patch_node({}, {names.ANNOTATION_HEALTH_REMEDIATION: state.to_json()})

    def report(self, state: L.State, step: str, message: str, warning: bool = True) -> None:
        """The step's Event and the condition (read back from the node only when it may differ)."""
        self._waiting = ""
        self.api.node_event(EVENT_REASONS[step], message, warning=warning)
        self.write_condition(L.condition_state(state), None)
        LOG.info("remediation step %s: %s", step, message)

    def wait(self, state: Optional[L.State], why: str, node: Mapping[str, Any]) -> None:
        """A step waiting for its result (or the ladder for its budget): said once."""
        if why and why != self._waiting:
            self._waiting = why
            self.api.node_event("GPURemediationWaiting", why, warning=False)
            LOG.info("remediation: %s", why)
        self.write_condition(L.condition_state(state, why), node)

    def write_condition(self, wanted: Tuple[str, str, str], node: Optional[Mapping[str, Any]]) -> None:
        current = None
        for cond in ((node or {}).get("status") or {}).get("conditions") or []:
            if cond.get("type") == names.CONDITION_GPU_REMEDIATION:
                current = cond
        if current is not None and (current.get("status"), current.get("reason"), current.get("message")) == wanted:
            return
        now = _iso(self.clock())
        since = current.get("lastTransitionTime") if current and current.get("status") == wanted[0] else None
        self.api.write_condition({"type": names.CONDITION_GPU_REMEDIATION, "status": wanted[0], "reason": wanted[1],
                                  "message": wanted[2], "lastHeartbeatTime": now,
                                  "lastTransitionTime": since or now})

    def _settle_idle(self, node: Mapping[str, Any]) -> None:
        """No incident: a condition left True (a state removed by hand) is put right; else nothing."""
        for cond in (node.get("status") or {}).get("conditions") or []:
            if cond.get("type") == names.CONDITION_GPU_REMEDIATION and cond.get("status") == "True":
                self.write_condition(L.condition_state(None), node)

    def remove_sentinel(self) -> None:
        path = self.settings.reboot_sentinel
        if path and self.host is not None and os.path.lexists(self.host.join(path)):
            try:
                os.unlink(self.host.join(path))
            except OSError as exc:
                LOG.warning("cannot remove the reboot sentinel /%s: %s", path, exc)
