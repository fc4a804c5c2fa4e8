# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Operator.audit_unwatched: optional kinds whose drift watch never started are repaired by reading them.

kopf can miss a kind whose CRD appears while it runs (discovery lags behind the CRD's last event,
kubernetes/kubernetes#125471). The controller's own code over a recorded API: what it reads and applies.
The kopf wiring and a real API server: tests/integration/test_operator_cluster.py.
"""

from __future__ import annotations

import copy
from typing import Any, Dict, List, Optional

from ansible_collections.metax.gpu.plugins.module_utils import names as N
from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator.operator import Operator
from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator.components import REGISTRY

UID = "cr-uid"
OWNER = {"apiVersion": "metax-tech.com/v1", "kind": "ClusterOperator",
         "metadata": {"name": "cluster-operator", "namespace": "metax-operator", "uid": UID, "generation": 3}}


def owned(api_version: str, kind: str, name: str, spec: Dict[str, Any]) -> Dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "spec": spec,
            "metadata": {"name": name, "namespace": "metax-operator", "labels": {N.LABEL_OPERATOR_OWNER: UID}}}


MONITOR = owned("monitoring.coreos.com/v1", "ServiceMonitor", "gpu-exporter", {"endpoints": [{"port": "metrics"}]})
RULE = owned("monitoring.coreos.com/v1", "PrometheusRule", "gpu-exporter", {"groups": [{"name": "metax-gpu"}]})
DAEMONSET = owned("apps/v1", "DaemonSet", N.DAEMONSET_GPU_DEVICE, {"template": {}})


class RecordedCluster:
    """The objects the API server holds; reads and applies recorded."""

    def __init__(self, objects: List[Dict[str, Any]]) -> None:
        self.held = {self.key(o): copy.deepcopy(o) for o in objects}
        self.calls: List[tuple] = []

    @staticmethod
    def key(obj: Dict[str, Any]) -> tuple:
        return obj["kind"], obj["metadata"]["name"]

    def get(self, obj: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        self.calls.append(("get", obj["kind"]))
        found = self.held.get(self.key(obj))
        return copy.deepcopy(found) if found else None

    def apply(self, obj: Dict[str, Any]) -> Dict[str, Any]:
        self.calls.append(("apply", obj["kind"]))
        self.held[self.key(obj)] = copy.deepcopy(obj)
        return copy.deepcopy(obj)


def operator_over(cluster: RecordedCluster) -> Operator:
    operator = Operator(cluster, "helm", "/nonexistent", REGISTRY)   # type: ignore[arg-type]
    # what the last reconcile of this CR version rendered (helm is not run here)
    operator._remember(OWNER, {N.DAEMONSET_GPU_EXPORTER: [MONITOR, RULE], N.DAEMONSET_GPU_DEVICE: [DAEMONSET]})  # pylint: disable=protected-access
    return operator


def test_a_deleted_object_of_an_unwatched_kind_is_recreated_and_watched_kinds_are_not_read():
    cluster = RecordedCluster([OWNER, RULE, DAEMONSET])           # the ServiceMonitor was deleted
    operator = operator_over(cluster)
    repaired = operator.audit_unwatched(OWNER, watched={"PrometheusRule", "DaemonSet"})
    assert repaired == [("ServiceMonitor", "gpu-exporter", "recreated")]
    assert cluster.held[("ServiceMonitor", "gpu-exporter")]["spec"] == MONITOR["spec"]
    # only the unwatched kind read (and the CR, to be sure it is still this version); never the DaemonSet
    assert [c for c in cluster.calls if c[1] not in ("ClusterOperator",)] == [
        ("get", "ServiceMonitor"), ("apply", "ServiceMonitor")]


def test_an_edited_object_is_restored_and_an_intact_one_costs_reads_only():
    edited = copy.deepcopy(RULE)
    edited["spec"] = {"groups": []}
    cluster = RecordedCluster([OWNER, MONITOR, edited, DAEMONSET])
    operator = operator_over(cluster)
    assert operator.audit_unwatched(OWNER, watched=set()) == [("PrometheusRule", "gpu-exporter", "restored")]
    cluster.calls.clear()
    assert operator.audit_unwatched(OWNER, watched=set()) == []
    assert all(call[0] == "get" for call in cluster.calls)


def test_nothing_read_once_every_optional_kind_is_watched_or_without_a_cr():
    cluster = RecordedCluster([OWNER, DAEMONSET])
    operator = operator_over(cluster)
    assert operator.audit_unwatched(OWNER, watched={"ServiceMonitor", "PrometheusRule"}) == []
    assert operator.audit_unwatched(None, watched=set()) == []
    assert cluster.calls == []
