# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The node-maintenance protocol for an agent on its own node, through :class:`..nodeapi.NodeApi`.

driver-manager holds its node while it changes it on its own (a vfnum entry
whose GPU pods it evicts): the same plan as the playbooks' (:mod:`.plan`),
through the node API its procedures already use, which writes labels and
annotations only. So an agent's hold never cordons and never pauses the agents
(driver-manager is one of them): it records the owner, which the playbooks and
the rollout budget see, and it is refused while another procedure holds the node.
"""

from __future__ import annotations

from typing import Optional

from ..nodeapi import NodeApi
from .plan import Change, node_view, owner_of, plan_pause, plan_resume

__all__ = ["hold", "release", "holder"]


def holder(api: NodeApi) -> Optional[str]:
    """Who holds the node now (None: no one)."""
    return owner_of(node_view(api.node_metadata()))


def _write(api: NodeApi, change: Change) -> Change:
    if change.labels or change.annotations:
        api.patch_node(change.labels, change.annotations)
    return change


def hold(api: NodeApi, owner: str) -> Change:
    """Record ``owner``'s hold on the node (no cordon, no pause); MaintenanceConflict while another holds it."""
    return _write(api, plan_pause(node_view(api.node_metadata()), owner, cordon=False, pause_agents=False))


def release(api: NodeApi, owner: str) -> Change:
    """Remove ``owner``'s hold (nothing when it holds none); MaintenanceConflict while another holds it."""
    return _write(api, plan_resume(node_view(api.node_metadata()), owner, uncordon=False))
