# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The node-maintenance protocol's I/O: :func:`pause` and :func:`resume` of one node.

The plan is :mod:`.plan`'s; this file reads the Node, writes the plan's merge
patch (with the Node's resourceVersion, so that two procedures claiming one
node at once cannot both win: the later one plans again and is refused),
waits for the paused agents to leave and evicts the GPU pods through
kube/evict.py. The API is any :class:`MaintenanceApi`: :class:`KubeMaintenanceApi`
over the kubernetes client (the ``metax.gpu.node_maintenance`` module, the
health ladder), a dict in the unit tests. Standard library only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Protocol

from .. import names as N
from ..kube import evict as kube_evict
from ..kube import node as kube_node
from .plan import Change, MaintenanceError, node_view, plan_pause, plan_resume

__all__ = ["Eviction", "KubeMaintenanceApi", "MaintenanceApi", "MaintenanceTimeout", "Outcome", "Stale",
           "pause", "resume"]

# Claims lost to a concurrent writer (409 on the resourceVersion) are planned again this often.
ATTEMPTS = 3


class MaintenanceTimeout(MaintenanceError):
    """The paused agents' pods were still on the node at the timeout."""


class Stale(MaintenanceError):
    """The Node changed since it was read (409): read and plan again."""


@dataclass(frozen=True)
class Eviction:
    """How the GPU pods are evicted (kube/evict.evict's options)."""

    timeout: float = 300.0
    force: bool = False
    drain: bool = False
    grace_period: Optional[int] = None
    retry_refused: bool = True


class MaintenanceApi(Protocol):
    """What the protocol asks of the API server about one node."""

    def read_node(self, node: str) -> Mapping[str, Any]:
        """The Node as a dict (metadata with resourceVersion, spec)."""

    def patch_node(self, node: str, body: Mapping[str, Any]) -> None:
        """A JSON merge patch; :class:`Stale` when ``metadata.resourceVersion`` is not the Node's any more."""

    def agent_pods(self, node: str) -> List[str]:
        """The node agents' pods (gpu-device, gpu-label) still on the node."""

    def evict(self, node: str, request: Eviction, check_mode: bool) -> Dict[str, List[str]]:
        """kube/evict.evict's answer: ``selected``, ``evicted``, ``deleted``."""


