# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""set_vfnum.yml on the local cluster (issue 16): the 2xC550-sriov node from vfnum 0 to 4 and back.

When the agents are not there already they are built (files/images/agent/build.sh)
and installed with metax.gpu.install, and uninstalled afterwards. The
SR-IOV node's capacity of metax-tech.com/gpu goes 2 -> 8 -> 2, its gpu.vfnum
label follows, the state label ends at success, and nothing is left paused;
a GPU pod makes the playbook refuse, or is evicted when asked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from playbook_output import recap
from polling import wait_until

from ansible_collections.metax.gpu.plugins.module_utils import names as N
from ansible_collections.metax.gpu.plugins.module_utils.host import HostRoot
from ansible_collections.metax.gpu.plugins.module_utils.vfnum import backend

pytestmark = pytest.mark.cluster

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
INVENTORY = os.path.join(ROOT, "docs", "examples", "local-cluster-inventory.yml")
SRIOV_PRESET = "2xC550-sriov"
POD = "vfnum-gpu-pod"


def _ansible_playbook(cluster, name, *extra, expect_ok=True):
    cmd = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", INVENTORY,
           "-e", "metax_gpu_kubeconfig=" + cluster.kubeconfig, "metax.gpu." + name] + list(extra)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=cluster.env, timeout=1800, check=False)
    if expect_ok:
        assert proc.returncode == 0, "%s failed:\n%s\n%s" % (name, proc.stdout[-6000:], proc.stderr[-3000:])
    return proc


TIMINGS = os.path.join(ROOT, "tests", "output", "set-vfnum-timings.txt")


def _set_vfnum(cluster, node, vfnum, *extra, expect_ok=True):
    start = time.monotonic()
    # polled every second (the role's default is 2 s), as test_driver_upgrade_cluster polls its waits:
    # the agents leave and the capacity follows within a second or two, and each of the role's two waits
    # lost up to a poll interval beyond that (five runs change vfnum here)
    proc = _ansible_playbook(cluster, "set_vfnum", "--limit", node,
                             "-e", json.dumps({"set_vfnum_vfnum": vfnum, "set_vfnum_delay": 1}), *extra,
                             expect_ok=expect_ok)
    os.makedirs(os.path.dirname(TIMINGS), exist_ok=True)
    with open(TIMINGS, "a") as handle:
        elapsed = time.monotonic() - start
        handle.write("set_vfnum %s vfnum=%d %s rc=%d %.1fs\n" % (node, vfnum, " ".join(extra), proc.returncode, elapsed))
    return proc


def _node(cluster, name):
    node = cluster.read_node(name, strict=True)
    assert node is not None, "no node %s" % name
    return node


def _capacity(node):
    return int((node["status"].get("capacity") or {}).get(N.RESOURCE_NAME, "-1"))


@pytest.fixture(scope="module")
def sriov_node(cluster, agent_images):
    """(node name, HostRoot) of the 2xC550-sriov node, with the agents running; restored afterwards."""
    matches = [n for n in cluster.nodes if n.get("preset") == SRIOV_PRESET]
    if not matches:
        pytest.fail("the local cluster has no %s node (NODES must include it)" % SRIOV_PRESET)
    name, host = matches[0]["name"], HostRoot(matches[0]["sim_root"])
    assert [p.numvfs for p in backend.read_pfs(host)] == [0, 0], "the test starts from vfnum 0"
    installed = cluster.kubectl("get", "daemonset", N.DAEMONSET_GPU_DEVICE, "-n", N.NAMESPACE).returncode == 0
    if not installed:
        # the session's agent images (conftest.py), then the chart of this checkout with metax.gpu.install
        repo, tag = agent_images["gpu-device"].rsplit(":", 1)
        _ansible_playbook(cluster, "install", "-e", json.dumps({
            "gpu_extensions_registry": repo.rsplit("/", 1)[0], "gpu_extensions_image_tag": tag}))
    wait_until(lambda: _capacity(_node(cluster, name)) == 2, 300, "capacity 2 on %s" % name)
    yield name, host
    cluster.kubectl("delete", "pod", POD, "-n", "default", "--ignore-not-found", "--wait=true")
    if any(p.numvfs for p in backend.read_pfs(host)):
        _set_vfnum(cluster, name, 0, expect_ok=False)
    cluster.kubectl("label", "node", name, N.LABEL_VFNUM_STATE + "-", N.LABEL_AGENTS_PAUSED + "-")
    cluster.kubectl("annotate", "node", name, N.ANNOTATION_VFNUM_MESSAGE + "-", N.ANNOTATION_MAINTENANCE_OWNER + "-",
                    N.ANNOTATION_MAINTENANCE_CORDON + "-")
    if not installed:
        _ansible_playbook(cluster, "uninstall", expect_ok=False)


