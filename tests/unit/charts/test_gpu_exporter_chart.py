# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The Extensions chart's gpu-exporter option: DaemonSet, Service, ServiceMonitor and PrometheusRule
only where their CRDs exist, the Grafana dashboard (its queries checked by promtool), the alert rules."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
import yaml

from ansible_collections.metax.gpu.plugins.module_utils.agents import gpu_exporter
from ansible_collections.metax.gpu.plugins.module_utils import names

from .helm import CHART, find_helm, helm_required, render

HELM = find_helm()
pytestmark = helm_required(HELM)
MONITORING = ["monitoring.coreos.com/v1/ServiceMonitor", "monitoring.coreos.com/v1/PrometheusRule"]
ON = {"gpuExporter": {"enabled": True}}
RULES = CHART / "files" / "gpu-exporter-rules.yaml"
DASHBOARD = CHART / "files" / "gpu-exporter-dashboard.json"


def objects_by_kind_name(objects):
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def promtool():
    found = shutil.which("promtool")
    assert found, "promtool is missing: Debian's prometheus package (requirements/system.txt; scripts/deps.sh)"
    return found


def test_off_by_default():
    rc, objects, err = render(HELM, {}, api_versions=MONITORING)
    assert rc == 0, err
    assert not [o for o in objects if "gpu-exporter" in o["metadata"]["name"]]


def test_daemonset_and_service():
    rc, objects, err = render(HELM, {"gpuExporter": {"enabled": True, "port": 9555, "interval": 30}})
    assert rc == 0, err
    objs = objects_by_kind_name(objects)
    pod = objs[("DaemonSet", "metax-gpu-exporter")]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {names.LABEL_GPU_INSTALLED: "true"}
    container = pod["containers"][0]
    args = gpu_exporter.build_parser().parse_args(container["args"])
    assert (args.host_root, args.port, args.interval) == ("/host", 9555, 30.0)
    assert args.pod_resources_socket == "/var/lib/kubelet/pod-resources/kubelet.sock"
    ctx = container["securityContext"]
    assert ctx["capabilities"] == {"drop": ["ALL"]} and not ctx.get("privileged")
    assert ctx["allowPrivilegeEscalation"] is False and ctx["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/var/lib/kubelet/pod-resources"]["readOnly"] and mounts["/host"]["readOnly"]
    assert pod["automountServiceAccountToken"] is False
    assert not [o for o in objects if o["kind"] in ("ClusterRole", "Role") and "exporter" in o["metadata"]["name"]]
    service = objs[("Service", "gpu-exporter")]
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 9555, "targetPort": "metrics"}]
    pod_labels = objs[("DaemonSet", "metax-gpu-exporter")]["spec"]["template"]["metadata"]["labels"]
    assert all(pod_labels[k] == v for k, v in service["spec"]["selector"].items())
    # no Prometheus Operator: nothing of it rendered, the chart still installs
    assert ("ServiceMonitor", "gpu-exporter") not in objs and ("PrometheusRule", "gpu-exporter") not in objs


def test_service_monitor_and_rules_where_the_crds_exist():
    values = {"gpuExporter": {"enabled": True, "interval": 20,
                              "serviceMonitor": {"labels": {"release": "prometheus"}}}}
    rc, objects, err = render(HELM, values, api_versions=MONITORING)
    assert rc == 0, err
    objs = objects_by_kind_name(objects)
    monitor = objs[("ServiceMonitor", "gpu-exporter")]
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    service = objs[("Service", "gpu-exporter")]
    assert all(service["metadata"]["labels"][k] == v for k, v in monitor["spec"]["selector"]["matchLabels"].items())
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["interval"], endpoint["honorLabels"]) == ("metrics", "20s", True)
    with open(RULES) as handle:
        assert objs[("PrometheusRule", "gpu-exporter")]["spec"] == yaml.safe_load(handle)
    values["gpuExporter"]["serviceMonitor"]["enabled"] = False
    values["gpuExporter"]["prometheusRule"] = {"enabled": False}
    rc, objects, err = render(HELM, values, api_versions=MONITORING)
    assert rc == 0 and not [o for o in objects if o["kind"] in ("ServiceMonitor", "PrometheusRule")], err


def test_dashboard_configmap_for_grafanas_sidecar():
    rc, objects, err = render(HELM, ON)
    assert rc == 0, err
    configmap = objects_by_kind_name(objects)[("ConfigMap", "gpu-exporter-dashboard")]
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    (text,) = configmap["data"].values()
    dashboard = json.loads(text)
    with open(DASHBOARD) as handle:
        assert dashboard == json.load(handle)
    titles = [p["title"] for p in dashboard["panels"] if p["type"] == "row"]
    assert titles == ["Cluster overview", "Per node", "Per GPU", "Per pod", "Health"]
    rc, objects, err = render(HELM, {"gpuExporter": {"enabled": True, "dashboard": {"namespace": "monitoring"}}})
    assert objects_by_kind_name(objects)[("ConfigMap", "gpu-exporter-dashboard")]["metadata"]["namespace"] == \
        "monitoring"


def dashboard_queries():
    with open(DASHBOARD) as handle:
        dashboard = json.load(handle)
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def test_dashboard_queries_are_promql(tmp_path):
    """promtool parses every panel's query (as a recording rule, $node replaced as Grafana does)."""
    queries = dashboard_queries()
    assert len(queries) >= 12
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": "dashboard:query_%d" % i, "expr": q.replace("$node", ".*")} for i, q in enumerate(queries)]}]}
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    proc = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    from ansible_collections.metax.gpu.plugins.module_utils.exporter.render import DEVICE_METRICS, EXPORTER_METRICS
    known = {m.name for m in DEVICE_METRICS + EXPORTER_METRICS}
    used = {word for q in queries for word in re.findall(r"metax_[a-z_]+", q)}
    assert used <= known, used - known


def test_alert_rules_check():
    proc = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, check=False)
    # 5 of the exporter, 8 of GPU health (docs/health.md), 2 of its remediation ladder
    assert proc.returncode == 0 and "SUCCESS: 15 rules found" in proc.stdout, proc.stdout + proc.stderr


def test_chart_lints_with_the_exporter():
    proc = subprocess.run([HELM, "lint", "--strict", str(CHART), "--set", "gpuExporter.enabled=true"],
                          capture_output=True, text=True, check=False, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("pair,path", [("gpuExporter.port=0", "/gpuExporter/port"),
                                       ("gpuExporter.interval=fast", "/gpuExporter/interval"),
                                       ("gpuExporter.colour=red", "gpuExporter")])
def test_bad_values_are_refused(pair, path):
    rc, _objects, err = render(HELM, {}, sets=[pair])
    assert rc != 0 and path in err, err
