# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The operator renders the GPU Extensions chart itself (real helm) and adapts the objects.

The agents' command lines come from the one chart; the operator adds the
readiness gate, the CR's images, ownership and podTemplateSpec overrides.
"""

from __future__ import annotations

import json

from ansible_collections.metax.gpu.plugins.module_utils import names
from ansible_collections.metax.gpu.plugins.module_utils.agents import gpu_device, gpu_exporter
from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator import components, render

from charts.helm import CHART, find_helm, helm_required

HELM = find_helm()
pytestmark = helm_required(HELM)

OWNER = {"metadata": {"name": names.OPERATOR_CR_NAME, "namespace": names.OPERATOR_NAMESPACE, "uid": "u-1"}}
IMAGE = {"registry": "127.0.0.1:5000/metax-gpu", "version": "abc", "pullPolicy": "Always"}
SPEC = {
    "labelgen": {"image": dict(IMAGE, name="gpu-label")},
    "devicePlugin": {"healthyInterval": 7, "image": dict(IMAGE, name="gpu-device"),
                     "log": {"dir": "", "level": "debug", "format": "text", "rotationTime": "1d", "maxAge": "4w"},
                     "resources": {"limits": {"memory": "256Mi"}},
                     "podTemplateSpec": {"spec": {"tolerations": [{"key": "dp", "operator": "Exists"}]}}},
    "gpuAware": {"deploy": False},
    "podTemplateSpec": {"metadata": {"annotations": {"team": "gpu"}}},
    "hostRoot": {"path": "/var/lib/metax-sim", "subPathExpr": "$(NODE_NAME)"},
    # the chain components are on unless switched off (issue 38); these tests switch them on one by one
    "runtime": {"deploy": False}, "driver": {"deploy": False}, "maca": {"deploy": False},
}


def objects(spec):
    rendered = render.helm_template(HELM, str(CHART), render.chart_values(spec), names.OPERATOR_NAMESPACE)
    return render.desired_objects(rendered, spec, OWNER)


def workload(objs, name):
    return next(o for o in objs[name] if o["kind"] in ("DaemonSet", "Deployment"))


def test_each_component_gets_its_own_objects_owned_by_the_cr():
    objs = objects(SPEC)
    assert objs["gpu-aware"] == []
    kinds = {name: sorted(o["kind"] for o in objs[name]) for name in objs}
    # gpu-device: also its health policy ConfigMap and the Role of its health Events (docs/health.md)
    assert kinds["metax-gpu-device"] == ["ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet", "Role", "RoleBinding",
                                         "ServiceAccount"]
    assert kinds["metax-gpu-label"] == ["ClusterRole", "ClusterRoleBinding", "DaemonSet", "ServiceAccount"]
    for obj in objs["metax-gpu-device"] + objs["metax-gpu-label"]:
        labels = obj["metadata"]["labels"]
        assert labels[names.LABEL_OPERATOR_OWNER] == "u-1"
        assert "helm.sh/chart" not in labels
        if obj["kind"].startswith("Cluster"):
            assert "namespace" not in obj["metadata"] and "ownerReferences" not in obj["metadata"]
        else:
            assert obj["metadata"]["namespace"] == names.OPERATOR_NAMESPACE
            assert obj["metadata"]["ownerReferences"][0]["uid"] == "u-1"


def test_cr_fields_reach_the_daemonset():
    ds = workload(objects(SPEC), "metax-gpu-device")
    pod = ds["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == "127.0.0.1:5000/metax-gpu/gpu-device:abc"
    assert container["imagePullPolicy"] == "Always"
    assert container["resources"] == {"limits": {"memory": "256Mi"}}
    args = gpu_device.build_parser().parse_args(container["args"])
    assert args.healthy_interval == 7
    assert pod["nodeSelector"] == {names.LABEL_GPU_INSTALLED: "true"}
    assert pod["tolerations"][-1] == {"key": "dp", "operator": "Exists"}
    assert ds["spec"]["template"]["metadata"]["annotations"] == {"team": "gpu"}
    assert "--host-prefix=/var/lib/metax-sim/$(NODE_NAME)" in container["args"]


def test_a_changed_field_changes_only_its_component():
    before = objects(SPEC)
    spec = json.loads(json.dumps(SPEC))
    spec["devicePlugin"]["healthyInterval"] = 9
    after = objects(spec)
    assert after["metax-gpu-label"] == before["metax-gpu-label"]
    assert workload(after, "metax-gpu-device") != workload(before, "metax-gpu-device")


def test_minimal_mode_and_gpu_aware():
    objs = objects(dict(SPEC, gpuAware={"deploy": True}))
    assert sorted(o["kind"] for o in objs["gpu-aware"]) == [
        "ClusterRole", "ClusterRoleBinding", "ConfigMap", "Deployment", "Role", "RoleBinding", "Service",
        "ServiceAccount"]
    minimal = objects(dict(SPEC, gpuAware={"deploy": True}, minimal=True))
    assert minimal["gpu-aware"] == [] and minimal["metax-gpu-device"] and minimal["metax-gpu-label"]
    off = objects(dict(SPEC, labelgen={"deploy": False}))
    assert off["metax-gpu-label"] == [] and off["metax-gpu-device"]


def test_drift_is_a_changed_or_missing_field_of_ours_not_what_the_server_adds():
    desired = {"metadata": {"name": "gpu-device", "labels": {"a": "1"}},
               "spec": {"template": {"spec": {"nodeSelector": {"x": "true"},
                                              "containers": [{"name": "c", "args": ["--a"], "ports": [
                                                  {"containerPort": 8080}]}]}}}}
    live = {"metadata": {"name": "gpu-device", "labels": {"a": "1", "other": "2"}, "generation": 3},
            "spec": {"revisionHistoryLimit": 10,
                     "template": {"spec": {"nodeSelector": {"x": "true"}, "dnsPolicy": "ClusterFirst",
                                           "containers": [{"name": "c", "args": ["--a"], "ports": [
                                               {"containerPort": "8080", "protocol": "TCP"}],
                                               "terminationMessagePath": "/dev/termination-log"}]}}},
            "status": {"numberReady": 1}}
    assert not render.drifted(live, desired)
    # what the API server omits when empty (a gate-less nodeSelector, hostNetwork: false) is not drift
    omitted = dict(desired["spec"], selector={}, paused=False, minReadySeconds=0)
    assert not render.drifted(live, dict(desired, spec=omitted))
    edited = json.loads(json.dumps(live))
    edited["spec"]["template"]["spec"]["nodeSelector"] = {"edited": "by-hand"}
    assert render.drifted(edited, desired)
    edited = json.loads(json.dumps(live))
    edited["spec"]["template"]["spec"]["containers"][0]["args"].append("--b")   # atomic list: extra is drift
    assert render.drifted(edited, desired)
    edited = json.loads(json.dumps(live))
    del edited["metadata"]["labels"]["a"]
    assert render.drifted(edited, desired)


def test_data_exporter_deploys_gpu_exporter_from_the_extensions_chart():
    assert objects(SPEC)["metax-gpu-exporter"] == []    # off unless the CR asks (as in the real product)
    spec = dict(SPEC, dataExporter={"deploy": True, "interval": 5, "service": {"port": 30445, "type": "NodePort"},
                                    "image": dict(IMAGE, name="gpu-exporter"), "log": {"format": "text"},
                                    "resources": {"limits": {"memory": "96Mi"}}})
    objs = objects(spec)
    assert sorted((o["kind"], o["metadata"]["name"]) for o in objs["metax-gpu-exporter"]) == [
        ("ConfigMap", "gpu-exporter-dashboard"), ("DaemonSet", "metax-gpu-exporter"), ("Service", "gpu-exporter"),
        ("ServiceAccount", "gpu-exporter")]
    for obj in objs["metax-gpu-exporter"]:
        assert obj["metadata"]["namespace"] == names.OPERATOR_NAMESPACE
        assert obj["metadata"]["ownerReferences"][0]["uid"] == "u-1"
        assert obj["metadata"]["labels"][names.LABEL_OPERATOR_OWNER] == "u-1"
    ds = workload(objs, "metax-gpu-exporter")
    pod = ds["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == "127.0.0.1:5000/metax-gpu/gpu-exporter:abc"
    assert container["resources"] == {"limits": {"memory": "96Mi"}}
    args = gpu_exporter.build_parser().parse_args(container["args"])
    assert (args.port, args.interval, args.log_format) == (30445, 5.0, "text")
    assert container["ports"] == [{"name": "metrics", "containerPort": 30445}]
    service = next(o for o in objs["metax-gpu-exporter"] if o["kind"] == "Service")
    assert (service["spec"]["type"], service["spec"]["ports"][0]["port"]) == ("NodePort", 30445)
    # GPU nodes only; driver.ready joins the gate once a driver component is deployed
    assert pod["nodeSelector"] == {names.LABEL_GPU_INSTALLED: "true"}
    assert ds["spec"]["template"]["metadata"]["annotations"] == {"team": "gpu"}
    # the other components are untouched by it
    assert objs["metax-gpu-device"] == objects(SPEC)["metax-gpu-device"]
    assert objects(dict(spec, minimal=True))["metax-gpu-exporter"] == []


def test_runtime_deploys_container_runtime_and_gates_gpu_device_on_runtime_ready():
    from ansible_collections.metax.gpu.plugins.module_utils.agents import container_runtime
    assert objects(SPEC)["metax-container-runtime"] == []      # off: SPEC switches it off
    spec = dict(SPEC, runtime={"deploy": True, "image": dict(IMAGE, name="container-runtime")})
    objs = objects(spec)
    assert sorted(o["kind"] for o in objs["metax-container-runtime"]) == [
        "ClusterRole", "ClusterRoleBinding", "DaemonSet", "RuntimeClass", "ServiceAccount"]
    # the RuntimeClass metax of real MetaX clusters: cluster-scoped, found again by the owner label
    runtime_class = next(o for o in objs["metax-container-runtime"] if o["kind"] == "RuntimeClass")
    assert runtime_class["metadata"]["name"] == names.RUNTIME_CLASS and runtime_class["handler"] == names.RUNTIME_HANDLER
    assert "namespace" not in runtime_class["metadata"] and "ownerReferences" not in runtime_class["metadata"]
    assert runtime_class["metadata"]["labels"][names.LABEL_OPERATOR_OWNER]
    role = next(o for o in objs["metax-container-runtime"] if o["kind"] == "ClusterRole")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]
    pod = workload(objs, "metax-container-runtime")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == "127.0.0.1:5000/metax-gpu/container-runtime:abc"
    args = container_runtime.build_parser().parse_args(container["args"])
    assert args.host_root == "/host" and args.restart == "auto" and args.revert_on_exit and not args.write_spec
    assert pod["hostPID"] is True and container["readinessProbe"]["exec"]["command"][-1] == container_runtime.READY_FILE
    assert pod["nodeSelector"] == {names.LABEL_GPU_INSTALLED: "true"}
    # gpu-device now waits for the runtime to read CDI
    device = workload(objs, "metax-gpu-device")["spec"]["template"]["spec"]
    assert device["nodeSelector"][names.LABEL_RUNTIME_READY] == "true"


def test_maca_deploys_metax_maca_with_one_image_volume_per_payload_and_gates_gpu_device():
    from ansible_collections.metax.gpu.plugins.module_utils.agents import maca_manager
    assert objects(SPEC)["metax-maca"] == []                   # off: SPEC switches it off
    images = ["maca-c500:2.18.0.3-ubuntu18.04-amd64", "mxn100-maca:2.18.0.3"]
    spec = dict(SPEC, runtime={"deploy": True}, maca={
        "deploy": True, "image": dict(IMAGE, name="driver-manager"),
        "payload": {"registry": "harbor.example.cn/mximages", "images": images, "pullPolicy": "Always"}})
    objs = objects(spec)
    assert [o["kind"] for o in objs["metax-maca"]] == ["DaemonSet"]   # no account: it writes nothing to the API
    pod = workload(objs, "metax-maca")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    # the real metax-maca runs the driver-manager image
    assert container["image"] == "127.0.0.1:5000/metax-gpu/driver-manager:abc"
    args = maca_manager.build_parser().parse_args(container["args"])
    refs = ["harbor.example.cn/mximages/" + i for i in images]
    assert args.image == refs and args.payload_dir == "/payloads" and args.host_root == "/host"
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    for index, ref in enumerate(refs):
        assert volumes["payload-%d" % index]["image"] == {"reference": ref, "pullPolicy": "Always"}
        assert mounts["payload-%d" % index] == {"name": "payload-%d" % index, "mountPath": "/payloads/%d" % index,
                                                "readOnly": True}
    assert mounts["host-root"]["subPathExpr"] == "$(NODE_NAME)"
    assert container["readinessProbe"]["exec"]["command"][-1] == maca_manager.DEFAULT_READY_FILE
    # after runtime.ready, as the real one; gpu-device then waits for maca.ready too
    assert pod["nodeSelector"] == {names.LABEL_GPU_INSTALLED: "true", names.LABEL_RUNTIME_READY: "true",
                                   "kubernetes.io/os": "linux"}
    device = workload(objs, "metax-gpu-device")["spec"]["template"]["spec"]["nodeSelector"]
    assert device[names.LABEL_MACA_READY] == "true" and device[names.LABEL_RUNTIME_READY] == "true"


def test_a_cr_without_deploy_members_deploys_the_whole_chain_as_the_real_product():
    """The real 0.9.2 CR names no deploy for labelgen, devicePlugin, driver, maca, runtime: all five run."""
    spec = {key: value for key, value in SPEC.items() if key not in ("runtime", "driver", "maca")}
    spec["driver"] = {"payload": {"registry": "r", "name": "driver-image", "version": "2.29.0.13"}}
    spec["maca"] = {"payload": {"registry": "r", "images": ["mxc500-maca:2.29.0.7-ubuntu22.04-amd64"]}}
    objs = objects(spec)
    chain = (components.GPU_LABEL, components.CONTAINER_RUNTIME, components.DRIVER, components.MACA,
             components.GPU_DEVICE)
    for component in chain:
        assert workload(objs, component.name)["kind"] == "DaemonSet", component.name
    assert objs[components.GPU_AWARE.name] == [] and objs[components.GPU_EXPORTER.name] == []
    device = workload(objs, components.GPU_DEVICE.name)["spec"]["template"]["spec"]["nodeSelector"]
    assert device == {names.LABEL_GPU_INSTALLED: "true", names.LABEL_MACA_READY: "true",
                      names.LABEL_RUNTIME_READY: "true"}
    # the minimal mode, chosen explicitly, is gpu-label and gpu-device only
    minimal = objects(dict(spec, minimal=True))
    assert [n for n, o in minimal.items() if o] == [components.GPU_LABEL.name, components.GPU_DEVICE.name]


def test_the_vfnum_policy_reaches_driver_managers_command_line_and_its_rbac():
    from ansible_collections.metax.gpu.plugins.module_utils.agents import driver_manager
    base = dict(SPEC, driver={"deploy": True, "image": dict(IMAGE, name="driver-manager"),
                              "payload": {"registry": "r", "name": "driver-image", "version": "2.15.0"}})

    def rendered(spec):
        objs = objects(spec)["metax-driver"]
        args = driver_manager.build_parser().parse_args(workload({"x": objs}, "x")["spec"]["template"]["spec"]
                                                        ["containers"][0]["args"])
        return args, {(o["kind"], o["metadata"]["name"]): o for o in objs}
    args, objs = rendered(base)
    assert (args.vfnum_evict_in_use, args.vfnum_max_parallel) == ("false", 1)       # refuse, one node at a time
    args, objs = rendered(dict(base, driver=dict(base["driver"], vfnumPolicy={"evictInUse": True, "maxParallel": 3})))
    assert (args.vfnum_evict_in_use, args.vfnum_max_parallel) == ("true", 3)
    cluster_rules = objs[("ClusterRole", "metax-gpu-driver-manager")]["rules"]
    assert {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]} in cluster_rules
    # no pod is listed cluster-wide: the pods holding the node's GPUs come from the kubelet (issue 39)
    assert not [r for r in cluster_rules if "pods" in r["resources"]]
    # the guard is the operator-controller's in this scheme: the chart's own guard is not rendered
    chart = render.helm_template(HELM, str(CHART), dict(render.chart_values(base), nodeAgentPolicy={"enabled": True}),
                                 names.OPERATOR_NAMESPACE)
    assert not [o for o in chart if "eviction-guard" in o["metadata"]["name"]]
    leases = [r for r in objs[("Role", "driver-manager")]["rules"] if r["resources"] == ["leases"]]
    assert leases == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                       "verbs": ["list", "watch", "create", "update", "delete"]}]
