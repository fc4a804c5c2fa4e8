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

from test_cdi_cluster import (MACA_VERSION, NodeAgents, a_pair_pod_sees_exactly_its_devices_and_maca,  # noqa: E402
                              mode_logged, node_spec, start_gpu_device_auto)
from test_gpu_device_cluster import NS, wait_registered  # noqa: E402

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
    try:
        start_gpu_device_auto(agents)
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
    log = mode_logged(agents)
    assert "Allocate mode devices" in log and "containerd://1.6." in log, log[-2000:]
    _pair, answer = a_pair_pod_sees_exactly_its_devices_and_maca(agents, "devices")
    # from the answer itself: device nodes and the mount, and no CDI name; and no spec on this node,
    # which nothing would read
    assert answer["cdi_devices"] == [] and len(answer["devices"]) == 2, answer
    assert node_spec(agents) is None
