# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The fallback on a node whose runtime cannot read CDI: Debian's containerd 1.6 (issue 26).

The shared cluster's nodes all run containerd 2.4, so the module adds a node
of its own for its length (tests/localcluster/extra_node.py: the next node
of the plan, 4xN100, on Debian 12's containerd 1.6.20 with its version 2
config, not in the node table) and removes it afterwards. gpu-device runs
there as the chart deploys it (``--cdi-mode auto``, the node's
``/var/run/cdi`` mounted) and must choose the device-node fallback by itself
from the Node's ``containerd://1.6`` -- containerd 1.6 would ignore
``cdi_devices`` and start the container without a GPU. A pod asking for two
GPUs then sees what a pod sees through CDI on containerd 2.4
(test_cdi_cluster.py): exactly the allocator's pair, ``/dev/mxcd``, the
node's MXMACA read-only on /opt/maca, ``MACA_PATH`` and ``LD_LIBRARY_PATH``
-- here all from gpu-device's answer, which names no CDI device.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

pytestmark = pytest.mark.cluster

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from localcluster import extra_node  # noqa: E402
from localcluster.nodes import NodePaths  # noqa: E402
from localcluster.runtime import from_environ  # noqa: E402

from test_cdi_cluster import MACA_VERSION, NodeAgents, gpu_pod, node_spec, pod_report  # noqa: E402
from test_gpu_device_cluster import DEVICE_ARGS, NS, devices_annotation, wait_for, wait_registered  # noqa: E402
from test_gpu_device_cluster import agent_images  # noqa: E402,F401  pylint: disable=unused-import

from ansible_collections.metax.gpu.plugins.module_utils.gpu.allocator import allocate  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.gpu.discovery import discover  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.names import CDI_SPEC_DIR  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.sim.maca import install_maca  # noqa: E402

PRESET = "4xN100"


@pytest.fixture(scope="module")
def containerd16_node(cluster):
    """The temporary node on Debian's containerd 1.6, as a nodes.json record; removed afterwards."""
    rt = from_environ(dict(os.environ, METAX_LC_KUBE_BIN=cluster.info["METAX_KUBE_BIN"]))
    comp = extra_node.add(rt, PRESET)
    try:
        yield {"name": comp.node.name, "preset": comp.node.preset,
               "sim_root": NodePaths(rt.settings, comp.node).sim_dir}
    finally:
        extra_node.remove(rt, comp)


@pytest.fixture(scope="module")
def fallback_agent(cluster, agent_images, containerd16_node):  # noqa: F811
    agents = NodeAgents(cluster, agent_images, containerd16_node)
    install_maca(agents.sim(), MACA_VERSION)   # the node's root is new: it goes with the node
    volumes = {
        "device-plugins": ("/var/lib/kubelet/device-plugins", "/var/lib/kubelet/device-plugins"),
        "pod-resources": ("/var/lib/kubelet/pod-resources", "/var/lib/kubelet/pod-resources"),
        "sim": (agents.sim_parent, "/host-sim"),
        "cdi": (CDI_SPEC_DIR, CDI_SPEC_DIR),
    }
    args = DEVICE_ARGS + ["--host-prefix", agents.sim_root, "--cdi-mode", "auto", "--cdi-spec-dir", CDI_SPEC_DIR]
    try:
        agents.start("gpu-device", args, volumes)
        yield agents
    finally:
        # its pod goes here, not through the garbage collector (which once left it for over 60 s after the
        # DaemonSet was deleted); the node's removal then finds nothing of it
        cluster.kubectl("-n", NS, "delete", "daemonset", "gpu-device", "--ignore-not-found", "--cascade=orphan")
        cluster.kubectl("-n", NS, "delete", "pods", "-l", "app=gpu-device", "--ignore-not-found", "--wait=true",
                        "--timeout=60s")
        cluster.kubectl("delete", "clusterrolebinding,clusterrole", "%s-gpu-device" % NS, "--ignore-not-found")


def test_the_node_runs_containerd_1_6(cluster, containerd16_node):
    node = cluster.kubectl("get", "node", containerd16_node["name"], "-o",
                           "jsonpath={.status.nodeInfo.containerRuntimeVersion}")
    assert node.returncode == 0, node.stderr
    assert node.stdout.startswith("containerd://1.6."), node.stdout


def test_gpu_device_falls_back_to_device_nodes_and_the_pod_sees_the_same(fallback_agent):
    agents = fallback_agent
    wait_registered(agents)
    log = agents.logs("gpu-device")
    assert "Allocate mode devices" in log and "containerd://1.6." in log, log[-2000:]
    count = agents.gpus()
    wait_for(lambda: agents.gpu_resources() == (count, count), 60, "allocatable %d" % count)
    assert node_spec(agents) is None        # no CDI spec: nothing on this node would read it
    inv = discover(agents.sim())
    busy = {d["id"] for d in devices_annotation(agents) or [] if d["allocated"]}
    free = [d.index for d in inv.devices if d.healthy and d.id not in busy]
    pair = [inv.devices[i] for i in allocate(inv.topology, free, 2).devices]
    name = gpu_pod(agents, 2)
    try:
        report, env = pod_report(agents, name)
        assert report["dri"] == sorted([d.drm_card for d in pair] + [d.drm_render for d in pair]), report
        assert report["mxcd"] == "/dev/mxcd" and report["maca"] == "Version:" + MACA_VERSION, report
        assert report["mount"].split(",")[0] == "ro", report          # the host's MACA, read-only
        assert env["MACA_PATH"] == "/opt/maca"
        assert env["LD_LIBRARY_PATH"].startswith("/opt/maca/lib:/opt/maca/mxgpu_llvm/lib")
        assert env["METAX_VISIBLE_DEVICES"] == ",".join(d.id for d in pair)
        # from the answer itself: device nodes and the mount, and no CDI name
        answers = [json.loads(line) for line in agents.logs("gpu-device").splitlines()
                   if line.startswith("{") and '"Allocate: ' in line]
        assert answers and answers[-1]["mode"] == "devices" and answers[-1]["cdi_devices"] == [], answers[-1:]
        assert len(answers[-1]["devices"]) == 2, answers[-1:]
    finally:
        agents.api.delete_namespaced_pod(name, NS, grace_period_seconds=0)
