# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""ClusterOperator status from what the cluster reports: pure functions, no I/O.

Per component: ``Ready``, ``Progressing`` and ``Degraded`` conditions whose
messages name the nodes concerned (a node stuck with no explanation is what
users of other operators complain about). A component is Ready only when it is
ready on every node it targets: a GPU node its readiness chain still keeps it
off (``waiting``) makes it not Ready, naming the node and the label. The CR's
own ``Ready`` names every component that is not, with its nodes, and
``IgnoredFields`` names what the CR and the chart's values carry that the
operator accepts but does not act on (:func:`ignored_fields`). The status is
only written when it differs from the stored one (:func:`same_status`), so an
idle controller makes no API writes.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

from .. import names
from .contract import Component, deployed, gate_selector
from .mapping import IGNORED_VALUES_ANNOTATION

# Fields of ClusterOperator.spec that the CRD accepts, as the real 0.9.2 CR has them, and the
# operator does not act on: path -> the value it acts as if given (None: any value set is
# reported). The firmware options: no firmware is flashed.
IGNORED_SPEC: Dict[str, Optional[object]] = {
    "driver.fwEffectPolicy": None,
    "driver.fwEnableVirt": None,
    "driver.fwUpgradePolicy": None,
}
IGNORED_CONDITION = "IgnoredFields"

# Waiting reasons of a container that mean it will not get better by itself.
BROKEN_WAITING = frozenset(("CrashLoopBackOff", "ImagePullBackOff", "ErrImagePull", "CreateContainerConfigError",
                            "CreateContainerError", "InvalidImageName"))


def condition(kind: str, true: bool, reason: str, message: str) -> Dict[str, str]:
    return {"type": kind, "status": "True" if true else "False", "reason": reason, "message": message}


def _nodes(names: Iterable[str], limit: int = 5) -> str:
    ordered = sorted(set(names))
    text = ", ".join(ordered[:limit])
    return text + (" and %d more" % (len(ordered) - limit) if len(ordered) > limit else "")


def pod_problem(pod: Mapping[str, Any]) -> Optional[str]:
    """Why a pod is broken (a waiting reason that needs a human), or None."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        waiting = (status.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in BROKEN_WAITING:
            return waiting["reason"]
    return None


def pod_ready(pod: Mapping[str, Any]) -> bool:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return False


def waiting_nodes(component: Component, registry: Sequence[Component], spec: Mapping[str, Any],
                  nodes: Iterable[Mapping[str, Any]]) -> Dict[str, List[str]]:
    """GPU nodes the component's gate still keeps it off: node -> the labels missing."""
    gate = gate_selector(component, registry, spec)
    gpu_gate = {k: v for k, v in gate.items() if k not in component.requires}
    out: Dict[str, List[str]] = {}
    for node in nodes:
        labels = (node.get("metadata") or {}).get("labels") or {}
        if any(labels.get(k) != v for k, v in gpu_gate.items()):
            continue  # not a node this component is for
        missing = [k for k, v in gate.items() if labels.get(k) != v]
        if missing:
            out[node["metadata"]["name"]] = missing
    return out


def node_messages(component: Component, nodes: Iterable[Mapping[str, Any]]) -> Dict[str, str]:
    """Node -> what the component's agent reported there (its ``message_annotations``, joined).

    A message that says the agent waits (``names.PENDING_MESSAGE_PREFIX``: an
    in-place driver upgrade waiting for idle GPUs) is no failure, so no Degraded.
    """
    out: Dict[str, str] = {}
    for node in nodes:
        annotations = (node.get("metadata") or {}).get("annotations") or {}
        found = [annotations[k] for k in component.message_annotations
                 if annotations.get(k) and not str(annotations[k]).startswith(names.PENDING_MESSAGE_PREFIX)]
        if found:
            out[node["metadata"]["name"]] = "; ".join(found)
    return out


