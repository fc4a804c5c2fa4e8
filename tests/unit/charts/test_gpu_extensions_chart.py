# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The GPU Extensions chart: every manual option reaches the agents' own parsers.

Renders files/charts/metax-gpu-extensions with `helm template` for several
value sets and parses every container's arguments with that agent's
build_parser(), so a chart flag the agent does not know fails here, not on a
node. Bad values must be refused by values.schema.json with a message naming
the option.
"""

from __future__ import annotations

import json
import re
from typing import Any, Dict, List

import pytest
import yaml

from ansible_collections.metax.gpu.plugins.module_utils import names
from ansible_collections.metax.gpu.plugins.module_utils.agents import gpu_aware, gpu_device, gpu_exporter, gpu_label
from ansible_collections.metax.gpu.plugins.module_utils.agents.common import parse_duration
from ansible_collections.metax.gpu.plugins.module_utils.extender.policy import parse_weight
from ansible_collections.metax.gpu.plugins.module_utils.health.policy import parse_policy

from .helm import CHART, CHARTS, ROOT, find_helm, helm_required, render

HELM = find_helm()
pytestmark = helm_required(HELM)

# by container name (the workload's: MetaX operator 0.9.2's metax-gpu-device, ...; names.py)
PARSERS = {names.DAEMONSET_GPU_DEVICE: gpu_device.build_parser, names.DAEMONSET_GPU_LABEL: gpu_label.build_parser,
           "gpu-aware": gpu_aware.build_parser, names.DAEMONSET_GPU_EXPORTER: gpu_exporter.build_parser}
# the image of each container: the agent's own name
IMAGES = {names.DAEMONSET_GPU_DEVICE: "gpu-device", names.DAEMONSET_GPU_LABEL: "gpu-label",
          "gpu-aware": "gpu-aware", names.DAEMONSET_GPU_EXPORTER: "gpu-exporter"}

SIM = {"hostRoot": {"path": "/var/lib/metax-sim", "subPathExpr": "$(NODE_NAME)"}}

VALUE_SETS = {
    "defaults": {},
    "extender": {"deployExtenderGPUAware": True, "registry": "registry.local:5000/metax",
                 "pullPolicy": "Always", "gpuAware": {"scoreWeight": "2.5", "lossWeight": "0"}},
    "per-component-logs": {
        "deployExtenderGPUAware": True,
        "log": {"dir": "", "level": "warning", "format": "text", "rotationTime": "1d", "maxAge": "4w"},
        "gpuDevice": {"healthyInterval": 0, "log": {"level": "debug", "dir": "/var/log/metax-dev"}},
        "gpuLabel": {"log": {"format": "json"}},
        "gpuAware": {"log": {"level": "error", "rotationTime": "12h", "maxAge": "1d"}},
    },
    "simulated-nodes": dict(SIM, deployExtenderGPUAware=True, log={"dir": ""}, imageTag="dev"),
    "exporter": dict(SIM, gpuExporter={"enabled": True, "interval": 30, "port": 9555,
                                       "log": {"level": "debug"}}),
}


def containers(objects: List[Dict[str, Any]]):
    for obj in objects:
        if obj["kind"] in ("DaemonSet", "Deployment"):
            pod = obj["spec"]["template"]["spec"]
            for container in pod["containers"]:
                yield obj, pod, container


def parse(container: Dict[str, Any]):
    """The agent's own parser over the container's args (SystemExit = unknown flag or bad value)."""
    args = container.get("args", [])
    try:
        parsed = PARSERS[container["name"]]().parse_args(args)
    except SystemExit as exc:  # argparse reports on stderr and exits 2
        pytest.fail("%s rejects the chart's arguments %r (exit %s)" % (container["name"], args, exc.code))
    # what the agents validate after parsing, at start-up
    parse_duration(parsed.log_rotation_time, "--log-rotation-time")
    parse_duration(parsed.log_max_age, "--log-max-age")
    return parsed


def by_kind_name(objects):
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


@pytest.mark.parametrize("case", sorted(VALUE_SETS))
def test_every_container_parses_with_its_agent(case):
    rc, objects, err = render(HELM, VALUE_SETS[case])
    assert rc == 0, err
    seen = set()
    for _obj, _pod, container in containers(objects):
        parse(container)
        seen.add(container["name"])
    expected = {"metax-gpu-device", "metax-gpu-label"}
    if VALUE_SETS[case].get("deployExtenderGPUAware"):
        expected.add("gpu-aware")
    if VALUE_SETS[case].get("gpuExporter", {}).get("enabled"):
        expected.add("metax-gpu-exporter")
    assert seen == expected


def test_manual_options_reach_the_agents():
    rc, objects, err = render(HELM, VALUE_SETS["per-component-logs"])
    assert rc == 0, err
    args = {c["name"]: parse(c) for _obj, _pod, c in containers(objects)}
    dev, lab, aware = args["metax-gpu-device"], args["metax-gpu-label"], args["gpu-aware"]
    assert dev.healthy_interval == 0
    # component members override the global Log Options, the rest is inherited
    assert (dev.log_level, dev.log_dir, dev.log_format) == ("debug", "/var/log/metax-dev", "text")
    assert (lab.log_level, lab.log_format, lab.log_dir, lab.log_rotation_time, lab.log_max_age) == \
        ("warning", "json", "", "1d", "4w")
    assert (aware.log_level, aware.log_rotation_time, aware.log_max_age) == ("error", "12h", "1d")


def test_defaults_are_the_manuals():
    rc, objects, err = render(HELM, {}, sets=["deployExtenderGPUAware=true"])
    assert rc == 0, err
    for obj, _pod, container in containers(objects):
        parsed = parse(container)
        assert container["image"] == "cr.metax-tech.com/cloud/%s:%s" % (IMAGES[container["name"]], chart_meta()["appVersion"])
        assert container["imagePullPolicy"] == "IfNotPresent"
        assert (parsed.log_dir, parsed.log_level, parsed.log_format, parsed.log_rotation_time,
                parsed.log_max_age) == ("/var/log/metax", "info", "json", "1w", "26w")
        assert obj["metadata"]["namespace"] == names.NAMESPACE
    device = [c for _obj, _pod, c in containers(objects) if c["name"] == "metax-gpu-device"][0]
    assert parse(device).healthy_interval == 5


def test_extender_objects_only_when_asked():
    _rc, off, _err = render(HELM, {})
    assert not [o for o in off if o["metadata"]["name"] in ("gpu-aware", names.GPU_AWARE_CONFIGMAP)]
    rc, on, err = render(HELM, VALUE_SETS["extender"])
    assert rc == 0, err
    objs = by_kind_name(on)
    service = objs[("Service", "gpu-aware")]
    assert [p["port"] for p in service["spec"]["ports"]] == [8080]
    configmap = objs[("ConfigMap", names.GPU_AWARE_CONFIGMAP)]
    assert configmap["metadata"]["namespace"] == names.NAMESPACE
    assert parse_weight(configmap["data"]["scoreWeight"]) == 2.5
    assert parse_weight(configmap["data"]["lossWeight"]) == 0.0
    aware = parse(objs[("Deployment", "gpu-aware")]["spec"]["template"]["spec"]["containers"][0])
    assert (aware.port, aware.namespace, aware.configmap) == (8080, names.NAMESPACE, names.GPU_AWARE_CONFIGMAP)
    assert [c["image"] for _obj, _pod, c in containers(on)][0].startswith("registry.local:5000/metax/")


def test_gpu_device_runs_only_on_labelled_nodes_privileged_with_few_host_paths():
    rc, objects, err = render(HELM, {})
    assert rc == 0, err
    ds = by_kind_name(objects)[("DaemonSet", "metax-gpu-device")]["spec"]["template"]["spec"]
    assert ds["nodeSelector"] == {names.LABEL_GPU_INSTALLED: "true"}
    assert all(k.startswith(names.LABEL_PREFIX) for k in ds["nodeSelector"])
    assert ds["containers"][0]["securityContext"] == {"privileged": True}
    host_paths = sorted(v["hostPath"]["path"] for v in ds["volumes"] if "hostPath" in v)
    # /var/run/cdi: gpu-device writes the node's CDI spec there in CDI mode (docs/runtime.md)
    assert host_paths == ["/", "/var/lib/kubelet/device-plugins", "/var/lib/kubelet/pod-resources", "/var/log/metax",
                          "/var/run/cdi"]
    # the node root read-only and whole: discovery runs the node's mx-smi with its libraries
    root_mounts = [m for m in ds["containers"][0]["volumeMounts"] if m["name"] == "host-root"]
    assert root_mounts == [{"name": "host-root", "mountPath": "/host", "readOnly": True}]
    for name in ("metax-gpu-label",):
        spec = by_kind_name(objects)[("DaemonSet", name)]["spec"]["template"]["spec"]
        ctx = spec["containers"][0]["securityContext"]
        assert not ctx.get("privileged") and ctx["capabilities"] == {"drop": ["ALL"]}
        assert ctx["allowPrivilegeEscalation"] is False


@pytest.mark.parametrize("values, mode", [({}, "auto"), ({"gpuDevice": {"cdiMode": "devices"}}, "devices"),
                                          ({"gpuDevice": {"cdiMode": "cdi"}}, "cdi")])
def test_gpu_device_cdi_mode_is_a_chart_value(values, mode):
    rc, objects, err = render(HELM, values)
    assert rc == 0, err
    args = by_kind_name(objects)[("DaemonSet", "metax-gpu-device")]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--cdi-mode=%s" % mode in args and "--cdi-spec-dir=/var/run/cdi" in args


def test_an_unknown_cdi_mode_is_refused_by_the_schema():
    rc, _objects, err = render(HELM, {"gpuDevice": {"cdiMode": "yes"}})
    assert rc != 0 and "cdiMode" in err


def test_simulated_nodes_use_their_own_root_and_prefix():
    rc, objects, err = render(HELM, VALUE_SETS["simulated-nodes"])
    assert rc == 0, err
    objs = by_kind_name(objects)
    device = objs[("DaemonSet", "metax-gpu-device")]["spec"]["template"]["spec"]
    parsed = parse(device["containers"][0])
    assert (parsed.host_root, parsed.host_prefix) == ("/host", "/var/lib/metax-sim/$(NODE_NAME)")
    mounts = {m["mountPath"]: m for m in device["containers"][0]["volumeMounts"]}
    assert mounts["/host"]["subPathExpr"] == "$(NODE_NAME)"
    env = {e["name"] for e in device["containers"][0]["env"]}
    assert "NODE_NAME" in env    # the kubelet expands $(NODE_NAME) from it
    # stderr-only logging: no log volume, and the unprivileged agents run as non-root
    assert not [v for v in device["volumes"] if v["name"] == "log"]
    for name, kind in (("metax-gpu-label", "DaemonSet"), ("gpu-aware", "Deployment")):
        ctx = objs[(kind, name)]["spec"]["template"]["spec"]["containers"][0]["securityContext"]
        assert ctx["runAsNonRoot"] is True and ctx["runAsUser"] != 0
    assert device["containers"][0]["image"].endswith("/gpu-device:dev")


def test_rbac_is_least_privilege_per_agent():
    rc, objects, err = render(HELM, VALUE_SETS["extender"])
    assert rc == 0, err
    objs = by_kind_name(objects)
    # gpu-exporter reads only the node: no role at all (tests/unit/charts/test_gpu_exporter_chart.py)
    # the service accounts (and so the roles) keep the agents' names: gpu-device, gpu-label, gpu-aware
    rules = {name: objs[("ClusterRole", "metax-gpu-" + name)]["rules"] for name in ("gpu-device", "gpu-label", "gpu-aware")}
    # get: its node's runtime version (gpuDevice.cdiMode auto) and its annotations on resync
    # and nodes/status: its MetaXGPUHealthy condition (docs/health.md); its health Events in its namespace
    assert rules["gpu-device"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
                                   {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]}]
    assert objs[("Role", "gpu-device")]["rules"] == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
    assert rules["gpu-label"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]
    assert rules["gpu-aware"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]}]
    assert objs[("Role", "gpu-aware")]["rules"] == [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "watch"]}]
    for obj, pod, _container in containers(objects):
        # each workload runs as its agent: the service account is the image's name (metax-gpu-device runs gpu-device)
        assert pod["serviceAccountName"] == IMAGES[obj["metadata"]["name"]]
    for obj in objects:
        for rule in obj.get("rules", []):
            assert "*" not in rule["verbs"] and "*" not in rule["resources"]


BAD = [
    ("log.level=verbose", "/log/level"),
    ("log.format=xml", "/log/format"),
    ("log.rotationTime=2m", "/log/rotationTime"),
    ("log.maxAge=0w", "/log/maxAge"),
    ("log.dir=relative/dir", "/log/dir"),
    ("gpuDevice.healthyInterval=-1", "/gpuDevice/healthyInterval"),
    ("gpuDevice.healthyInterval=fast", "/gpuDevice/healthyInterval"),
    ("gpuLabel.log.level=loud", "/gpuLabel/log"),
    ("pullPolicy=Sometimes", "/pullPolicy"),
    ("registry=https://cr.example.com/x", "/registry"),
    ("deployExtenderGPUAware=maybe", "/deployExtenderGPUAware"),
    ("gpuAware.scoreWeight=-1", "/gpuAware/scoreWeight"),
    ("gpuAware.lossWeight=heavy", "/gpuAware/lossWeight"),
    ("gpuDevice.unknownOption=1", "unknownOption"),
    ("gpuNodeSelector.kubernetes\\.io/os=linux", "metax-tech"),
    ("hostRoot.path=relative", "/hostRoot/path"),
]


@pytest.mark.parametrize("pair,where", BAD, ids=[b[0] for b in BAD])
def test_schema_rejects_bad_values_naming_the_option(pair, where):
    rc, objects, err = render(HELM, {}, sets=[pair])
    assert rc != 0 and not objects
    assert "values don't meet the specifications of the schema" in err
    assert where in err, err


def chart_meta() -> Dict[str, Any]:
    return yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))


def test_chart_version_is_the_collection_version():
    galaxy = yaml.safe_load((ROOT / "galaxy.yml").read_text(encoding="utf-8"))
    meta = chart_meta()
    assert meta["version"] == galaxy["version"] == meta["appVersion"]


def test_every_manual_option_is_in_values_and_schema():
    import json
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    for option in ("registry", "pullPolicy", "deployExtenderGPUAware", "log.dir", "log.level", "log.format",
                   "log.rotationTime", "log.maxAge", "gpuDevice.healthyInterval", "gpuDevice.log",
                   "gpuLabel.log", "gpuAware.scoreWeight", "gpuAware.lossWeight", "gpuAware.log"):
        node = values
        for part in option.split("."):
            assert part in node, "values.yaml lacks %s" % option
            node = node[part]
        assert option.split(".", maxsplit=1)[0] in schema["properties"]


def test_helm_lint_is_clean_for_every_chart():
    import subprocess
    for chart in sorted(p for p in CHARTS.iterdir() if (p / "Chart.yaml").exists()):
        proc = subprocess.run([HELM, "lint", "--strict", str(chart)], capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert not re.search(r"\[(WARNING|ERROR)\]", proc.stdout), proc.stdout


@pytest.mark.parametrize("sets", [["log.maxAge=1d", "log.rotationTime=1w"],
                                  ["deployExtenderGPUAware=true", "gpuAware.log.maxAge=12h"]])
def test_max_age_shorter_than_rotation_is_refused(sets):
    rc, objects, err = render(HELM, {}, sets=sets)
    assert rc != 0 and not objects
    assert "maxAge" in err and "shorter than rotationTime" in err, err


def test_node_agents_stay_off_paused_nodes():
    """driver_upgrade/set_vfnum pause the agents with one node label; both DaemonSets must honour it."""
    rc, objects, err = render(HELM, {})
    assert rc == 0, err
    daemonsets = [o for o in objects if o["kind"] == "DaemonSet"]
    assert {d["metadata"]["name"] for d in daemonsets} >= {"metax-gpu-device", "metax-gpu-label"}
    for ds in daemonsets:
        terms = ds["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        # one term (the expressions are ANDed): the pause, then gpu-device's mode (docs/dra.md)
        assert len(terms) == 1
        assert terms[0]["matchExpressions"][0] == {"key": names.LABEL_AGENTS_PAUSED, "operator": "DoesNotExist"}
        extra = terms[0]["matchExpressions"][1:]
        assert extra == ([{"key": names.LABEL_DEVICE_MODE, "operator": "NotIn", "values": [names.DEVICE_MODE_DRA]}]
                         if ds["metadata"]["name"] == "metax-gpu-device" else [])


def test_gpu_aware_has_its_own_priority_class():
    """Every GPU pod's scheduling waits on gpu-aware: cluster-critical by default, "" for none; the
    node agents keep the global node-critical class."""
    def pods(values):
        rc, objects, err = render(HELM, values)
        assert rc == 0, err
        return {o["metadata"]["name"]: o["spec"]["template"]["spec"] for o in objects
                if o["kind"] in ("Deployment", "DaemonSet")}
    found = pods(VALUE_SETS["extender"])
    assert found["gpu-aware"]["priorityClassName"] == "system-cluster-critical"
    assert found["metax-gpu-device"]["priorityClassName"] == found["metax-gpu-label"]["priorityClassName"] == \
        "system-node-critical"
    unset = pods(dict(VALUE_SETS["extender"], gpuAware={"priorityClassName": ""}))
    assert "priorityClassName" not in unset["gpu-aware"]
    assert unset["metax-gpu-device"]["priorityClassName"] == "system-node-critical"


def test_the_daemonsets_carry_the_real_products_names_and_the_components_too():
    """MetaX operator 0.9.2's names (samples/kubernetes/operator-0.9.2-daemonsets.txt), in both schemes:
    the DaemonSet, its pods' app.kubernetes.io/name and its container; the operator's components the same."""
    from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator import components
    rc, objects, err = render(HELM, {"containerRuntime": {"enabled": True}, "gpuExporter": {"enabled": True}})
    assert rc == 0, err
    daemonsets = {o["metadata"]["name"]: o for o in objects if o["kind"] == "DaemonSet"}
    assert sorted(daemonsets) == ["metax-container-runtime", "metax-gpu-device", "metax-gpu-exporter",
                                  "metax-gpu-label"]
    for name, ds in daemonsets.items():
        assert ds["metadata"]["labels"]["app.kubernetes.io/name"] == name
        assert ds["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] == name
        assert ds["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] == name
        assert [c["name"] for c in ds["spec"]["template"]["spec"]["containers"]] == [name]
        assert components.BY_NAME[name].kind == "DaemonSet"
    assert {c.name for c in components.REGISTRY} >= set(daemonsets) | {"metax-driver", "metax-maca"}
    # the images keep the agents' names, as the real ClusterOperator's image.name shows
    images = {name: ds["spec"]["template"]["spec"]["containers"][0]["image"].rsplit("/", 1)[1].split(":")[0]
              for name, ds in daemonsets.items()}
    assert images == {"metax-container-runtime": "container-runtime", "metax-gpu-device": "gpu-device",
                      "metax-gpu-exporter": "gpu-exporter", "metax-gpu-label": "gpu-label"}
    # gpu-exporter's Service selects the renamed pods
    service = by_kind_name(objects)[("Service", "gpu-exporter")]
    assert service["spec"]["selector"]["app.kubernetes.io/name"] == "metax-gpu-exporter"


def test_the_runtime_class_metax_comes_with_container_runtime_only():
    rc, off, err = render(HELM, {})
    assert rc == 0, err
    assert not [o for o in off if o["kind"] == "RuntimeClass"]
    rc, on, err = render(HELM, {"containerRuntime": {"enabled": True}})
    assert rc == 0, err
    (runtime_class,) = [o for o in on if o["kind"] == "RuntimeClass"]
    assert runtime_class["apiVersion"] == "node.k8s.io/v1"
    assert runtime_class["metadata"]["name"] == names.RUNTIME_CLASS == "metax"
    assert runtime_class["handler"] == names.RUNTIME_HANDLER == "metax"
    assert "namespace" not in runtime_class["metadata"]          # cluster-scoped
    # no scheduling constraint and no overhead: a pod naming it is placed as without it
    assert set(runtime_class) == {"apiVersion", "kind", "metadata", "handler"}
    assert runtime_class["metadata"]["labels"]["app.kubernetes.io/name"] == "metax-container-runtime"


def test_the_health_policy_reaches_gpu_device_as_its_configmap():
    """gpuDevice.healthPolicy -> ConfigMap metax-gpu-health-policy (names.py) -> --health-policy, read by gpu-device."""
    policy = {"holdOffSeconds": 60, "rules": [{"signal": "pci-aer-ue", "threshold": 1, "severity": "critical",
                                               "action": "quarantine", "effect": "NoExecute"}]}
    rc, objects, err = render(HELM, dict(VALUE_SETS["extender"], gpuDevice={"healthyInterval": 5, "healthPolicy": policy}))
    assert rc == 0, err
    objs = by_kind_name(objects)
    config = objs[("ConfigMap", names.HEALTH_POLICY_CONFIGMAP)]
    assert json.loads(config["data"]["policy.json"]) == policy
    assert parse_policy(json.loads(config["data"]["policy.json"])).hold_off_seconds == 60
    pod = objs[("DaemonSet", names.DAEMONSET_GPU_DEVICE)]["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "health-policy")
    assert volume["configMap"] == {"name": names.HEALTH_POLICY_CONFIGMAP, "optional": True}
    args = pod["containers"][0]["args"]
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "health-policy")
    assert "--health-policy=%s/policy.json" % mount["mountPath"] in args
    # the schema refuses an informational quarantine before gpu-device sees it
    bad = {"rules": [{"signal": "pci-aer-ce", "rate": 1, "severity": "info", "action": "quarantine", "effect": "NoSchedule"}]}
    rc, objects, err = render(HELM, dict(VALUE_SETS["extender"], gpuDevice={"healthyInterval": 5, "healthPolicy": bad}))
    assert rc != 0 and "healthPolicy" in err


def test_gpu_exporter_reads_eids_as_the_health_policy_says():
    pattern = r'mxgpu (?P<bdf>\S+) err=(?P<eid>\d+) "x"'
    values = dict(VALUE_SETS["extender"], gpuExporter={"enabled": True},
                  gpuDevice={"healthyInterval": 5, "healthPolicy": {"eid": {"pattern": pattern,
                                                                            "logFiles": ["var/log/syslog"]}}})
    rc, objects, err = render(HELM, values)
    assert rc == 0, err
    args = by_kind_name(objects)[("DaemonSet", names.DAEMONSET_GPU_EXPORTER)]["spec"]["template"]["spec"][
        "containers"][0]["args"]
    assert "--eid-pattern=" + pattern in args and "--kernel-log=var/log/syslog" in args
    parsed = gpu_exporter.build_parser().parse_args([a for a in args if a.startswith(("--eid", "--kernel"))])
    assert parsed.eid_pattern == pattern and parsed.kernel_log == ["var/log/syslog"]
    rc, objects, err = render(HELM, dict(VALUE_SETS["extender"], gpuExporter={"enabled": True}))
    args = by_kind_name(objects)[("DaemonSet", names.DAEMONSET_GPU_EXPORTER)]["spec"]["template"]["spec"][
        "containers"][0]["args"]
    assert not [a for a in args if a.startswith(("--eid", "--kernel"))]      # the defaults, as gpu-device's