class KubeMaintenanceApi:
    """:class:`MaintenanceApi` over kube/client.core_v1."""

    def __init__(self, core: Any, namespace: str = N.NAMESPACE, agent_selector: str = N.NODE_AGENT_POD_SELECTOR,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.core = core
        self.namespace = namespace
        self.agent_selector = agent_selector
        self.sleep = sleep

    def read_node(self, node: str) -> Mapping[str, Any]:
        return kube_node.read_node(self.core, node)

    def patch_node(self, node: str, body: Mapping[str, Any]) -> None:
        from ..kube.client import ApiException
        try:
            kube_node.merge_patch_node(self.core, node, body)
        except ApiException as exc:
            if exc.status == 409:
                raise Stale(str(exc))
            raise

    def agent_pods(self, node: str) -> List[str]:
        found = self.core.list_namespaced_pod(self.namespace, label_selector=self.agent_selector,
                                              field_selector="spec.nodeName=" + node)
        return sorted("%s/%s" % (p["metadata"]["namespace"], p["metadata"]["name"]) for p in found.get("items") or [])

    def evict(self, node: str, request: Eviction, check_mode: bool) -> Dict[str, List[str]]:
        return kube_evict.evict(self.core, node, drain=request.drain, timeout=request.timeout, force=request.force,
                                check_mode=check_mode, sleep=self.sleep, grace_period=request.grace_period,
                                retry_refused=request.retry_refused)


@dataclass
class Outcome:
    """What :func:`pause` / :func:`resume` did (or, in check mode, would do)."""

    node: str
    change: Change
    evicted: Dict[str, List[str]] = field(default_factory=lambda: {"selected": [], "evicted": [], "deleted": []})
    agents_wait: float = 0.0                 # seconds the paused agents took to leave

    @property
    def changed(self) -> bool:
        return self.change.changed or bool(self.evicted["evicted"] or self.evicted["deleted"])

    def as_dict(self) -> Dict[str, Any]:
        """The module's return values."""
        return {"node": self.node, "owner": self.change.owner, "held_by": self.change.holder,
                "patch": self.change.patch, "cordon_kept": self.change.cordon_kept,
                "selected": list(self.evicted["selected"]), "evicted": list(self.evicted["evicted"]),
                "deleted": list(self.evicted["deleted"]), "agents_wait": round(self.agents_wait, 1)}


def _apply(api: MaintenanceApi, node: str, plan: Callable[[Any], Change], check_mode: bool) -> Change:
    """Read, plan, write with the read's resourceVersion; again when another writer came first."""
    for attempt in range(ATTEMPTS):
        found = api.read_node(node)
        change = plan(node_view(found))
        if check_mode or not change.changed:
            return change
        body = change.patch
        version = (found.get("metadata") or {}).get("resourceVersion")
        if version:
            body["metadata"] = dict(body.get("metadata") or {}, resourceVersion=version)
        try:
            api.patch_node(node, body)
            return change
        except Stale:
            if attempt == ATTEMPTS - 1:
                raise MaintenanceError("node %s kept changing under the maintenance patch (%d attempts)"
                                       % (node, ATTEMPTS))
    raise AssertionError("unreachable")


def wait_agents_gone(api: MaintenanceApi, node: str, timeout: float, poll: float = 2.0,
                     sleep: Callable[[float], None] = time.sleep,
                     clock: Callable[[], float] = time.monotonic) -> float:
    """Until the node agents' pods have left ``node`` (the seconds it took); MaintenanceTimeout names them."""
    start = clock()
    while True:
        left = api.agent_pods(node)
        if not left:
            return clock() - start
        if clock() - start >= timeout:
            raise MaintenanceTimeout("the node agents' pods %s are still on %s after %s s (paused with %s)"
                                     % (", ".join(left), node, timeout, N.LABEL_AGENTS_PAUSED))
        sleep(poll)


def pause(api: MaintenanceApi, node: str, owner: str, cordon: bool = True, pause_agents: bool = True,
          procedure_state: Optional[str] = None, message: Optional[str] = None, remove_agent_labels: bool = False,
          evict: Optional[Eviction] = None, wait_agents: bool = True, agents_timeout: float = 300.0, poll: float = 2.0,
          check_mode: bool = False, sleep: Optional[Callable[[float], None]] = None,
          clock: Callable[[], float] = time.monotonic) -> Outcome:
    """Hold ``node`` for ``owner`` (:func:`.plan.plan_pause`), then with ``pause_agents`` and ``wait_agents``
    wait up to ``agents_timeout`` for gpu-device and gpu-label to leave, then with ``evict`` evict the GPU pods.

    Raises MaintenanceConflict (nothing changed) while another owner holds the node.
    In check mode nothing is written, nothing waited for, and ``selected`` says what would be evicted.
    """
    kube_evict.check_node_name(node)
    change = _apply(api, node, lambda view: plan_pause(view, owner, cordon, pause_agents, procedure_state, message,
                                                       remove_agent_labels), check_mode)
    outcome = Outcome(node, change)
    if pause_agents and wait_agents and not check_mode:
        outcome.agents_wait = wait_agents_gone(api, node, agents_timeout, poll, sleep or time.sleep, clock)
    if evict is not None:
        outcome.evicted = api.evict(node, evict, check_mode)
    return outcome


def resume(api: MaintenanceApi, node: str, owner: str, uncordon: bool = True, procedure_state: Optional[str] = None,
           message: Optional[str] = None, check_mode: bool = False) -> Outcome:
    """Release ``owner``'s hold on ``node`` (:func:`.plan.plan_resume`): its agents back, its own cordon
    lifted (with ``uncordon``), an administrator's kept. MaintenanceConflict while another owner holds it."""
    kube_evict.check_node_name(node)
    change = _apply(api, node, lambda view: plan_resume(view, owner, uncordon, procedure_state, message), check_mode)
    return Outcome(node, change)
