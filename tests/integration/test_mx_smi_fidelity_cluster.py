# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Issue 17 on the local cluster: gpu-device as a pod reads the real mx-smi layouts, and an mx-smi
whose output it does not understand leaves the devices advertised (from PCI) and Healthy, with the
problem in its log and its metrics.

The node's simulated root gets this checkout's mx-smi (real layouts) for the test and its own
mx-smi back afterwards, whatever happens.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time

import pytest

pytestmark = pytest.mark.cluster

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from test_gpu_device_cluster import HEALTHY_INTERVAL, device_agent, metrics, wait_for, wait_registered  # noqa: E402,F401  pylint: disable=unused-import

from ansible_collections.metax.gpu.plugins.module_utils.sim import generator  # noqa: E402

HERE_MX_SMI = os.path.join(os.path.dirname(os.path.abspath(generator.__file__)), "mx_smi.py")
GARBAGE = "#!/bin/sh\necho 'mx-smi 9.9: a layout nobody has seen'\necho '| GPU | Where |'\n"


@pytest.fixture
def node_mx_smi(device_agent, tmp_path):  # noqa: F811
    """The path of the node's mx-smi; its original content is put back after the test."""
    path = device_agent.sim().join(generator.MX_SMI_PATH)
    saved = str(tmp_path / "mx-smi")
    shutil.copy2(path, saved)
    try:
        yield path
    finally:
        with open(saved) as handle:
            _write(path, handle.read())


def _write(path, text):
    tmp = os.path.join(os.path.dirname(path), ".mx-smi.tmp")
    with open(tmp, "w") as handle:
        handle.write(text)
    os.chmod(tmp, 0o755)
    os.replace(tmp, path)


def _healthy_devices(agents):
    text = agents.annotations().get("metax-tech.com/gpu.devices")
    devices = json.loads(text) if text else []
    return [d["id"] for d in devices if d.get("health") == "Healthy"]


def test_real_layout_then_garbage_keeps_devices_served(device_agent, node_mx_smi):  # noqa: F811
    with open(HERE_MX_SMI) as handle:
        _write(node_mx_smi, "#!/usr/bin/env python3\n" + handle.read())
    device_agent.restart("gpu-device")
    # the annotations outlive the old pod: wait for the new one to serve before reading its metrics
    wait_registered(device_agent)
    wait_for(lambda: len(_healthy_devices(device_agent)) == 8, 90, "8 healthy devices with the real layout")
    wait_for(lambda: metrics(device_agent).get("metax_gpu_mx_smi_unparsed") == 0.0, 30,
             "no mx-smi output left unparsed with the real layout")

    _write(node_mx_smi, GARBAGE)
    time.sleep(3 * HEALTHY_INTERVAL)
    wait_for(lambda: metrics(device_agent).get("metax_gpu_mx_smi_unparsed", 0) >= 1, 30,
             "the unparsed mx-smi output counted")
    assert len(_healthy_devices(device_agent)) == 8
    assert metrics(device_agent)["metax_gpu_devices_healthy"] == 8.0
    # the agent logs JSON lines; the warning about mx-smi output carries mx_smi_unparsed: true
    entries = [json.loads(line) for line in device_agent.logs("gpu-device").splitlines() if line.startswith("{")]
    unparsed = [e for e in entries if e.get("mx_smi_unparsed") and e.get("level") == "warning"]
    assert unparsed, entries[-10:]
    assert "a layout nobody has seen" in unparsed[-1]["msg"]