def _state(node):
    labels = node["metadata"].get("labels") or {}
    return labels.get(N.LABEL_VFNUM_STATE), labels.get(N.LABEL_GPU_VFNUM), N.LABEL_AGENTS_PAUSED in labels


def test_zero_to_four_and_back_capacity_8_then_2(cluster, sriov_node):
    name, host = sriov_node
    _set_vfnum(cluster, name, 4)
    node = _node(cluster, name)
    assert _capacity(node) == 8
    assert _state(node) == ("success", "4", False)
    assert [p.numvfs for p in backend.read_pfs(host)] == [4, 4]

    rerun = _set_vfnum(cluster, name, 4)
    counts = recap(rerun.stdout)
    assert counts and all(c["changed"] == 0 for c in counts.values()), counts

    dry = _set_vfnum(cluster, name, 0, "--check")
    assert "vfnum 4 -> 0 on 2 GPU(s)" in dry.stdout
    assert [p.numvfs for p in backend.read_pfs(host)] == [4, 4]
    assert _capacity(_node(cluster, name)) == 8

    _set_vfnum(cluster, name, 0)
    node = _node(cluster, name)
    assert _capacity(node) == 2
    assert _state(node) == ("success", "0", False)
    assert [p.numvfs for p in backend.read_pfs(host)] == [0, 0]


def test_a_node_another_procedure_holds_is_refused_and_left_as_it_was(cluster, sriov_node):
    """The maintenance protocol (docs/maintenance.md): a hold of another owner refuses the change, named."""
    name, host = sriov_node
    cluster.kubectl("annotate", "node", name, N.ANNOTATION_MAINTENANCE_OWNER + "=" + N.MAINTENANCE_OWNER_HEALTH,
                    check=True)
    try:
        state_before = _state(_node(cluster, name))
        refused = _set_vfnum(cluster, name, 2, expect_ok=False)
        assert refused.returncode != 0 and "held by health's maintenance" in refused.stdout
        assert _state(_node(cluster, name)) == state_before
        assert [p.numvfs for p in backend.read_pfs(host)] == [0, 0]
    finally:
        cluster.kubectl("annotate", "node", name, N.ANNOTATION_MAINTENANCE_OWNER + "-", check=True)


def test_a_gpu_pod_blocks_the_change_unless_evicted(cluster, sriov_node, tmp_path):
    name, host = sriov_node
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": POD, "namespace": "default"},
           "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                    "nodeSelector": {"kubernetes.io/hostname": name},
                    "containers": [{"name": "c",
                                    "image": cluster.base_image.replace("localhost/", cluster.registry + "/"),
                                    "command": ["sleep", "600"],
                                    "resources": {"limits": {N.RESOURCE_NAME: "1"}}}]}}
    manifest = tmp_path / "pod.json"
    manifest.write_text(json.dumps(pod))
    cluster.kubectl("apply", "-f", str(manifest), check=True)
    wait_until(lambda: cluster.kubectl("get", "pod", POD, "-o", "jsonpath={.status.phase}").stdout == "Running",
               180, "the GPU pod to run on %s" % name)
    state_before = _state(_node(cluster, name))

    refused = _set_vfnum(cluster, name, 2, expect_ok=False)
    assert refused.returncode != 0
    assert "default/%s" % POD in refused.stdout and "refusing" in refused.stdout
    assert _state(_node(cluster, name)) == state_before      # refused before any label changed
    assert [p.numvfs for p in backend.read_pfs(host)] == [0, 0]
    assert cluster.kubectl("get", "pod", POD, "-o", "jsonpath={.status.phase}").stdout == "Running"

    _set_vfnum(cluster, name, 2, "-e", "set_vfnum_evict=true")
    assert cluster.kubectl("get", "pod", POD).returncode != 0, "the GPU pod was not evicted"
    node = _node(cluster, name)
    assert _capacity(node) == 4 and _state(node) == ("success", "2", False)

    _set_vfnum(cluster, name, 0)
    assert _capacity(_node(cluster, name)) == 2