def component_status(component: Component, spec: Mapping[str, Any], workload: Optional[Mapping[str, Any]],
                     pods: Sequence[Mapping[str, Any]], waiting: Mapping[str, List[str]],
                     problems: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
    """One entry of ``status.components``; ``problems``: node -> what its agent reported (Degraded)."""
    name = component.name
    if not deployed(component, spec):
        reason = "MinimalMode" if spec.get("minimal") and not component.minimal else "NotDeployed"
        return {"name": name, "deployed": False, "desired": 0, "ready": 0, "conditions": [
            condition("Ready", True, reason, "%s is not deployed" % name),
            condition("Progressing", False, reason, ""), condition("Degraded", False, reason, "")]}
    if workload is None:
        return {"name": name, "deployed": True, "desired": 0, "ready": 0, "conditions": [
            condition("Ready", False, "Creating", "%s %s does not exist yet" % (component.kind, name)),
            condition("Progressing", True, "Creating", ""), condition("Degraded", False, "Creating", "")]}
    st = workload.get("status") or {}
    generation = (workload.get("metadata") or {}).get("generation", 0)
    if component.kind == "DaemonSet":
        desired, ready = st.get("desiredNumberScheduled", 0), st.get("numberReady", 0)
        updated = st.get("updatedNumberScheduled", 0)
    else:
        desired = (workload.get("spec") or {}).get("replicas", 1)
        ready, updated = st.get("readyReplicas", 0), st.get("updatedReplicas", 0)
    current = st.get("observedGeneration", 0) >= generation and ready == desired and updated == desired
    not_ready = [p["spec"].get("nodeName") or p["metadata"]["name"] for p in pods if not pod_ready(p)]
    broken: Dict[str, str] = {}
    for pod in pods:
        problem = pod_problem(pod)
        if problem:
            broken[pod["spec"].get("nodeName") or pod["metadata"]["name"]] = problem
    conditions = []
    if current and waiting:
        # ready where it runs, but GPU nodes it targets still wait for a component before it in the
        # chain (driver, MACA, runtime): not Ready there, so not Ready (the blocker's own entry says why)
        message = "%d/%d pods ready; waiting for %s on %s" % (
            ready, desired, ", ".join(sorted({label for labels in waiting.values() for label in labels})),
            _nodes(waiting))
        conditions.append(condition("Ready", False, "WaitingForChain", message))
        conditions.append(condition("Progressing", False, "WaitingForChain", ""))
    elif current:
        conditions.append(condition("Ready", True, "PodsReady", "%d/%d pods ready" % (ready, desired)))
        conditions.append(condition("Progressing", False, "PodsReady", ""))
    else:
        message = "%d/%d pods ready" % (ready, desired)
        if not_ready:
            message += ", not ready on %s" % _nodes(not_ready)
        conditions.append(condition("Ready", False, "RollingOut", message))
        conditions.append(condition("Progressing", True, "RollingOut", message))
    if broken:
        conditions.append(condition("Degraded", True, sorted(set(broken.values()))[0],
                                    "pods failing on %s" % _nodes(broken)))
    elif problems:
        conditions.append(condition("Degraded", True, "NodeReported", "; ".join(
            "%s: %s" % (node, problems[node]) for node in sorted(problems))))
    else:
        conditions.append(condition("Degraded", False, "NoFailingPods", ""))
    return {"name": name, "deployed": True, "desired": desired, "ready": ready, "conditions": conditions}


def ignored_fields(cluster_operator: Mapping[str, Any]) -> List[str]:
    """What the ClusterOperator carries that the operator accepts and does not act on, sorted.

    ``spec.<path>`` for :data:`IGNORED_SPEC` set to another value than the one
    the operator acts as if given; ``values <path>`` for each value of the chart
    that has no place in the CR (the annotation the chart writes,
    ``mapping.IGNORED_VALUES``).
    """
    spec = cluster_operator.get("spec") or {}
    out = []
    for path, neutral in IGNORED_SPEC.items():
        node: Any = spec
        for key in path.split("."):
            node = node.get(key) if isinstance(node, Mapping) else None
        if node is not None and (neutral is None or node != neutral):
            out.append("spec." + path)
    annotations = (cluster_operator.get("metadata") or {}).get("annotations") or {}
    text = annotations.get(IGNORED_VALUES_ANNOTATION) or ""
    out += ["values " + path for path in sorted({p.strip() for p in text.split(",") if p.strip()})]
    return out


def ignored_condition(ignored: Sequence[str]) -> Optional[Dict[str, str]]:
    """The condition naming ``ignored`` (:func:`ignored_fields`), once for all; None when there is none."""
    if not ignored:
        return None
    return condition(IGNORED_CONDITION, True, "AcceptedNotActedOn",
                     "accepted, not acted on by this operator (docs/operator.md, \"Coming from MetaX's "
                     "operator 0.9.2\"): " + ", ".join(ignored))


def overall(components: Sequence[Mapping[str, Any]], ignored: Sequence[str] = ()) -> List[Dict[str, str]]:
    """The CR's own conditions: Ready when every deployed component is ready on every node it targets.

    Not Ready names each component that is not, with its message (the nodes);
    the reason is the first one's. ``ignored``: :func:`ignored_fields`, named
    in an ``IgnoredFields`` condition when there are any.
    """
    def cond(entry: Mapping[str, Any], kind: str) -> Mapping[str, str]:
        return next(c for c in entry["conditions"] if c["type"] == kind)
    not_ready = [e for e in components if cond(e, "Ready")["status"] != "True"]
    degraded = [e for e in components if cond(e, "Degraded")["status"] == "True"]
    progressing = [e for e in components if cond(e, "Progressing")["status"] == "True"]
    if not_ready:
        ready = condition("Ready", False, cond(not_ready[0], "Ready")["reason"],
                          "; ".join("%s: %s" % (e["name"], cond(e, "Ready")["message"]) for e in not_ready))
    else:
        ready = condition("Ready", True, "AllComponentsReady",
                          ", ".join(e["name"] for e in components if e.get("deployed")) + " ready")
    out = [ready,
           condition("Progressing", bool(progressing), "RollingOut" if progressing else "Stable",
                     ", ".join(e["name"] for e in progressing)),
           condition("Degraded", bool(degraded), cond(degraded[0], "Degraded")["reason"] if degraded else "None",
                     "; ".join("%s: %s" % (e["name"], cond(e, "Degraded")["message"]) for e in degraded))]
    extra = ignored_condition(ignored)
    return out + ([extra] if extra else [])


def with_transition_times(new: List[Dict[str, Any]], old: Optional[Sequence[Mapping[str, Any]]],
                          now: str) -> List[Dict[str, Any]]:
    """``lastTransitionTime`` kept from the old condition of that type when its status did not change."""
    previous = {c.get("type"): c for c in old or []}
    out = []
    for cond in new:
        before = previous.get(cond["type"])
        stamp = before.get("lastTransitionTime") if before and before.get("status") == cond["status"] else None
        out.append(dict(cond, lastTransitionTime=stamp or now))
    return out


def _strip_times(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _strip_times(v) for k, v in value.items() if k != "lastTransitionTime"}
    if isinstance(value, list):
        return [_strip_times(v) for v in value]
    return value


def same_status(old: Optional[Mapping[str, Any]], new: Mapping[str, Any]) -> bool:
    """Whether writing ``new`` would change nothing but timestamps."""
    return _strip_times(dict(old or {})) == _strip_times(dict(new))


def readiness_labels(component: Component, pods: Iterable[Mapping[str, Any]],
                     nodes: Iterable[Mapping[str, Any]]) -> Dict[str, Dict[str, Optional[str]]]:
    """Node -> label patch for the readiness label the component owns ({} when nothing changes).

    ``"true"`` where its pod on the node is Ready, removed elsewhere.
    """
    if not component.ready_label:
        return {}
    ready_on = {p["spec"].get("nodeName") for p in pods if pod_ready(p)}
    out: Dict[str, Dict[str, Optional[str]]] = {}
    for node in nodes:
        name = node["metadata"]["name"]
        current = ((node["metadata"].get("labels") or {}).get(component.ready_label))
        wanted = "true" if name in ready_on else None
        if current != wanted:
            out[name] = {component.ready_label: wanted}
    return out
