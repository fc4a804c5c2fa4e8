# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The chart's alert rules fire on what gpu-exporter reports (``promtool test rules``).

The input series are gpu-exporter's own exposition of a simulated node with a
GPU marked failed, not hand-written samples: the rule and the metric it
watches cannot drift apart unnoticed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import yaml

from ansible_collections.metax.gpu.plugins.module_utils.agents.gpu_exporter import Exporter
from ansible_collections.metax.gpu.plugins.module_utils.exporter.collect import NodeReader
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator

from ansible_collections.metax.gpu.plugins.module_utils.sim import signals as sim_signals
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from exposition import samples  # noqa: E402

RULES = os.path.join(os.path.dirname(os.path.abspath(__file__)), *[".."] * 3,
                     "files", "charts", "metax-gpu-extensions", "files", "gpu-exporter-rules.yaml")


# promtool's expanding notation: "a+bxn"; a bare "0x10" would read as hex 16
def series_line(name, labels):
    return "%s{%s}" % (name, ",".join('%s="%s"' % (k, v) for k, v in sorted(labels.items())))


def annotations(alert, labels, value=None):
    """The rule's annotations as Prometheus expands them for these labels and value."""
    with open(RULES) as handle:
        rules = [r for g in yaml.safe_load(handle)["groups"] for r in g["rules"] if r.get("alert") == alert]

    def expand(text):
        text = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), "<no value>"), text)
        return text.replace("{{ $value }}", "%g" % value if value is not None else "")
    return {k: expand(v) for k, v in rules[0]["annotations"].items()}


def promtool_test(tmp_path, tests):
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: Debian's prometheus package (requirements/system.txt; scripts/deps.sh)"
    path = tmp_path / "tests.yaml"
    path.write_text(yaml.safe_dump({"rule_files": [os.path.abspath(RULES)], "evaluation_interval": "1m",
                                    "tests": tests}))
    proc = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, check=False,
                          timeout=120)
    return proc.returncode, proc.stdout + proc.stderr


def test_failed_gpu_fires_the_unhealthy_alert(make_node, tmp_path, monkeypatch):
    monkeypatch.setenv("METAX_SIM_TIME", "1790000000")
    host = make_node("4xN100")
    generator.fail_gpu(host, 2, "smi")
    text = Exporter(NodeReader(host, timeout=60.0), "gpu-node-1", 60.0, 30.0).exposition().decode()
    health = [(labels, value) for name, labels, value in samples(text) if name == "metax_gpu_healthy"]
    assert sorted(v for _l, v in health) == [0.0, 1.0, 1.0, 1.0]
    failed = [labels for labels, value in health if value == 0.0][0]
    assert failed["gpu"] == "2"
    inputs = [{"series": series_line("metax_gpu_healthy", labels), "values": "%d+0x10" % value}
              for labels, value in health]
    summary = "MetaX GPU 2 (%s) on gpu-node-1 is unhealthy" % failed["bdf"]
    tests = [{
        "interval": "1m",
        "input_series": inputs,
        "alert_rule_test": [
            # for: 1m -- pending, not firing, right after the failure
            {"eval_time": "30s", "alertname": "MetaxGpuUnhealthy", "exp_alerts": []},
            {"eval_time": "2m", "alertname": "MetaxGpuUnhealthy", "exp_alerts": [{
                # an empty label is no label to Prometheus: a GPU that mx-smi -L
                # prints "Not Available" has no UUID
                "exp_labels": {k: v for k, v in dict(failed, severity="critical").items() if v != ""},
                "exp_annotations": {
                    "summary": summary,
                    "description": "The driver or mx-smi reports the device unusable; the device plugin "
                                   "withdraws it from the kubelet. Check `mx-smi` and the driver on the node.",
                }}]},
        ],
    }]
    rc, output = promtool_test(tmp_path, tests)
    assert rc == 0, output


