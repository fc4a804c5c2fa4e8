"""driver-manager's API calls for the remediation ladder (health/remediation_kube.py), against a recording
stand-in of the client's CoreV1Api: what is sent, and how the answers the ladder depends on are read."""
from __future__ import annotations

import json

import pytest

from ansible_collections.metax.gpu.plugins.module_utils import names as N
from ansible_collections.metax.gpu.plugins.module_utils.agents import driver_manager as dm
from ansible_collections.metax.gpu.plugins.module_utils.kube.client import ApiException
from ansible_collections.metax.gpu.plugins.module_utils.maintenance.run import Stale


def _error(status):
    exc = ApiException()
    exc.status, exc.reason = status, "status %d" % status
    return exc


class Raw:
    def __init__(self, doc):
        self.data = json.dumps(doc).encode()

    def release_conn(self):
        pass


class Core:
    def __init__(self, node, policy=None, patch_error=None):
        self.node = node
        self.policy = policy
        self.patch_error = patch_error
        self.calls = []

    def read_node(self, name, **kwargs):
        self.calls.append(("read_node", name))
        return Raw(self.node)

    def patch_node(self, name, body, **kwargs):
        self.calls.append(("patch_node", name, body, kwargs.get("_content_type")))
        if self.patch_error:
            raise _error(self.patch_error)
        return Raw(self.node)

    def patch_node_status(self, name, body, **kwargs):
        self.calls.append(("patch_node_status", name, body, kwargs.get("_content_type")))
        return Raw(self.node)

    def create_namespaced_event(self, namespace, body, **kwargs):
        self.calls.append(("event", namespace, body))

    def read_namespaced_config_map(self, name, namespace, **kwargs):
        self.calls.append(("configmap", name, namespace))
        if self.policy is None:
            raise _error(404)
        return {"data": {"policy.json": self.policy}}


def kube(core):
    k = dm.Kube.__new__(dm.Kube)       # the API calls alone, without a client or the kubelet's socket
    k.api, k.core, k.node, k.namespace = None, core, "gpu-1", "metax-operator"
    return k


NODE = {"metadata": {"name": "gpu-1", "resourceVersion": "7", "annotations": {"a": "b"}}, "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


def test_read_node_is_the_whole_node_and_node_metadata_keeps_it_for_the_ladder():
    k = kube(Core(NODE))
    assert k.read_node() == NODE
    assert k.node_metadata() == NODE["metadata"] and k.last_node == NODE


def test_the_maintenance_patch_is_a_merge_patch_and_a_409_is_stale():
    core = Core(NODE)
    kube(core).merge_patch_node({"metadata": {"resourceVersion": "7"}, "spec": {"unschedulable": True}})
    assert core.calls[-1][2] == {"metadata": {"resourceVersion": "7"}, "spec": {"unschedulable": True}}
    assert core.calls[-1][3] == "application/merge-patch+json"
    with pytest.raises(Stale):
        kube(Core(NODE, patch_error=409)).merge_patch_node({"spec": {"unschedulable": True}})
    with pytest.raises(ApiException):
        kube(Core(NODE, patch_error=403)).merge_patch_node({"spec": {"unschedulable": True}})


def test_the_condition_merges_by_type_and_the_event_names_its_namespace():
    core = Core(NODE)
    k = kube(core)
    k.write_condition({"type": N.CONDITION_GPU_REMEDIATION, "status": "True", "reason": "Cordoned", "message": "m"})
    name, body, kind = core.calls[-1][1:]
    assert name == "gpu-1" and kind == "application/strategic-merge-patch+json"
    assert body == {"status": {"conditions": [{"type": N.CONDITION_GPU_REMEDIATION, "status": "True",
                                               "reason": "Cordoned", "message": "m"}]}}
    k.node_event("GPURemediationCordon", "cordoned", warning=True)
    namespace, event = core.calls[-1][1:]
    assert namespace == "metax-operator"
    # an Event about a Node outside "default" is refused unless its involvedObject names the namespace
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": "gpu-1", "uid": "gpu-1",
                                       "namespace": "metax-operator"}
    assert (event["reason"], event["type"], event["source"]["component"]) == ("GPURemediationCordon", "Warning",
                                                                              "driver-manager")


def test_the_health_policy_is_the_configmaps_document_or_none():
    assert kube(Core(NODE, policy='{"rules": []}')).health_policy() == '{"rules": []}'
    core = Core(NODE)
    assert kube(core).health_policy() is None
    assert core.calls[-1] == ("configmap", N.HEALTH_POLICY_CONFIGMAP, "metax-operator")
