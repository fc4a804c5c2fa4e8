# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""A node's switch between the device plugin and DRA, done through the node-maintenance protocol.

The order is what keeps the node from being served by both (docs/dra.md
"Switching a node", docs/design-decisions.md):

1. refuse, changing nothing, while pods hold the node's GPUs and eviction
   was not asked for (:func:`.switch.plan_switch`);
2. hold the node for ``device-mode`` and cordon it (maintenance.pause), and
   evict the holders while the serving agent is still there (a pod's DRA
   claim is unprepared by gpu-dra: without it the kubelet keeps the pod);
3. pause the node agents (gpu-device and gpu-dra both leave: the charts'
   affinity) and wait for their pods to be gone;
4. delete what is left of the node's pool (a stopped gpu-dra leaves its
   slices for its restart; the kubelet would wipe them only 30 s later) and
   wait until neither serves: allocatable ``metax-tech.com/gpu`` 0 (the
   kubelet zeroes a gone plugin's devices) and no device in the pool;
5. write the mode label, then release the hold: only the new mode's agent
   comes back, and gpu-dra publishes only once the device plugin's
   allocatable is 0 (agents/gpu_dra.py).

A failure after step 2 leaves the node held (``maintenance.owner:
device-mode``), cordoned and in its old mode: running the switch again
finishes it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Protocol

from .. import maintenance
from .. import names as N
from ..kube import evict as kube_evict
from ..kube.client import ApiException, custom_objects
from ..kube.pages import raw_list
from ..maintenance import Eviction, MaintenanceApi, MaintenanceError
from .switch import SwitchPlan, holders, mode_of, plan_switch, serving

__all__ = ["KubeSwitchApi", "SwitchApi", "SwitchOutcome", "SwitchTimeout", "switch"]

OWNER = N.MAINTENANCE_OWNER_DEVICE_MODE
GROUP, VERSION = "resource.k8s.io", "v1"


class SwitchTimeout(MaintenanceError):
    """The node was still served by its old mode at the timeout (it stays held)."""


class SwitchApi(MaintenanceApi, Protocol):
    """The maintenance protocol's API, and the node's pods, the claims and the node's pool."""

    def node_pods(self, node: str) -> List[Mapping[str, Any]]:
        """Every pod bound to ``node``, as dicts."""

    def claims(self) -> List[Mapping[str, Any]]:
        """Every ResourceClaim (empty where the cluster has no resource.k8s.io/v1)."""

    def slices(self, node: str) -> List[Mapping[str, Any]]:
        """The ResourceSlices of our driver on ``node``."""

    def delete_slice(self, name: str) -> None:
        """Delete one ResourceSlice (gone already: fine)."""


class KubeSwitchApi(maintenance.KubeMaintenanceApi):
    """:class:`SwitchApi` over the kubernetes client; its agents are both modes' (names.DEVICE_MODE_AGENT_POD_SELECTOR)."""

    def __init__(self, client: Any, core: Any, namespace: str = N.NAMESPACE,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        super().__init__(core, namespace, N.DEVICE_MODE_AGENT_POD_SELECTOR, sleep)
        self.custom = custom_objects(client)

    def node_pods(self, node: str) -> List[Mapping[str, Any]]:
        return list(raw_list(self.core.list_pod_for_all_namespaces, field_selector="spec.nodeName=%s" % node).items)

    def claims(self) -> List[Mapping[str, Any]]:
        try:
            return list(self.custom.list_cluster_custom_object(GROUP, VERSION, "resourceclaims").get("items") or [])
        except ApiException as exc:
            if exc.status == 404:        # no DRA API: no claims
                return []
            raise

    def slices(self, node: str) -> List[Mapping[str, Any]]:
        try:
            answer = self.custom.list_cluster_custom_object(
                GROUP, VERSION, "resourceslices", field_selector="spec.nodeName=%s,spec.driver=%s" % (node, N.DRA_DRIVER))
        except ApiException as exc:
            if exc.status == 404:
                return []
            raise
        return list(answer.get("items") or [])

    def delete_slice(self, name: str) -> None:
        try:
            self.custom.delete_cluster_custom_object(GROUP, VERSION, "resourceslices", name)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def evict(self, node: str, request: Eviction, check_mode: bool) -> Dict[str, List[str]]:
        # the holders of either mode, asked again while waiting: a DRA pod asks for no metax-tech.com/gpu
        return kube_evict.evict(self.core, node, drain=request.drain, timeout=request.timeout, force=request.force,
                                check_mode=check_mode, sleep=self.sleep, grace_period=request.grace_period,
                                retry_refused=request.retry_refused,
                                holders=None if request.drain else lambda: holders(self.node_pods(node),
                                                                                   self.claims(), node))


@dataclass
class SwitchOutcome:
    """What :func:`switch` did (in check mode: would do)."""

    plan: SwitchPlan
    evicted: Dict[str, List[str]] = field(default_factory=lambda: {"selected": [], "evicted": [], "deleted": []})
    slices_deleted: List[str] = field(default_factory=list)
    resumed: bool = False                    # a hold of ours released (also one a failed run left)
    waited: float = 0.0                      # seconds from the hold to the old mode gone

    @property
    def changed(self) -> bool:
        return self.plan.changed or self.resumed or bool(self.evicted["evicted"] or self.evicted["deleted"])

    def as_dict(self) -> Dict[str, Any]:
        return {"node": self.plan.node, "mode_before": self.plan.before, "mode": self.plan.after,
                "in_use": list(self.plan.holders), "selected": list(self.evicted["selected"]),
                "evicted": list(self.evicted["evicted"]), "deleted": list(self.evicted["deleted"]),
                "slices_deleted": list(self.slices_deleted), "waited": round(self.waited, 1)}


def wait_unserved(api: SwitchApi, node: str, timeout: float, poll: float, sleep: Callable[[float], None],
                  clock: Callable[[], float]) -> List[str]:
    """Delete the node's pool and wait until neither mode serves ``node``; the slices deleted."""
    deleted: List[str] = []
    start = clock()
    while True:
        pool = api.slices(node)
        for item in pool:
            name = item["metadata"]["name"]
            api.delete_slice(name)
            if name not in deleted:
                deleted.append(name)
        now = serving(api.read_node(node), api.slices(node))
        if now.by is None:
            return deleted
        if clock() - start >= timeout:
            raise SwitchTimeout("node %s is still served after %s s (device plugin: %d allocatable, DRA: %d devices); "
                                "it stays held by %s: run the switch again" % (node, timeout, now.plugin, now.dra, OWNER))
        sleep(poll)


def switch(api: SwitchApi, node: str, target: str, evict: Optional[Eviction] = None, timeout: float = 300.0,
           poll: float = 2.0, check_mode: bool = False, sleep: Callable[[float], None] = time.sleep,
           clock: Callable[[], float] = time.monotonic) -> SwitchOutcome:
    """Switch ``node`` to ``target`` (``device-plugin`` or ``dra``); see the module's docstring for the order.

    Raises SwitchRefused (nothing changed) while pods hold the node's GPUs and ``evict`` is None,
    MaintenanceConflict (nothing changed) while another procedure holds the node.
    """
    kube_evict.check_node_name(node)
    found = api.read_node(node)
    in_use = holders(api.node_pods(node), api.claims(), node)
    plan = plan_switch(found, target, in_use, evict is not None)
    outcome = SwitchOutcome(plan)
    ours = maintenance.owner_of(maintenance.node_view(found)) == OWNER
    if not plan.changed:
        if ours and not check_mode:
            # a switch that failed after the label: release its hold
            maintenance.resume(api, node, OWNER)
        outcome.resumed = ours
        return outcome
    if check_mode:
        # refused while another procedure holds the node, as the real run would be
        maintenance.pause(api, node, OWNER, pause_agents=False, evict=evict, check_mode=True)
        outcome.evicted["selected"] = list(plan.holders)
        return outcome
    start = clock()
    held = maintenance.pause(api, node, OWNER, cordon=True, pause_agents=False, evict=evict)
    outcome.evicted = held.evicted
    # cordoned now: a pod placed between the check and the cordon is caught here
    late = holders(api.node_pods(node), api.claims(), node)
    if late:
        if evict is None:
            maintenance.resume(api, node, OWNER)
            plan_switch(found, target, late, False)          # raises SwitchRefused
            raise AssertionError("unreachable")
        more = api.evict(node, evict, False)
        for key in ("selected", "evicted", "deleted"):
            outcome.evicted[key] = sorted(set(outcome.evicted[key]) | set(more[key]))
    maintenance.pause(api, node, OWNER, cordon=True, pause_agents=True, wait_agents=True,
                      agents_timeout=timeout, poll=poll, sleep=sleep, clock=clock)
    outcome.slices_deleted = wait_unserved(api, node, max(0.0, timeout - (clock() - start)), poll, sleep, clock)
    outcome.waited = clock() - start
    api.patch_node(node, plan.label_patch())
    maintenance.resume(api, node, OWNER)
    if mode_of(api.read_node(node)) != target:
        raise MaintenanceError("node %s: the mode label did not take (%s)" % (node, N.LABEL_DEVICE_MODE))
    return outcome