def test_healthy_node_fires_nothing_and_a_failing_mx_smi_does(make_node, tmp_path):
    host = make_node("1xC500")
    reader = NodeReader(host, timeout=60.0)
    ok = Exporter(reader, "gpu-node-1", 60.0, 30.0).exposition().decode()
    path = host.join(generator.MX_SMI_PATH)
    with open(path, "w") as handle:
        handle.write("#!/bin/sh\nexit 9\n")
    failing = Exporter(reader, "gpu-node-1", 60.0, 30.0).exposition().decode()

    def inputs(text):
        keep = ("metax_gpu_healthy", "metax_gpu_temperature_celsius", "metax_gpu_exporter_mx_smi_up")
        return [{"series": series_line(name, labels), "values": "%g+0x10" % value}
                for name, labels, value in samples(text) if name in keep]

    quiet = [{"eval_time": "10m", "alertname": name, "exp_alerts": []}
             for name in ("MetaxGpuUnhealthy", "MetaxGpuTemperatureHigh", "MetaxGpuMxSmiFailing")]
    firing = {"eval_time": "10m", "alertname": "MetaxGpuMxSmiFailing", "exp_alerts": [{
        "exp_labels": {"node": "gpu-node-1", "severity": "warning"},
        "exp_annotations": {"summary": "mx-smi fails on gpu-node-1",
                            "description": "gpu-exporter gets no answer it understands from mx-smi; GPU "
                                           "readings are missing. Its log names the failure."}}]}
    rc, output = promtool_test(tmp_path, [
        {"interval": "1m", "input_series": inputs(ok), "alert_rule_test": quiet},
        {"interval": "1m", "input_series": inputs(failing), "alert_rule_test": [firing]}])
    assert rc == 0, output


def test_health_alerts_fire_on_the_signals_gpu_exporter_reads(make_node, tmp_path, monkeypatch):
    """ECC, PCI events, RAS, MetaXLink AER and EIDs injected on a simulated node; a clean GPU fires nothing."""
    from ansible_collections.metax.gpu.plugins.module_utils.exporter.collect import ECC_EVERY_READINGS
    from ansible_collections.metax.gpu.plugins.module_utils.health.eid import EidTracker
    monkeypatch.setenv("METAX_SIM_TIME", "1790000000")
    host = make_node("8xC500")
    reader = NodeReader(host, timeout=60.0, eids=EidTracker(host.path))
    before = Exporter(reader, "gpu-node-1", 60.0, 30.0).exposition().decode()
    sim_signals.inject_signals(host, 1, ecc={"dram_uncorrectable": 1}, pci_events={"aer_ue": 2}, ras={"uncorrected": 3},
                               mxlk_aer={"0": {"ue": 1}})
    sim_signals.add_eid(host, 1, 1021)
    for _reading in range(ECC_EVERY_READINGS):
        reader.read()
    after = Exporter(reader, "gpu-node-1", 60.0, 30.0).exposition().decode()
    keep = ("mx_ecc_error_detail", "mx_pci_event", "mx_ras_count", "mx_mxlk_aer_count", "mx_driver_eid_errors",
            "mx_driver_eid_count")
    old = {(name, tuple(sorted(labels.items()))): value for name, labels, value in samples(before) if name in keep}
    inputs = []
    for name, labels, value in samples(after):
        if name in keep:
            # 5 minutes as before, then as after: the counters grew within the EID rule's 10 minutes
            first = old[(name, tuple(sorted(labels.items())))]
            inputs.append({"series": series_line(name, labels), "values": "%g+0x4 %g+0x10" % (first, value)})
    gpu1 = {"deviceId": "1", "Hostname": "gpu-node-1", "modelName": "MXC500"}

    def fired(alert, **extra):
        return {"eval_time": "6m", "alertname": alert, "exp_alerts": None, "_want": dict(gpu1, **extra)}

    wanted = [fired("MetaxGpuEccUncorrectable", memory="dram", type="ue", severity="critical"),
              fired("MetaxGpuPcieAerUncorrectable", type="aer_ue", severity="critical"),
              fired("MetaxGpuRasUncorrected", type="uncorrected", severity="critical"),
              fired("MetaxGpuMetaxLinkAerUncorrectable", mxlkId="0", type="ue", severity="warning"),
              fired("MetaxGpuDriverEid", severity="warning")]
    # the exact labels of each alert: the series' own (uuid, versions) plus the rule's
    labels_of = {name: labels for name, labels, _v in samples(after) if labels.get("deviceId") == "1"}
    values_of = {(name, tuple(sorted(labels.items()))): value for name, labels, value in samples(after)}
    tests = []
    for want in wanted:
        alert = want.pop("_want")
        source = {"MetaxGpuEccUncorrectable": "mx_ecc_error_detail", "MetaxGpuPcieAerUncorrectable": "mx_pci_event",
                  "MetaxGpuRasUncorrected": "mx_ras_count", "MetaxGpuMetaxLinkAerUncorrectable": "mx_mxlk_aer_count",
                  "MetaxGpuDriverEid": "mx_driver_eid_errors"}[want["alertname"]]
        base = {k: v for k, v in labels_of[source].items() if k not in ("memory", "type", "mxlkId")}
        exp_labels = dict(base, **{k: v for k, v in alert.items() if k not in base})
        value = values_of[(source, tuple(sorted((k, v) for k, v in exp_labels.items() if k != "severity")))]
        want["exp_alerts"] = [{"exp_labels": exp_labels,
                               "exp_annotations": annotations(want["alertname"], exp_labels, value)}]
        tests.append(want)
    # nothing before the injection
    quiet = [{"eval_time": "4m", "alertname": w["alertname"], "exp_alerts": []} for w in tests]
    assert tests[-1]["exp_alerts"][0]["exp_annotations"]["summary"] == "MetaX GPU 1 on gpu-node-1: driver error EID 1021"
    rc, output = promtool_test(tmp_path, [{"interval": "1m", "input_series": inputs, "alert_rule_test": quiet + tests}])
    assert rc == 0, output


