# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""scripts/demo_metrics.py (make demo's Prometheus): its configuration passes promtool; it ends only its own process.

The demo itself (scripts/demo.sh on the local cluster) is where it scrapes;
here: the file_sd targets name every exporter pod by its ``metrics`` port,
Debian's ``promtool check config`` accepts the configuration with the chart's
rule file, and a stale PID file never makes it kill another program.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
_spec = importlib.util.spec_from_file_location("demo_metrics", os.path.join(REPO, "scripts", "demo_metrics.py"))
demo_metrics = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(demo_metrics)

PODS = [{"metadata": {"name": "gpu-exporter-%s" % n, "namespace": "metax-gpu"},
         "spec": {"nodeName": node, "containers": [{"name": "gpu-exporter",
                                                    "ports": [{"name": "metrics", "containerPort": 9401}]}]},
         "status": {"phase": "Running", "podIP": ip}}
        for n, node, ip in (("a", "vm", "10.244.0.4"), ("b", "vm-2", "10.244.1.5"))]


def test_targets_are_the_pods_metrics_ports_with_their_nodes():
    assert demo_metrics.targets(PODS) == [
        {"targets": ["10.244.0.4:9401"], "labels": {"instance": "vm"}},
        {"targets": ["10.244.1.5:9401"], "labels": {"instance": "vm-2"}}]


def test_promtool_accepts_the_configuration(tmp_path):
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: Debian's prometheus package (requirements/system.txt)"
    targets = tmp_path / "targets.json"
    targets.write_text(json.dumps(demo_metrics.targets(PODS)))
    config = tmp_path / "prometheus.yml"
    config.write_text(json.dumps(demo_metrics.config(str(targets))))
    res = subprocess.run([promtool, "check", "config", str(config)], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS: 1 rule files found" in res.stdout + res.stderr


@pytest.fixture
def sleeper(tmp_path, monkeypatch):
    monkeypatch.setenv("METAX_CLUSTER_DIR", str(tmp_path))
    proc = subprocess.Popen(["sleep", "600"])     # far longer than any wait below: only a kill ends it
    yield proc
    proc.kill()
    proc.wait()


def _record(proc, exe):
    pids, pid_file, exe_file = demo_metrics._pid_files()  # pylint: disable=protected-access
    os.makedirs(pids, exist_ok=True)
    with open(pid_file, "w") as handle:
        handle.write("%d\n" % proc.pid)
    with open(exe_file, "w") as handle:
        handle.write(exe + "\n")
    return pid_file


def test_a_stale_pid_file_kills_nothing(sleeper):
    pid_file = _record(sleeper, sys.executable)      # the PID now runs sleep, not what was recorded
    demo_metrics.stop_previous()
    assert sleeper.poll() is None
    assert not os.path.exists(pid_file)


def test_its_own_previous_prometheus_is_stopped(sleeper):
    _record(sleeper, os.path.realpath(shutil.which("sleep")))
    demo_metrics.stop_previous()
    assert sleeper.wait(60) is not None
