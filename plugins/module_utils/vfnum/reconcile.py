# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""One node's node-vfnums entry applied, as driver-manager runs it (agents/driver_manager.py has
the round, its loop and its configuration): :meth:`VfnumNode.reconcile_vfnum`
applies its node's vfnum entry: state label ``gpu.vfnum.state``
pending -> success | failed, then deletes only its node's gpu-device pod
so that it registers the new devices. While pods on the node hold its GPUs
the change is refused, or with ``--vfnum-evict-in-use`` (the CR's
``spec.driver.vfnumPolicy.evictInUse``) they are evicted through the
eviction API first; and only ``--vfnum-max-parallel`` nodes change at once
(a slot of ``kube/slots.py`` taken before, given back after). A node
waiting for a slot is not failing: a watch of the slot Leases wakes its
round when its turn comes (``Slots.wait_turn``), not the failure backoff.
The change holds the node through the node-maintenance protocol
(``maintenance/nodeside.py``, owner ``driver-manager``): it waits while
another procedure (set_vfnum, the driver upgrade, the health ladder) holds
the node, and the others, and the rollout budget, see its hold.

The API is reached only through :class:`..nodeapi.NodeApi`; the budget is any object with
``take``, ``release`` and ``holders`` (kube/slots.py ``Slots``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol, Sequence

from .. import names
from ..host import HostRoot
from ..kube import evict as kube_evict
from ..maintenance import nodeside
from ..maintenance.plan import MaintenanceConflict
from ..nodeapi import NodeApi
from . import backend
from .plan import VfnumError
from .plan import plan as plan_change

# driver-manager's log (the lines docs/operator.md and the benchmarks read carry its name)
LOG = logging.getLogger("driver-manager")
# the maintenance owner of its changes (maintenance/plan.py)
OWNER = names.MAINTENANCE_OWNER_DRIVER_MANAGER
# How long a round waits for evicted pods to leave. A PodDisruptionBudget's 429 is not
# waited out inside the round: the round's backoff (5 s doubling to 5 min) retries it.
EVICT_TIMEOUT = 10.0


@dataclass(frozen=True)
class VfnumPolicy:
    """spec.driver.vfnumPolicy: evict the pods holding the GPUs (else refuse), and how many nodes at once."""

    evict_in_use: bool = False
    max_parallel: int = 1


class VfnumPending(VfnumError):
    """The change waits (a slot, an eviction): state ``pending``, retried with the round's backoff.
    ``event`` is the reason it is reported under (Event and ``gpu.vfnum.message``); None: not a
    failure to report (waiting for a slot is the budget working)."""

    def __init__(self, message: str, event: Optional[str] = None) -> None:
        super().__init__(message)
        self.event = event


class SlotBudget(Protocol):
    """The nodes changing vfnum at once (kube/slots.py ``Slots``): a slot taken before, given back after."""

    holders: Sequence[str]

    def take(self) -> Any:
        """A slot (None: all held)."""

    def release(self) -> None:
        """The slot given back."""


class VfnumNode:
    """One node's VFs brought to its node-vfnums entry."""

    def __init__(self, host: HostRoot, api: NodeApi, policy: VfnumPolicy, slots: SlotBudget,
                 round_clock: Callable[[], float]) -> None:
        self.host = host
        self.api = api
        self.policy = policy
        self.slots = slots
        self.round_clock = round_clock            # seconds since the round began (the step times in the log)
        self.vfnum_state: Optional[str] = None    # the state label this process wrote last

    def reconcile_vfnum(self, wanted: Optional[int]) -> Optional[str]:
        """Bring the node's VFs to ``wanted`` (None: no entry); the state label written, if any.

        Who holds the GPUs is asked only when a change is planned: the node (processes holding
        the device nodes) and the API (pods on this node requesting the GPU resource, which the
        refusal names). Refused while held, unless the policy says evict. The change itself
        (eviction included: it is the disruption the budget bounds) runs inside a slot.
        """
        if wanted is None:
            return None
        pfs = backend.read_pfs(self.host)
        plan = plan_change(pfs, wanted)           # allowed values, sriov_totalvfs, gpu.sriov=forbidden
        if not plan.changed:
            return None
        pods = self.api.gpu_pods()
        reasons = backend.in_use(self.host, pfs, plan, pods)
        evict = bool(reasons) and bool(pods) and self.policy.evict_in_use
        if reasons and not evict:
            hint = "" if self.policy.evict_in_use or not pods else \
                "; spec.driver.vfnumPolicy.evictInUse: true evicts the pods"
            raise VfnumError("vfnum %d refused: the GPUs are in use (%s)%s" % (wanted, "; ".join(reasons), hint))
        LOG.info("vfnum %d: entry validated %.2f s into the round", wanted, self.round_clock())
        self.check_not_held(wanted)
        if self.slots.take() is None:
            self.mark_vfnum("pending")
            raise VfnumPending("vfnum %d waits for one of %d vfnum slots (held by %s)"
                               % (wanted, self.policy.max_parallel, ", ".join(self.slots.holders) or "?"))
        try:
            try:
                nodeside.hold(self.api, OWNER)
            except MaintenanceConflict as exc:
                raise self.held_elsewhere(wanted, exc.holder)
            self.mark_vfnum("pending")
            if evict:
                self.evict_holders(wanted, pods)
                reasons = backend.in_use(self.host, pfs, plan, self.api.gpu_pods())
                if reasons:
                    raise VfnumError("vfnum %d refused after the eviction: the GPUs are still in use (%s)"
                                     % (wanted, "; ".join(reasons)))
            return self.apply_vfnum(wanted, plan)
        finally:
            try:
                nodeside.release(self.api, OWNER)
            except MaintenanceConflict:
                pass            # never ours: another procedure's hold stays
            finally:
                self.slots.release()

    @staticmethod
    def held_elsewhere(wanted: int, holder: Optional[str]) -> VfnumPending:
        return VfnumPending("vfnum %d waits: the node is held by %s's maintenance (%s); retried"
                            % (wanted, holder, names.ANNOTATION_MAINTENANCE_OWNER), event="VfnumNodeHeld")

    def check_not_held(self, wanted: int) -> None:
        """Another procedure holding the node (a set_vfnum or driver_upgrade playbook, the health ladder):
        the change waits, reported, with the round's backoff; nothing is touched meanwhile."""
        holder = nodeside.holder(self.api)
        if holder is not None and holder != OWNER:
            raise self.held_elsewhere(wanted, holder)

    def evict_holders(self, wanted: int, pods: Sequence[str]) -> None:
        """Evict the pods holding the GPUs; a refusal (a PodDisruptionBudget) or pods slow to leave
        keep the change pending, reported and retried with the round's backoff."""
        LOG.info("vfnum %d: evicting %s", wanted, ", ".join(pods))
        try:
            evicted = self.api.evict_gpu_pods(EVICT_TIMEOUT)
        except kube_evict.EvictionError as exc:
            if exc.refused:
                why = "; ".join("eviction of %s refused: %s" % item for item in sorted(exc.refused.items()))
            elif exc.remaining and not exc.failed:
                why = "evicted pod(s) %s still on the node after %.0f s" % (", ".join(exc.remaining), EVICT_TIMEOUT)
            else:
                why = str(exc)
            raise VfnumPending("vfnum %d pending: %s; retried" % (wanted, why),
                               event="VfnumEvictionRefused" if exc.refused else "VfnumEvictionPending")
        LOG.info("vfnum %d: %s evicted %.2f s into the round", wanted, ", ".join(evicted) or "(none)",
                 self.round_clock())
        self.api.event("VfnumEvicted", "vfnum %d: evicted %s" % (wanted, ", ".join(evicted)), warning=False)

    def mark_vfnum(self, state: str) -> None:
        if self.vfnum_state != state:
            self.api.patch_node({names.LABEL_VFNUM_STATE: state}, {})
            self.vfnum_state = state

    def apply_vfnum(self, wanted: int, plan: Any) -> str:
        try:
            backend.apply(self.host, plan)
        except VfnumError as exc:
            self.api.patch_node({names.LABEL_VFNUM_STATE: "failed"}, {names.ANNOTATION_VFNUM_MESSAGE: str(exc)})
            self.vfnum_state = "failed"
            raise
        LOG.info("vfnum %d: written to sysfs %.2f s into the round", wanted, self.round_clock())
        # gpu.vfnum is gpu-label's (it reads sysfs): only the state is ours
        self.api.patch_node({names.LABEL_VFNUM_STATE: "success"}, {names.ANNOTATION_VFNUM_MESSAGE: None})
        self.vfnum_state = "success"
        deleted = self.api.restart_gpu_device()
        LOG.info("vfnum %d applied; gpu-device pod(s) %s deleted %.2f s into the round", wanted,
                 ", ".join(deleted) or "(none)", self.round_clock())
        self.api.event("VfnumApplied", "vfnum %d applied" % wanted, warning=False)
        return "success"