def test_quarantine_condition_and_remediation_alerts_on_kube_state_metrics(tmp_path):
    """gpu-device's taint and condition as kube-state-metrics reports them (its series names and labels)."""
    taint = series_line("kube_node_spec_taint", {"node": "gpu-node-1", "key": "metax-tech.com/gpu-health",
                                                 "value": "true", "effect": "NoSchedule"})
    other = series_line("kube_node_spec_taint", {"node": "gpu-node-2", "key": "example.com/maintenance",
                                                 "value": "x", "effect": "NoSchedule"})
    condition = series_line("kube_node_status_condition", {"node": "gpu-node-1", "condition": "MetaXGPUHealthy",
                                                           "status": "false"})
    labels = {"node": "gpu-node-1", "key": "metax-tech.com/gpu-health", "value": "true", "effect": "NoSchedule"}
    rc, output = promtool_test(tmp_path, [{
        "interval": "1m",
        "input_series": [{"series": taint, "values": "1+0x90"}, {"series": other, "values": "1+0x90"},
                         {"series": condition, "values": "1+0x90"}],
        "alert_rule_test": [
            {"eval_time": "1m", "alertname": "MetaxGpuNodeQuarantined",
             "exp_alerts": [{"exp_labels": dict(labels, severity="critical"),
                             "exp_annotations": annotations("MetaxGpuNodeQuarantined", labels)}]},
            {"eval_time": "3m", "alertname": "MetaxGpuHealthConditionFailing", "exp_alerts": []},
            {"eval_time": "6m", "alertname": "MetaxGpuHealthConditionFailing", "exp_alerts": [{
                "exp_labels": {"node": "gpu-node-1", "condition": "MetaXGPUHealthy", "status": "false",
                               "severity": "warning"},
                "exp_annotations": annotations("MetaxGpuHealthConditionFailing", {"node": "gpu-node-1"})}]},
            {"eval_time": "30m", "alertname": "MetaxGpuRemediationNeeded", "exp_alerts": []},
            {"eval_time": "65m", "alertname": "MetaxGpuRemediationNeeded",
             "exp_alerts": [{"exp_labels": dict(labels, severity="critical"),
                             "exp_annotations": annotations("MetaxGpuRemediationNeeded", labels)}]},
        ]}])
    assert rc == 0, output


def test_remediation_ladder_alerts_on_kube_state_metrics(tmp_path):
    """driver-manager's MetaXGPURemediation condition (the remediation ladder, issue 42) as kube-state-metrics
    reports it: in progress after a minute, stuck after two hours; another node's False condition fires nothing."""
    climbing = series_line("kube_node_status_condition", {"node": "gpu-node-1", "condition": "MetaXGPURemediation",
                                                          "status": "true"})
    idle = series_line("kube_node_status_condition", {"node": "gpu-node-2", "condition": "MetaXGPURemediation",
                                                      "status": "false"})
    labels = {"node": "gpu-node-1", "condition": "MetaXGPURemediation", "status": "true"}
    rc, output = promtool_test(tmp_path, [{
        "interval": "1m",
        "input_series": [{"series": climbing, "values": "1+0x150"}, {"series": idle, "values": "1+0x150"}],
        "alert_rule_test": [
            {"eval_time": "0m", "alertname": "MetaxGpuRemediationInProgress", "exp_alerts": []},
            {"eval_time": "2m", "alertname": "MetaxGpuRemediationInProgress",
             "exp_alerts": [{"exp_labels": dict(labels, severity="warning"),
                             "exp_annotations": annotations("MetaxGpuRemediationInProgress", labels)}]},
            {"eval_time": "100m", "alertname": "MetaxGpuRemediationStuck", "exp_alerts": []},
            {"eval_time": "125m", "alertname": "MetaxGpuRemediationStuck",
             "exp_alerts": [{"exp_labels": dict(labels, severity="critical"),
                             "exp_annotations": annotations("MetaxGpuRemediationStuck", labels)}]},
        ]}])
    assert rc == 0, output
