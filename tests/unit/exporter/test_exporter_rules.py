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
import shutil
import subprocess
import sys

import yaml

from ansible_collections.metax.gpu.plugins.module_utils.agents.gpu_exporter import Exporter
from ansible_collections.metax.gpu.plugins.module_utils.exporter.collect import NodeReader
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from exposition import samples  # noqa: E402

RULES = os.path.join(os.path.dirname(os.path.abspath(__file__)), *[".."] * 3,
                     "files", "charts", "metax-gpu-extensions", "files", "gpu-exporter-rules.yaml")


# promtool's expanding notation: "a+bxn"; a bare "0x10" would read as hex 16
def series_line(name, labels):
    return "%s{%s}" % (name, ",".join('%s="%s"' % (k, v) for k, v in sorted(labels.items())))


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
    text = Exporter(NodeReader(host, timeout=20.0), "gpu-node-1", 60.0, 30.0).exposition().decode()
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
    reader = NodeReader(host, timeout=20.0)
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
