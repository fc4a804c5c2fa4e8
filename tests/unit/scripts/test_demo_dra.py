# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""`make demo DRA_NODES="vm"`: the variable reaches scripts/demo.sh, which switches the nodes with
metax.gpu.gpu_device_mode and enables the chart's gpu-dra, and the DRA pod it runs asks for the chart's
DeviceClass and the driver's MetaXLink attribute (names.py), not spellings of its own.
The demo itself runs on the local cluster (make demo)."""

from __future__ import annotations

import os
import re

import yaml

from ansible_collections.metax.gpu.plugins.module_utils import names as N

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")


def _read(*path):
    with open(os.path.join(REPO, *path), encoding="utf-8") as handle:
        return handle.read()


def test_the_makefile_passes_dra_nodes_to_the_demo():
    recipe = re.search(r"^demo:.*\n\t(.*)$", _read("Makefile"), re.M).group(1)
    assert recipe == '$(if $(DRA_NODES),DRA_NODES="$(DRA_NODES)") scripts/demo.sh'


def test_the_demo_switches_with_the_module_and_enables_gpu_dra():
    demo = _read("scripts", "demo.sh")
    assert "DRA_NODES=${DRA_NODES:-}" in demo
    assert "-m metax.gpu.gpu_device_mode" in demo and "mode=${mode} evict=true" in demo
    assert '"dra": {"enabled": true' in demo
    # the switch comes before the chart: gpu-device never starts on a node meant for DRA
    assert demo.index("gpu_device_mode") < demo.index("metax.gpu.site\n")


def test_the_dra_pod_claims_the_charts_class_with_the_metaxlink_constraint():
    template, pod = list(yaml.safe_load_all(_read("files", "demo", "dra-workload.yaml")))
    namespace = re.search(r"^NS=(\S+)$", _read("scripts", "demo.sh"), re.M).group(1)
    assert template["metadata"]["namespace"] == pod["metadata"]["namespace"] == namespace
    devices = template["spec"]["spec"]["devices"]
    assert devices["requests"][0]["exactly"] == {"deviceClassName": N.DRA_DEVICE_CLASS_GPU, "count": 2}
    assert devices["constraints"] == [{"requests": ["gpus"], "matchAttribute": N.DRA_DRIVER + "/metaxLinkGroup"}]
    assert pod["spec"]["resourceClaims"] == [{"name": "gpus", "resourceClaimTemplateName": template["metadata"]["name"]}]
    assert pod["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "@NODE@"}
