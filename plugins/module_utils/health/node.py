# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""What a health decision makes of the Node: its condition, its taint and the Events.

Pure builders (:func:`condition`, :func:`taints_after`, :func:`events`) and
:class:`NodeHealthWriter`, their I/O edge with the kubernetes client, which
writes only what changed (a condition whose status, reason and message are
the same is not written again; the taint only when it comes or goes).

The condition ``MetaXGPUHealthy`` (names.CONDITION_GPU_HEALTHY):

==========  ==========================  ================================================
status      reason                      when
==========  ==========================  ================================================
True        GPUsHealthy                 no signal fails
True        GPUSignalsObserved          only ``observe`` rows fail (the message lists them)
False       GPUHealthPolicyFailing      a ``node-condition`` or ``device-unhealthy`` row fails
False       GPUQuarantined              a ``quarantine`` row fails: the node is tainted
==========  ==========================  ================================================

The message names each failing GPU and signal with its severity and action.
Events (in gpu-device's namespace, on the Node: ``kubectl describe node``
lists them) are one per transition, never per reading; a recovery's Event
names the time the signal held the GPU out.
"""

from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from .. import names
from ..kube import node as kube_node
from .evaluate import ESCALATED, FAILING, RECOVERED, Decision, Transition
from .policy import ACTIONS, NODE_CONDITION, QUARANTINE

LOG = logging.getLogger("gpu-device.health")
REASON_HEALTHY = "GPUsHealthy"
REASON_OBSERVED = "GPUSignalsObserved"
REASON_FAILING = "GPUHealthPolicyFailing"
REASON_QUARANTINED = "GPUQuarantined"
MAX_MESSAGE = 1024           # the condition's message stays readable in kubectl describe
EVENT_COMPONENT = "gpu-device"


def _iso(at: float) -> str:
    return datetime.datetime.fromtimestamp(at, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def duration(seconds: float) -> str:
    """``3725`` -> ``1h2m5s``."""
    total = int(round(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return "".join("%d%s" % (n, u) for n, u in ((hours, "h"), (minutes, "m"), (secs, "s")) if n) or "0s"


def condition_state(decision: Decision) -> Tuple[str, str, str]:
    """(status, reason, message) of MetaXGPUHealthy."""
    if not decision.findings:
        return "True", REASON_HEALTHY, "every MetaX GPU passes the health policy"
    floor = ACTIONS.index(NODE_CONDITION)
    failing = [f for f in decision.findings if ACTIONS.index(f.rule.action) >= floor]
    # remediating findings first: a message cut at MAX_MESSAGE still names them (health/ladder.py reads them)
    shown = sorted(decision.findings, key=lambda f: (not f.rule.remediate, -ACTIONS.index(f.rule.action), f.index,
                                                     f.signal))
    text = "; ".join(f.describe() for f in shown)
    if decision.quarantine:
        status, reason = "False", REASON_QUARANTINED
        text = "quarantined (%s %s): %s" % (names.TAINT_GPU_HEALTH, decision.quarantine, text)
    elif failing:
        status, reason = "False", REASON_FAILING
    else:
        status, reason = "True", REASON_OBSERVED
    if len(text) > MAX_MESSAGE:
        text = text[:MAX_MESSAGE - 20].rsplit("; ", 1)[0] + "; ... (%d in all)" % len(shown)
    return status, reason, text


def condition(decision: Decision, previous: Optional[Mapping[str, Any]], now: float) -> Dict[str, Any]:
    """The condition object; lastTransitionTime kept while the status stays."""
    status, reason, message = condition_state(decision)
    since = previous.get("lastTransitionTime") if previous and previous.get("status") == status else None
    return {"type": names.CONDITION_GPU_HEALTHY, "status": status, "reason": reason, "message": message,
            "lastHeartbeatTime": _iso(now), "lastTransitionTime": since or _iso(now)}


def taints_after(taints: Sequence[Mapping[str, Any]], effect: Optional[str], now: float) -> Optional[List[Dict[str, Any]]]:
    """The node's taints with ours as ``effect`` says (None: none of ours); None when nothing changes.

    Only our key is touched; an administrator's taints stay as they are.
    """
    ours = [t for t in taints if t.get("key") == names.TAINT_GPU_HEALTH]
    others = [dict(t) for t in taints if t.get("key") != names.TAINT_GPU_HEALTH]
    if effect is None:
        return others if ours else None
    if len(ours) == 1 and ours[0].get("effect") == effect:
        return None
    taint = {"key": names.TAINT_GPU_HEALTH, "value": "true", "effect": effect, "timeAdded": _iso(now)}
    return others + [taint]


@dataclass(frozen=True)
class EventSpec:
    type: str       # Normal | Warning
    reason: str
    message: str


def _event_of(t: Transition) -> EventSpec:
    what = "GPU %d (%s) %s=%s" % (t.index, t.bdf, t.signal, "?" if t.value is None else t.value)
    if t.detail:
        what += " (%s)" % t.detail
    row = t.rule.describe()
    if t.kind == FAILING:
        warning = t.rule.severity != "info"
        return EventSpec("Warning" if warning else "Normal", "GPUHealthSignal",
                         "%s: %s [%s]" % (what, "failing" if warning else "observed", row))
    if t.kind == ESCALATED:
        return EventSpec("Warning", "GPUHealthEscalated", "%s: escalated [%s]" % (what, row))
    if t.kind != RECOVERED:
        raise ValueError("unknown transition %r" % (t.kind,))
    return EventSpec("Normal", "GPUHealthRecovered", "%s: recovered after %s out of service [%s]"
                     % (what, duration(t.out_of_service or 0), row))


def events(decision: Decision, before: Optional[Decision]) -> List[EventSpec]:
    """One Event per transition of a signal, and one when the quarantine comes, changes or goes."""
    out = [_event_of(t) for t in decision.transitions]
    was = before.quarantine if before is not None else None
    if decision.quarantine != was:
        if decision.quarantine:
            out.append(EventSpec("Warning", "GPUQuarantined", "taint %s:%s added (%s)" % (
                names.TAINT_GPU_HEALTH, decision.quarantine,
                "; ".join(f.describe() for f in decision.findings if f.rule.action == QUARANTINE))))
        else:
            since = min((t.at - (t.out_of_service or 0) for t in decision.transitions if t.kind == RECOVERED),
                        default=None)
            out.append(EventSpec("Normal", "GPUQuarantineLifted", "taint %s removed%s" % (
                names.TAINT_GPU_HEALTH, "" if since is None else
                " after %s out of service" % duration(decision.at - since))))
    if decision.ladder:
        for request in decision.ladder:
            out.append(EventSpec("Warning", "GPURemediationRequested", "GPU %s %s: remediation requested, from "
                                 "step %s (driver-manager climbs the ladder)" % (
                                     request.bdf, request.signal, request.step)))
    return out


class NodeHealthWriter:
    """Writes the condition (nodes/status), the taint (nodes) and Events for one node."""

    def __init__(self, core: Any, node: str, namespace: str, clock: Callable[[], float],
                 timeout: float = 10.0) -> None:
        self.core = core
        self.node = node
        self.namespace = namespace
        self.clock = clock
        self.timeout = timeout
        self._written: Optional[Tuple[str, str, str]] = None      # the condition last written
        self._tainted: Optional[str] = None                        # the taint effect last written ...
        self._taint_known = False                                  # ... once one was
        self.event_failures = 0

    def _read(self) -> Dict[str, Any]:
        """The Node as JSON (raw: the few fields read, none of the client's model building)."""
        return kube_node.read_node(self.core, self.node, timeout=self.timeout)

    def write(self, decision: Decision, before: Optional[Decision]) -> None:
        """Events for ``decision``'s transitions (a failure is logged: an Event is not retried), then
        the condition and the taint when they differ from what was written; those raise what the
        client raises, and are written again on the next call."""
        now = self.clock()
        for spec in events(decision, before):
            try:
                self.post_event(spec, now)
            except Exception as exc:  # pylint: disable=broad-except  # the client raises many kinds
                self.event_failures += 1
                LOG.warning("cannot record the event %s (%s): %s", spec.reason, spec.message, exc)
        state = condition_state(decision)
        if state != self._written or not self._taint_known or decision.quarantine != self._tainted:
            node = self._read()
            # the taint first: its patch is tested against the resourceVersion just read
            self._write_taint(node, decision.quarantine, now)
            self._write_condition(node, decision, now, state)

    def _write_condition(self, node: Mapping[str, Any], decision: Decision, now: float,
                         state: Tuple[str, str, str]) -> None:
        current = next((c for c in (node.get("status") or {}).get("conditions") or []
                        if c.get("type") == names.CONDITION_GPU_HEALTHY), None)
        if current is not None and (current.get("status"), current.get("reason"), current.get("message")) == state:
            self._written = state
            return
        body = {"status": {"conditions": [condition(decision, current, now)]}}
        # strategic merge: conditions merge by type, the kubelet's stay as they are
        kube_node.patch_node_status(self.core, self.node, body, timeout=self.timeout)
        self._written = state
        LOG.info("node condition %s=%s (%s): %s", names.CONDITION_GPU_HEALTHY, state[0], state[1], state[2])

    def _write_taint(self, node: Mapping[str, Any], effect: Optional[str], now: float) -> None:
        taints = (node.get("spec") or {}).get("taints") or []
        new = taints_after(taints, effect, now)
        if new is not None:
            # JSON patch guarded by the resourceVersion: a concurrent change of the taints (an
            # administrator's) fails the test and is read again next time, never overwritten
            patch: List[Dict[str, Any]] = [{"op": "test", "path": "/metadata/resourceVersion",
                                            "value": (node.get("metadata") or {}).get("resourceVersion")},
                                           {"op": "add", "path": "/spec/taints", "value": new}]
            kube_node.json_patch_node(self.core, self.node, patch, timeout=self.timeout)
            LOG.info("taint %s %s", names.TAINT_GPU_HEALTH, "set to %s" % effect if effect else "removed")
        self._tainted, self._taint_known = effect, True

    def post_event(self, spec: EventSpec, now: float) -> None:
        stamp = _iso(now)
        body = {
            "metadata": {"generateName": "%s.gpu-health." % self.node, "namespace": self.namespace},
            # the involvedObject names our namespace: the API server refuses an Event about a
            # cluster-scoped object outside "default" otherwise (as driver-manager's Events do)
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": self.node,
                               "namespace": self.namespace},
            "reason": spec.reason, "message": spec.message[:1000], "type": spec.type,
            "source": {"component": EVENT_COMPONENT, "host": self.node},
            "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
        }
        self.core.create_namespaced_event(self.namespace, body, _request_timeout=self.timeout)
