# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""One node-maintenance protocol (docs/maintenance.md): pause, cordon, evict and resume a GPU node,
with the owning procedure recorded. ``plan`` is pure; ``run`` does the I/O through any
:class:`run.MaintenanceApi` (``KubeMaintenanceApi`` over the kubernetes client); ``nodeside``
is an agent's hold on its own node through nodeapi.NodeApi.

    from ansible_collections.metax.gpu.plugins.module_utils import maintenance
    api = maintenance.KubeMaintenanceApi(core_v1(client))
    maintenance.pause(api, "gpu-node-3", "health", evict=maintenance.Eviction(timeout=120))
    ...
    maintenance.resume(api, "gpu-node-3", "health")
"""

from __future__ import annotations

from .plan import (Change, MaintenanceConflict, MaintenanceError, NodeView, held, node_view, owner_of, plan_pause,
                   plan_resume)
from .run import Eviction, KubeMaintenanceApi, MaintenanceApi, MaintenanceTimeout, Outcome, pause, resume

__all__ = ["Change", "Eviction", "KubeMaintenanceApi", "MaintenanceApi", "MaintenanceConflict", "MaintenanceError",
           "MaintenanceTimeout", "NodeView", "Outcome", "held", "node_view", "owner_of", "pause", "plan_pause",
           "plan_resume", "resume"]
