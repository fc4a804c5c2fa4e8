# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The remediation ladder's API calls (nodeapi.RemediationApi beyond NodeApi) over the kubernetes
client: mixed into driver-manager's Kube, which has ``api``, ``core``, ``node`` and ``namespace``.

RBAC (the charts' driver-manager roles): nodes get and patch (the cordon, admitted by the
node-agent policy only with the maintenance protocol's record "ours"), nodes/status patch (its
MetaXGPURemediation condition), configmaps get in its namespace (the health policy), Events and
the Leases metax-health-slot-<i> there (docs/health.md "Remediation").
"""

from __future__ import annotations

import datetime
import logging
from typing import Any, Mapping, Optional

from .. import names
from ..kube import node as kube_node
from ..kube.client import ApiException, coordination_v1
from ..kube.slots import Slots
from ..maintenance.run import Stale

LOG = logging.getLogger("driver-manager")
TIMEOUT = 10.0
POLICY_KEY = "policy.json"


class RemediationKube:
    """RemediationApi's calls for this node (a mixin: see the module's doc)."""

    api: Any
    core: Any
    node: str
    namespace: str

    def read_node(self) -> Mapping[str, Any]:
        return kube_node.OwnNode(self.core, self.node).read()

    def merge_patch_node(self, body: Mapping[str, Any]) -> None:
        try:
            kube_node.merge_patch_node(self.core, self.node, body)
        except ApiException as exc:
            if exc.status == 409:
                raise Stale(str(exc))
            raise

    def write_condition(self, condition: Mapping[str, Any]) -> None:
        # strategic merge: conditions merge by type, the kubelet's and gpu-device's stay
        kube_node.patch_node_status(self.core, self.node, {"status": {"conditions": [dict(condition)]}},
                                    timeout=TIMEOUT)

    def node_event(self, reason: str, message: str, warning: bool = True) -> None:
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "metadata": {"generateName": "%s.gpu-remediation." % self.node, "namespace": self.namespace},
            # the involvedObject names our namespace: the API server refuses an Event about a
            # cluster-scoped object outside "default" otherwise (as gpu-device's health Events)
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": self.node,
                               "namespace": self.namespace},
            "reason": reason, "message": message[:1000], "type": "Warning" if warning else "Normal",
            "source": {"component": "driver-manager", "host": self.node},
            "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
        }
        try:
            self.core.create_namespaced_event(self.namespace, body, _request_timeout=TIMEOUT)
        except ApiException as exc:
            LOG.warning("cannot record event %s: %s", reason, exc.reason)

    def health_policy(self) -> Optional[str]:
        try:
            found = self.core.read_namespaced_config_map(names.HEALTH_POLICY_CONFIGMAP, self.namespace,
                                                         _request_timeout=TIMEOUT)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return (found.get("data") or {}).get(POLICY_KEY)

    def health_slots(self, size: int) -> Slots:
        """The remediation budget: ``size`` Leases metax-health-slot-<i> in the namespace."""
        return Slots(coordination_v1(self.api), self.namespace, names.HEALTH_SLOT_PREFIX, size, self.node)
