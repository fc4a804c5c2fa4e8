# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Role gpu_extensions: its variables map 1:1 onto values the chart's schema accepts.

Runs the role's tasks/values.yml with ansible-playbook (no cluster needed),
writes the computed values, and renders the chart with them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from ansible_collections.metax.gpu.plugins.module_utils.agents import gpu_aware, gpu_device

from .helm import find_helm, helm_required, render

HELM = find_helm()
pytestmark = helm_required(HELM)

PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - ansible.builtin.include_role:
        name: metax.gpu.gpu_extensions
        tasks_from: values
    - ansible.builtin.copy:
        content: "{{ gpu_extensions_values | to_json }}"
        dest: "%s"
"""


def role_values(tmp_path, extra):
    out = tmp_path / "values.json"
    play = tmp_path / "play.yml"
    play.write_text(PLAY % out)
    cmd = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,", "-c", "local",
           "-e", "ansible_python_interpreter=" + sys.executable, "-e", json.dumps(extra), str(play)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(out.read_text())


def test_defaults_are_accepted_and_equal_the_charts(tmp_path):
    values = role_values(tmp_path, {})
    rc, objects, err = render(HELM, values)
    assert rc == 0, err
    assert values["log"] == {"dir": "/var/log/metax", "level": "info", "format": "json",
                             "rotationTime": "1w", "maxAge": "26w"}
    assert values["gpuDevice"]["healthyInterval"] == 5 and values["deployExtenderGPUAware"] is False
    assert objects


def test_every_role_variable_reaches_its_agent(tmp_path):
    extra = {"gpu_extensions_registry": "reg.example:5000/proj", "gpu_extensions_pull_policy": "Always",
             "gpu_extensions_deploy_extender_gpu_aware": True, "gpu_extensions_log_level": "debug",
             "gpu_extensions_log_format": "text", "gpu_extensions_log_dir": "",
             "gpu_extensions_log_rotation_time": "1d", "gpu_extensions_log_max_age": "2w",
             "gpu_extensions_gpu_device_healthy_interval": 0, "gpu_extensions_gpu_device_log": {"level": "error"},
             "gpu_extensions_gpu_aware_score_weight": "3", "gpu_extensions_gpu_aware_loss_weight": "0.5",
             "gpu_extensions_gpu_aware_log": {"format": "json"}}
    rc, objects, err = render(HELM, role_values(tmp_path, extra))
    assert rc == 0, err
    pods = {o["metadata"]["name"]: o["spec"]["template"]["spec"] for o in objects
            if o["kind"] in ("DaemonSet", "Deployment")}
    device = pods["metax-gpu-device"]["containers"][0]
    aware = pods["gpu-aware"]["containers"][0]
    dev = gpu_device.build_parser().parse_args(device["args"])
    awa = gpu_aware.build_parser().parse_args(aware["args"])
    assert (dev.healthy_interval, dev.log_level, dev.log_format, dev.log_dir) == (0, "error", "text", "")
    assert (awa.score_weight, awa.loss_weight, awa.log_format, awa.log_level) == ("3", "0.5", "json", "debug")
    assert device["image"].startswith("reg.example:5000/proj/gpu-device:") and device["imagePullPolicy"] == "Always"


def test_a_bad_role_variable_is_refused_by_the_schema(tmp_path):
    rc, _objects, err = render(HELM, role_values(tmp_path, {"gpu_extensions_log_level": "loud"}))
    assert rc != 0 and "/log/level" in err
