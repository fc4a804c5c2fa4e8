# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""An upgraded operator deletes its objects under an earlier version's component names (issue 38).

gpu-device became metax-gpu-device (MetaX's name): the old DaemonSet carries the owner label but no
current component's name, so no component's prune lists it, and left running beside the new one it
would register metax-tech.com/gpu twice. Cluster.prune_former over recorded objects; the API calls
themselves: tests/integration/test_operator_controller_apiserver.py.
"""

from __future__ import annotations

from typing import Any, Dict, List

import pytest

from ansible_collections.metax.gpu.plugins.module_utils import names as N
from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator import cluster as cluster_mod
from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator.components import REGISTRY

pytest.importorskip("kubernetes")


class Resource:
    def __init__(self, group_version: str, kind: str) -> None:
        self.group_version, self.kind = group_version, kind
        self.deleted: List[tuple] = []

    def delete(self, name: str, namespace: Any, body: Dict[str, Any]) -> None:
        self.deleted.append((name, namespace, body["propagationPolicy"]))


def item(kind: str, name: str, component: str) -> Dict[str, Any]:
    return {"kind": kind, "metadata": {"name": name, "namespace": "metax-operator", "labels": {
        N.LABEL_OPERATOR_OWNER: "uid", "app.kubernetes.io/name": component}}}


def test_objects_of_former_component_names_are_deleted_current_ones_kept():
    daemonsets, accounts = Resource("apps/v1", "DaemonSet"), Resource("v1", "ServiceAccount")
    owned = [(daemonsets, item("DaemonSet", "gpu-device", "gpu-device")),
             (daemonsets, item("DaemonSet", "gpu-label", "gpu-label")),
             (accounts, item("ServiceAccount", "gpu-device", "gpu-device")),
             (daemonsets, item("DaemonSet", N.DAEMONSET_GPU_DEVICE, N.DAEMONSET_GPU_DEVICE)),
             (accounts, item("ServiceAccount", "gpu-device", N.DAEMONSET_GPU_DEVICE)),
             (daemonsets, item("DaemonSet", N.DAEMONSET_DRIVER, N.DAEMONSET_DRIVER))]
    seen = []
    cluster = object.__new__(cluster_mod.Cluster)

    def listed(owner_uid, component, served=None):
        seen.append((owner_uid, component, served))
        return owned
    cluster._owned = listed    # type: ignore[method-assign]  # pylint: disable=protected-access
    assert cluster.prune_former("uid", [c.name for c in REGISTRY]) == 3
    assert seen == [("uid", None, None)]                       # every object of the owner, of any component
    assert [d[0] for d in daemonsets.deleted] == ["gpu-device", "gpu-label"]
    assert [d[0] for d in accounts.deleted] == ["gpu-device"]
    assert {c.name for c in REGISTRY} >= {N.DAEMONSET_GPU_DEVICE, N.DAEMONSET_DRIVER}
