# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The vfioManager component (issue 43): rendered from the one chart, gated as the real one, and its condition."""

from __future__ import annotations

from ansible_collections.metax.gpu.plugins.module_utils import names
from ansible_collections.metax.gpu.plugins.module_utils.agents import vfio_manager
from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator import components, render
from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator.contract import cleanup_patch
from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator.status import ignored_fields, node_messages
from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator.vfio import vfio_conditions

from charts.helm import CHART, find_helm, helm_required

HELM = find_helm()
OWNER = {"metadata": {"name": names.OPERATOR_CR_NAME, "namespace": names.OPERATOR_NAMESPACE, "uid": "u-1"}}
IMAGE = {"registry": "127.0.0.1:5000/metax-gpu", "version": "abc", "pullPolicy": "Always"}
SPEC = {"runtime": {"deploy": False}, "driver": {"deploy": False}, "maca": {"deploy": False},
        "vfioManager": {"deploy": True, "image": dict(IMAGE, name="vfio-manager")}}


def node(name, iommu=None, message=None):
    annotations = {}
    if iommu:
        annotations[names.ANNOTATION_VFIO_IOMMU] = iommu
    if message:
        annotations[names.ANNOTATION_VFIO_MESSAGE] = message
    return {"metadata": {"name": name, "labels": {names.LABEL_GPU_INSTALLED: "true"}, "annotations": annotations}}


def objects(spec):
    rendered = render.helm_template(HELM, str(CHART), render.chart_values(spec), names.OPERATOR_NAMESPACE)
    return render.desired_objects(rendered, spec, OWNER)


@helm_required(HELM)
def test_deploy_renders_metax_vfio_manager_on_gpu_nodes_with_its_rbac():
    objs = objects(SPEC)[names.DAEMONSET_VFIO_MANAGER]
    by_kind = {(o["kind"], o["metadata"]["name"]): o for o in objs}
    ds = by_kind[("DaemonSet", "metax-vfio-manager")]
    pod = ds["spec"]["template"]["spec"]
    # the real metax-vfio-manager's selector (samples: gpu.installed=true), nothing else of the chain
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux", names.LABEL_GPU_INSTALLED: "true"}
    container = pod["containers"][0]
    assert container["image"] == "127.0.0.1:5000/metax-gpu/vfio-manager:abc"
    args = vfio_manager.build_parser().parse_args(container["args"])
    assert (args.config_map, args.evict_in_use, args.host_root) == (names.DRIVER_CONFIGMAP, False, "/host")
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert not mounts["host-root"].get("readOnly") and "device-plugins" in mounts and "pod-resources" in mounts
    assert {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]} in \
        by_kind[("ClusterRole", "metax-gpu-vfio-manager")]["rules"]
    # the vfnum rules: spec.driver.vfnumPolicy.evictInUse evicts for vfio-manager too
    spec = dict(SPEC, driver={"deploy": False, "vfnumPolicy": {"evictInUse": True}})
    ds = next(o for o in objects(spec)[names.DAEMONSET_VFIO_MANAGER] if o["kind"] == "DaemonSet")
    assert vfio_manager.build_parser().parse_args(ds["spec"]["template"]["spec"]["containers"][0]["args"]).evict_in_use


@helm_required(HELM)
def test_off_by_default_as_the_real_crd():
    spec = dict(SPEC, vfioManager={"deploy": False})
    assert objects(spec)[names.DAEMONSET_VFIO_MANAGER] == []
    assert objects({k: v for k, v in SPEC.items() if k != "vfioManager"})[names.DAEMONSET_VFIO_MANAGER] == []


def test_no_longer_an_ignored_field():
    assert ignored_fields({"spec": {"vfioManager": {"deploy": True}}}) == []


def test_the_condition_names_the_nodes_without_iommu():
    nodes = [node("vm", "enabled"), node("vm-4", "disabled"), node("vm-5", "disabled"), node("vm-2")]
    (cond,) = vfio_conditions(SPEC, nodes)
    assert cond["type"] == "IOMMUDisabled" and cond["status"] == "True"
    assert "vm-4, vm-5" in cond["message"] and "vm," not in cond["message"]
    assert vfio_conditions(SPEC, nodes[:1])[0]["status"] == "False"
    assert vfio_conditions(dict(SPEC, vfioManager={"deploy": False}), nodes) == []


def test_failures_degrade_and_cleanup_takes_its_annotations():
    nodes = [node("vm", "enabled", "refused, the GPUs are in use: ...")]
    assert node_messages(components.VFIO_MANAGER, nodes) == {"vm": "refused, the GPUs are in use: ..."}
    patch = cleanup_patch({}, nodes[0]["metadata"]["annotations"], [components.VFIO_MANAGER])
    assert patch == {"annotations": {names.ANNOTATION_VFIO_IOMMU: None, names.ANNOTATION_VFIO_MESSAGE: None}}


def test_the_crd_accepts_every_condition_type_the_controller_writes():
    # the API server refused the controller's whole status while IOMMUDisabled was missing from the enum
    import yaml
    from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator import status as operator_status
    from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator import vfio as operator_vfio
    from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator.contract import ADMINISTRATOR_OWNED
    from charts.helm import CHARTS

    crd = yaml.safe_load((CHARTS / "metax-operator" / "crds" / "clusteroperator.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    enum = schema["properties"]["status"]["properties"]["conditions"]["items"]["properties"]["type"]["enum"]
    written = {"Ready", "Progressing", "Degraded", operator_status.IGNORED_CONDITION, operator_vfio.CONDITION}
    written |= {owned.reason for owned in ADMINISTRATOR_OWNED}
    assert written <= set(enum)
