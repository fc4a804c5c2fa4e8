# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Switching a node between the device plugin and DRA, as pure functions (docs/dra.md "Switching a node").

What serves a node (:func:`serving`): the device plugin while the Node's
``status.allocatable`` has ``metax-tech.com/gpu`` above 0, DRA while the
node's pool of driver ``gpu.metax-tech.com`` has devices. Never both: that is
the invariant the switch keeps (:attr:`Serving.both`) and the cluster test
samples.

Who holds the node's GPUs (:func:`holders`): the pods that ask for
``metax-tech.com/gpu`` (kube/pods.py, the device plugin's and the mapped
class's) and the pods a ResourceClaim allocated from the node's pool is
reserved for. A switch while any is there is refused unless eviction is
asked for, the rule set_vfnum has (:func:`plan_switch`).

``switch_run`` does the I/O with the node-maintenance protocol.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

from ..errors import MetaxGpuError
from ..kube.pods import TERMINAL_PHASES, gpu_pods
from ..names import DEVICE_MODE_DRA, DEVICE_MODE_PLUGIN, DRA_DRIVER, LABEL_DEVICE_MODE, RESOURCE_NAME

__all__ = ["MODES", "Serving", "SwitchPlan", "SwitchRefused", "claim_holders", "holders", "mode_of", "plan_switch",
           "plugin_allocatable", "pool_devices", "serving"]

MODES = (DEVICE_MODE_PLUGIN, DEVICE_MODE_DRA)


class SwitchRefused(MetaxGpuError):
    """The node's GPUs are in use and eviction was not asked for (nothing was changed)."""

    def __init__(self, message: str, holders: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.holders = list(holders)


def _labels(node: Mapping[str, Any]) -> Mapping[str, str]:
    return (node.get("metadata") or {}).get("labels") or {}


def mode_of(node: Mapping[str, Any]) -> str:
    """The mode the node's label asks for: ``dra`` only when it says so (the charts' affinity reads it so)."""
    return DEVICE_MODE_DRA if _labels(node).get(LABEL_DEVICE_MODE) == DEVICE_MODE_DRA else DEVICE_MODE_PLUGIN


def plugin_allocatable(node: Mapping[str, Any]) -> int:
    """``metax-tech.com/gpu`` in the Node's allocatable (0: absent, or a gone plugin's resource, which the
    kubelet keeps at 0)."""
    value = ((node.get("status") or {}).get("allocatable") or {}).get(RESOURCE_NAME)
    try:
        return int(str(value)) if value is not None else 0
    except ValueError:
        raise MetaxGpuError("node %s: allocatable %s is %r, not a count"
                            % ((node.get("metadata") or {}).get("name"), RESOURCE_NAME, value))


def pool_devices(slices: Iterable[Mapping[str, Any]], node_name: str) -> List[str]:
    """The devices the scheduler can allocate from ``node_name``'s pool of our driver: those of the slices
    of the pool's newest generation (the scheduler ignores older ones)."""
    ours = [s for s in slices
            if (s.get("spec") or {}).get("driver") == DRA_DRIVER and (s.get("spec") or {}).get("nodeName") == node_name]
    if not ours:
        return []
    newest = max(int(((s["spec"].get("pool") or {}).get("generation") or 0)) for s in ours)
    return sorted(str(d.get("name")) for s in ours
                  if int(((s["spec"].get("pool") or {}).get("generation") or 0)) == newest
                  for d in s["spec"].get("devices") or [])


@dataclass(frozen=True)
class Serving:
    """What serves ``metax-tech.com/gpu`` on a node at one moment."""

    plugin: int                 # allocatable through the device plugin
    dra: int                    # devices in the node's pool

    @property
    def both(self) -> bool:
        return self.plugin > 0 and self.dra > 0

    @property
    def by(self) -> Optional[str]:
        """The mode serving the node; None when neither does; ``both`` is the fault the switch prevents."""
        if self.both:
            return "both"
        if self.plugin:
            return DEVICE_MODE_PLUGIN
        return DEVICE_MODE_DRA if self.dra else None


def serving(node: Mapping[str, Any], slices: Iterable[Mapping[str, Any]]) -> Serving:
    name = str((node.get("metadata") or {}).get("name") or "")
    return Serving(plugin_allocatable(node), len(pool_devices(slices, name)))


def claim_holders(claims: Iterable[Mapping[str, Any]], node_name: str) -> List[str]:
    """``namespace/name`` of the pods reserved on a ResourceClaim with a device of ``node_name``'s pool."""
    found = set()
    for claim in claims:
        status = claim.get("status") or {}
        results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
        if not any(r.get("driver") == DRA_DRIVER and r.get("pool") == node_name for r in results):
            continue
        namespace = (claim.get("metadata") or {}).get("namespace") or "default"
        for ref in status.get("reservedFor") or []:
            if ref.get("resource") == "pods" and not ref.get("apiGroup"):
                found.add("%s/%s" % (namespace, ref.get("name")))
    return sorted(found)


def holders(pods: Iterable[Mapping[str, Any]], claims: Iterable[Mapping[str, Any]], node_name: str) -> List[str]:
    """The pods holding the node's GPUs in either mode. ``pods`` are the node's (terminal ones hold nothing)."""
    pods = list(pods)
    live = {"%s/%s" % ((p.get("metadata") or {}).get("namespace", "default"), (p.get("metadata") or {}).get("name"))
            for p in pods if (p.get("status") or {}).get("phase") not in TERMINAL_PHASES}
    reserved = [key for key in claim_holders(claims, node_name) if key in live]
    return sorted(set(gpu_pods(pods)) | set(reserved))


@dataclass
class SwitchPlan:
    """A switch of one node: its mode before and after, and the pods in the way."""

    node: str
    before: str
    after: str
    holders: List[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return self.before != self.after

    def label_patch(self) -> Dict[str, Any]:
        """The merge patch of the mode label: the value spelled out both ways, so the node says its mode."""
        return {"metadata": {"labels": {LABEL_DEVICE_MODE: self.after}}}

    def diff(self) -> Dict[str, Dict[str, str]]:
        return {"before": {"mode": self.before}, "after": {"mode": self.after}}


def plan_switch(node: Mapping[str, Any], target: str, in_use: Sequence[str], evict: bool) -> SwitchPlan:
    """The switch of ``node`` to ``target``; SwitchRefused while ``in_use`` names pods and ``evict`` is off.

    A node already in ``target`` is no change whatever holds its GPUs.
    """
    name = str((node.get("metadata") or {}).get("name") or "")
    if target not in MODES:
        raise MetaxGpuError("mode %r: expected one of %s" % (target, ", ".join(MODES)))
    plan = SwitchPlan(name, mode_of(node), target, sorted(in_use))
    if plan.changed and plan.holders and not evict:
        raise SwitchRefused("refusing to switch node %s from %s to %s while its GPUs are in use by %s "
                            "(evict=true evicts them through the eviction API first)"
                            % (name, plan.before, target, ", ".join(plan.holders)), plan.holders)
    return plan
