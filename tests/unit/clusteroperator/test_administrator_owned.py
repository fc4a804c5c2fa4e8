# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""What the manual tells the administrator to edit is theirs (issue 38): driver-config and
gpu-aware-plugin are created once and never reverted; everything else is still put back; a later
change of what seeds them in the CR is not applied and says so (condition, Warning Event).

The controller's own code (Operator.repair, _apply_all, not_applied; the Extensions chart rendered by
helm) over a recorded API holding the objects. Against the local cluster:
tests/integration/test_operator_cluster.py::test_an_edit_of_gpu_aware_plugin_survives_the_controller.
"""

from __future__ import annotations

import copy
from typing import Any, Dict, List, Optional

import pytest

from ansible_collections.metax.gpu.plugins.module_utils import names as N
from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator import contract, render
from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator.notes import NOTE_REASONS, newly_true, seed_digest
from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator.apis import ServedKinds
from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator.cluster import event_for
from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator.components import GPU_DEVICE, REGISTRY
from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator.operator import Operator

from charts.helm import CHART, find_helm, helm_required

HELM = find_helm()
pytestmark = helm_required(HELM)
EXTENSIONS = str(CHART)
UID = "cr-uid"


def cr(spec: Dict[str, Any], generation: int = 1) -> Dict[str, Any]:
    return {"apiVersion": "gpu.metax-tech.com/v1alpha1", "kind": "ClusterOperator",
            "metadata": {"name": N.OPERATOR_CR_NAME, "uid": UID, "generation": generation}, "spec": spec}


SPEC = {"registry": "r.example/metax", "gpuAware": {"deploy": True, "scoreWeight": "1", "lossWeight": "1"},
        "driver": {"deploy": True, "payload": {"version": "2.29.0.13"},
                   "vfnumsConfig": {"gpu-a": {"vfnum": 2}}},
        "maca": {"deploy": False}, "runtime": {"deploy": False}}


class RecordedCluster:
    """The objects the API server holds (by kind and name); reads, applies and annotations recorded."""

    namespace = N.OPERATOR_NAMESPACE

    def __init__(self, owner: Dict[str, Any]) -> None:
        self.served = ServedKinds(frozenset)           # no Prometheus operator
        self.owner = owner
        self.held: Dict[tuple, Dict[str, Any]] = {}
        self.applied: List[str] = []
        self.events: List[tuple] = []

    @staticmethod
    def key(obj: Dict[str, Any]) -> tuple:
        return obj["kind"], obj["metadata"]["name"]

    def get(self, obj: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        if obj["kind"] == N.OPERATOR_KIND:
            return copy.deepcopy(self.owner)
        found = self.held.get(self.key(obj))
        return copy.deepcopy(found) if found else None

    def apply(self, obj: Dict[str, Any]) -> Dict[str, Any]:
        self.applied.append("%s/%s" % self.key(obj))
        self.held[self.key(obj)] = copy.deepcopy(obj)
        return copy.deepcopy(obj)

    def annotate(self, obj: Dict[str, Any], annotations: Dict[str, str]) -> None:
        self.held[self.key(obj)]["metadata"].setdefault("annotations", {}).update(annotations)

    def prune(self, *_args: Any, **_kwargs: Any) -> int:
        return 0

    def prune_former(self, *_args: Any, **_kwargs: Any) -> int:
        return 0

    def pods(self, *_args: Any) -> List[Dict[str, Any]]:
        return []

    def nodes(self) -> List[Dict[str, Any]]:
        return []

    def workload(self, component: Any) -> Optional[Dict[str, Any]]:
        return self.get({"kind": component.kind, "metadata": {"name": component.name}})

    def patch_node_metadata(self, node: str, metadata: Dict[str, Any]) -> None:
        raise AssertionError("no node here")

    def strip_nodes(self, *_args: Any, **_kwargs: Any) -> List[str]:
        return []

    def hand_back_nodes(self, _nodes: Any) -> List[str]:
        return []

    def post_event(self, owner: Dict[str, Any], event_type: str, reason: str, message: str, now: str) -> None:
        self.events.append((event_type, reason, message))


@pytest.fixture
def rendered():
    """(operator, cluster, body): the CR rendered by the real chart and applied once."""
    body = cr(copy.deepcopy(SPEC))
    cluster = RecordedCluster(body)
    operator = Operator(cluster, HELM, EXTENSIONS, REGISTRY)   # type: ignore[arg-type]
    desired = operator._render(body, frozenset())                 # pylint: disable=protected-access
    operator._remember(body, desired)                             # pylint: disable=protected-access
    operator._apply_all(body, desired, frozenset())               # pylint: disable=protected-access
    return operator, cluster, body


def configmap(cluster: RecordedCluster, name: str) -> Dict[str, Any]:
    return cluster.held[("ConfigMap", name)]


def test_the_administrator_owns_exactly_what_the_manual_tells_them_to_edit():
    assert {(a.kind, a.name) for a in contract.ADMINISTRATOR_OWNED} == {
        ("ConfigMap", N.DRIVER_CONFIGMAP), ("ConfigMap", N.GPU_AWARE_CONFIGMAP)}
    assert render.create_only({"kind": "ConfigMap", "metadata": {"name": N.GPU_AWARE_CONFIGMAP}})
    assert not render.create_only({"kind": "ConfigMap", "metadata": {"name": "gpu-exporter-dashboard"}})
    assert not render.create_only({"kind": "Secret", "metadata": {"name": N.DRIVER_CONFIGMAP}})


def test_both_are_created_marked_and_with_what_they_were_created_from(rendered):
    _operator, cluster, _body = rendered
    for name in (N.DRIVER_CONFIGMAP, N.GPU_AWARE_CONFIGMAP):
        annotations = configmap(cluster, name)["metadata"]["annotations"]
        assert annotations[N.ANNOTATION_OPERATOR_APPLY] == "create-only"
        assert annotations[N.ANNOTATION_OPERATOR_CREATED_FROM] == seed_digest(configmap(cluster, name))
    assert configmap(cluster, N.GPU_AWARE_CONFIGMAP)["data"] == {"scoreWeight": "1", "lossWeight": "1"}


def test_an_edit_of_gpu_aware_plugin_is_never_put_back(rendered):
    operator, cluster, body = rendered
    edited = configmap(cluster, N.GPU_AWARE_CONFIGMAP)
    edited["data"] = {"scoreWeight": "3", "lossWeight": "0.5"}          # manual 2.1.5 step 4
    cluster.applied.clear()
    assert operator.repair("MODIFIED", copy.deepcopy(edited), body) is None
    operator.reconcile(body)                                             # a CR change: every component again
    assert configmap(cluster, N.GPU_AWARE_CONFIGMAP)["data"] == {"scoreWeight": "3", "lossWeight": "0.5"}
    assert "ConfigMap/%s" % N.GPU_AWARE_CONFIGMAP not in cluster.applied
    assert "ConfigMap/%s" % N.DRIVER_CONFIGMAP not in cluster.applied
    assert "Deployment/gpu-aware" in cluster.applied                      # the rest still applied


def test_a_deleted_one_is_created_again_and_other_objects_are_still_put_back(rendered):
    operator, cluster, body = rendered
    gone = cluster.held.pop(("ConfigMap", N.GPU_AWARE_CONFIGMAP))
    assert operator.repair("DELETED", gone, body) == "recreated"
    device = copy.deepcopy(cluster.held[("DaemonSet", GPU_DEVICE.name)])
    device["spec"]["template"]["spec"]["nodeSelector"] = {"edited": "by-hand"}
    cluster.held[("DaemonSet", GPU_DEVICE.name)] = device
    assert operator.repair("MODIFIED", device, body) == "restored"
    assert cluster.held[("DaemonSet", GPU_DEVICE.name)]["spec"]["template"]["spec"]["nodeSelector"] != {"edited": "by-hand"}


def test_a_vfnums_config_change_after_install_is_not_applied_and_says_so(rendered):
    operator, cluster, body = rendered
    assert operator.not_applied(body) == []
    before = copy.deepcopy(configmap(cluster, N.DRIVER_CONFIGMAP))
    changed = cr(dict(copy.deepcopy(SPEC), driver=dict(SPEC["driver"], vfnumsConfig={"gpu-a": {"vfnum": 4}})), 2)
    cluster.owner = changed
    operator.reconcile(changed)
    assert configmap(cluster, N.DRIVER_CONFIGMAP) == before             # the administrator's content stays
    notes = operator.not_applied(changed)
    assert [c["type"] for c in notes] == ["VfnumsConfigNotApplied"]
    assert "kubectl -n metax-operator edit configmap driver-config" in notes[0]["message"]
    # the status carries it beside Ready, and the timer posts one Warning Event when it appears
    status = operator.status(changed, "2026-11-28T12:00:00Z")
    types = [c["type"] for c in status["conditions"]]
    assert "Ready" in types and "VfnumsConfigNotApplied" in types
    fresh = newly_true({}, status, NOTE_REASONS)
    assert [c["reason"] for c in fresh] == ["VfnumsConfigNotApplied"]
    assert newly_true(status, status, NOTE_REASONS) == []           # once, not every round


def test_an_object_created_before_the_digest_gets_the_crs_digest_without_a_note(rendered):
    operator, cluster, body = rendered
    old = configmap(cluster, N.DRIVER_CONFIGMAP)
    del old["metadata"]["annotations"][N.ANNOTATION_OPERATOR_CREATED_FROM]
    old["data"]["node-vfnums"] = "nodes:\n  gpu-a:\n    vfnum: 8\n"      # edited by the administrator since
    assert operator.not_applied(body) == []
    assert configmap(cluster, N.DRIVER_CONFIGMAP)["metadata"]["annotations"][N.ANNOTATION_OPERATOR_CREATED_FROM]
    assert configmap(cluster, N.DRIVER_CONFIGMAP)["data"]["node-vfnums"].endswith("vfnum: 8\n")


def test_events_of_the_cluster_scoped_cr_are_where_kubectl_describe_looks():
    event = event_for(cr({}), "Warning", "VfnumsConfigNotApplied", "m", "2026-11-28T12:00:00Z")
    assert event["metadata"]["namespace"] == "default"
    assert "namespace" not in event["involvedObject"]
    assert event["involvedObject"]["kind"] == N.OPERATOR_KIND and event["involvedObject"]["uid"] == UID
    # the same event again is the same object (counted up), another message another one
    assert event_for(cr({}), "Warning", "VfnumsConfigNotApplied", "m", "later")["metadata"]["name"] == \
        event["metadata"]["name"]
    assert event_for(cr({}), "Warning", "VfnumsConfigNotApplied", "n", "x")["metadata"]["name"] != \
        event["metadata"]["name"]


def test_a_carried_over_cr_keeps_the_owner_id_of_its_objects():
    carried = cr({})
    carried["metadata"]["annotations"] = {N.ANNOTATION_OPERATOR_OWNER_ID: "old-uid"}
    assert contract.owner_id(carried) == "old-uid" and contract.owner_id(cr({})) == UID
    cluster = RecordedCluster(carried)
    operator = Operator(cluster, HELM, EXTENSIONS, REGISTRY)   # type: ignore[arg-type]
    desired = operator._render(carried, frozenset())              # pylint: disable=protected-access
    device = next(o for o in desired[GPU_DEVICE.name] if o["kind"] == "DaemonSet")
    assert device["metadata"]["labels"][N.LABEL_OPERATOR_OWNER] == "old-uid"
    assert device["spec"]["template"]["metadata"]["labels"][N.LABEL_OPERATOR_OWNER] == "old-uid"
    assert device["metadata"]["ownerReferences"][0]["uid"] == UID          # the new CR owns it
    assert device["metadata"]["namespace"] == N.OPERATOR_NAMESPACE
