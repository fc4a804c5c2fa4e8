# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The Extensions chart's DRA option (issue 41, docs/dra.md): gpu-dra's DaemonSet, its classes,
its rights, its admission policy, and one mode per node against gpu-device.

What the classes and the policy admit on a real API server is for
tests/integration/test_dra_cluster.py; here the rendering.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Mapping

import pytest

from ansible_collections.metax.gpu.plugins.module_utils import names
from ansible_collections.metax.gpu.plugins.module_utils.agents import gpu_dra

from .helm import find_helm, helm_required, render

HELM = find_helm()
pytestmark = helm_required(HELM)
SUPPORTED = ["--api-versions", "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy", "--kube-version", "1.36.3"]
ON = {"dra": {"enabled": True}}


def rendered(values: Dict[str, Any], extra=None) -> List[Dict[str, Any]]:
    rc, objects, err = render(HELM, values, extra=SUPPORTED if extra is None else extra)
    assert rc == 0, err
    return objects


def by(objects, kind, name=None):
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    return found


def term_matches(term: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A nodeSelectorTerm against a node's labels (the scheduler's rules for the operators used)."""
    for expr in term["matchExpressions"]:
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        if op == "DoesNotExist" and key in labels:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
    return True


def runs_on(daemonset: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    pod = daemonset["spec"]["template"]["spec"]
    if any(labels.get(k) != v for k, v in (pod.get("nodeSelector") or {}).items()):
        return False
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return any(term_matches(t, labels) for t in terms)


def test_off_by_default():
    objects = rendered({})
    assert not by(objects, "DaemonSet", names.DAEMONSET_GPU_DRA) and not by(objects, "DeviceClass")
    assert not [o for o in objects if o["metadata"]["name"].endswith("-resourceslices")]


@pytest.mark.parametrize("mode", [None, names.DEVICE_MODE_PLUGIN, names.DEVICE_MODE_DRA, "other"])
@pytest.mark.parametrize("paused", [False, True])
def test_a_node_is_never_served_by_both(mode, paused):
    """For every value of the switch, at most one of gpu-device and gpu-dra runs on a GPU node, and
    exactly one unless the agents are paused."""
    objects = rendered(ON)
    device = by(objects, "DaemonSet", names.DAEMONSET_GPU_DEVICE)[0]
    dra = by(objects, "DaemonSet", names.DAEMONSET_GPU_DRA)[0]
    labels = {names.LABEL_GPU_INSTALLED: "true"}
    if mode is not None:
        labels[names.LABEL_DEVICE_MODE] = mode
    if paused:
        labels[names.LABEL_AGENTS_PAUSED] = "true"
    serving = [ds["metadata"]["name"] for ds in (device, dra) if runs_on(ds, labels)]
    if paused:
        assert serving == []
    else:
        assert serving == [names.DAEMONSET_GPU_DRA if mode == names.DEVICE_MODE_DRA else names.DAEMONSET_GPU_DEVICE]
    # a node without GPUs runs neither
    assert not runs_on(device, {}) and not runs_on(dra, {names.LABEL_DEVICE_MODE: names.DEVICE_MODE_DRA})


def test_the_daemonset_runs_gpu_dra_with_the_kubelets_directories():
    objects = rendered(dict(ON, dra={"enabled": True, "healthyInterval": 3}))
    (ds,) = by(objects, "DaemonSet", names.DAEMONSET_GPU_DRA)
    pod = ds["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["serviceAccountName"] == "gpu-dra"
    assert container["image"].rsplit("/", 1)[1].startswith("gpu-dra:")
    args = gpu_dra.build_parser().parse_args(container["args"])
    assert (args.host_root, args.healthy_interval, args.cdi_spec_dir) == ("/host", 3, names.CDI_SPEC_DIR)
    assert (args.plugins_dir, args.plugins_registry_dir) == ("/var/lib/kubelet/plugins",
                                                             "/var/lib/kubelet/plugins_registry")
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v.get("hostPath", {}).get("path") for v in pod["volumes"]}
    # mounted at the kubelet's own paths: the kubelet dials the socket path gpu-dra registers
    for name in ("plugin-dir", "plugins-registry", "cdi-specs"):
        assert mounts[name] == volumes[name]
    assert mounts["plugin-dir"] == "/var/lib/kubelet/plugins/" + names.DRA_DRIVER
    assert [e["name"] for e in container["env"]] == ["NODE_NAME"]


@pytest.mark.parametrize("mapped", ["gpu", "vf", ""])
def test_device_classes_select_the_driver_and_function_and_one_maps_the_extended_resource(mapped):
    objects = rendered({"dra": {"enabled": True, "extendedResourceClass": mapped}})
    classes = {o["metadata"]["name"]: o["spec"] for o in by(objects, "DeviceClass")}
    assert set(classes) == {names.DRA_DEVICE_CLASS_GPU, names.DRA_DEVICE_CLASS_VF}
    for name, function in ((names.DRA_DEVICE_CLASS_GPU, "PF"), (names.DRA_DEVICE_CLASS_VF, "VF")):
        (selector,) = classes[name]["selectors"]
        assert selector["cel"]["expression"] == (
            'device.driver == "%s" && device.attributes["%s"].function == "%s"' % (
                names.DRA_DRIVER, names.DRA_DRIVER, function))
    owners = [n for n, spec in classes.items() if spec.get("extendedResourceName") == names.RESOURCE_NAME]
    want = {"gpu": [names.DRA_DEVICE_CLASS_GPU], "vf": [names.DRA_DEVICE_CLASS_VF], "": []}[mapped]
    assert owners == want


def test_rbac_is_what_gpu_dra_calls():
    objects = rendered(ON)
    (role,) = by(objects, "ClusterRole", "metax-gpu-gpu-dra")
    rules = {(r["apiGroups"][0], r["resources"][0]): sorted(r["verbs"]) for r in role["rules"]}
    assert rules == {("", "nodes"): ["get"], ("resource.k8s.io", "resourceclaims"): ["get"],
                     ("resource.k8s.io", "resourceslices"): ["create", "delete", "list", "update"]}
    (binding,) = by(objects, "ClusterRoleBinding", "metax-gpu-gpu-dra")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpu-dra", "namespace": "metax-gpu"}]


def test_the_policy_confines_gpu_dras_slices_to_its_node_and_driver():
    objects = rendered(ON)
    policy = by(objects, "ValidatingAdmissionPolicy", "metax-gpu-node-agents-resourceslices")[0]
    binding = by(objects, "ValidatingAdmissionPolicyBinding", "metax-gpu-node-agents-resourceslices")[0]
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["resourceRules"] == [{
        "apiGroups": ["resource.k8s.io"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE", "DELETE"],
        "resources": ["resourceslices"]}]
    user = "system:serviceaccount:metax-gpu:gpu-dra"
    assert spec["matchConditions"][0]["expression"] == "request.userInfo.username in %s" % json.dumps([user])
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    assert json.loads(variables["driver"].split("[request.userInfo.username]")[0]) == {user: names.DRA_DRIVER}
    checks = [v["expression"] for v in spec["validations"]]
    assert checks == ['variables.nodeName != ""',
                      'request.operation == "DELETE" || variables.newNode == variables.nodeName',
                      'request.operation == "CREATE" || variables.oldNode == variables.nodeName',
                      'request.operation == "DELETE" || object.spec.driver == variables.driver',
                      'request.operation == "CREATE" || (oldObject != null && oldObject.spec.driver == variables.driver)']
    assert 'object.spec.?nodeName.orValue("")' in variables["newNode"]
    assert "oldObject == null" in variables["oldNode"] and 'oldObject.spec.?nodeName.orValue("")' in variables["oldNode"]
    assert all(r["reason"] == "Forbidden" and r["messageExpression"].startswith("variables.agent + ")
               for r in spec["validations"])
    # gpu-dra is a node agent of the Node policy too, owning no key: it may read its node, never change it
    node_policy = by(objects, "ValidatingAdmissionPolicy", "metax-gpu-node-agents")[0]
    assert user in node_policy["spec"]["matchConditions"][0]["expression"]
    assert names.NODE_AGENT_KEYS["gpu-dra"] == {"labels": (), "annotations": ()}


def test_the_operator_renders_gpu_dra_only_when_its_spec_deploys_it():
    """spec.draDriver.deploy: the controller's rendering of the Extensions chart keeps gpu-dra's DaemonSet,
    RBAC and DeviceClasses, the classes cluster-scoped (no namespace, no owner reference across scopes)."""
    from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator import components, mapping
    from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator import render as operator_render
    from .helm import CHART

    owner = {"metadata": {"name": names.OPERATOR_CR_NAME, "uid": "u-1"}}
    for deploy in (False, True):
        spec = {"minimal": False, "draDriver": {"deploy": deploy, "healthyInterval": 7,
                                                "extendedResourceClass": "vf"},
                "driver": {"deploy": False}, "maca": {"deploy": False}, "runtime": {"deploy": False}}
        values = mapping.spec_to_extension_values(spec, {names.LABEL_GPU_INSTALLED: "true"})
        assert values["dra"]["enabled"] and values["dra"]["healthyInterval"] == 7
        rendered = operator_render.helm_template(HELM, str(CHART), values, "metax-operator")
        desired = operator_render.desired_objects(rendered, spec, owner)
        objects = desired[names.DAEMONSET_GPU_DRA]
        if not deploy:
            assert objects == []
            continue
        kinds = sorted(o["kind"] for o in objects)
        assert kinds == ["ClusterRole", "ClusterRoleBinding", "DaemonSet", "DeviceClass", "DeviceClass",
                         "ServiceAccount"]
        for obj in objects:
            if obj["kind"] == "DeviceClass":
                assert "namespace" not in obj["metadata"] and "ownerReferences" not in obj["metadata"]
        (ds,) = [o for o in objects if o["kind"] == "DaemonSet"]
        args = gpu_dra.build_parser().parse_args(ds["spec"]["template"]["spec"]["containers"][0]["args"])
        assert args.healthy_interval == 7
        assert ds["spec"]["template"]["spec"]["containers"][0]["image"].endswith("gpu-dra:latest")
        mapped = [o["metadata"]["name"] for o in objects
                  if o["kind"] == "DeviceClass" and o["spec"].get("extendedResourceName")]
        assert mapped == [names.DRA_DEVICE_CLASS_VF]
    # in the chain after the components whose labels it requires (maca.ready, runtime.ready) and gpu-device
    order = components.REGISTRY.index
    assert order(components.GPU_DRA) > max(order(components.MACA), order(components.CONTAINER_RUNTIME),
                                           order(components.GPU_DEVICE))
