# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""GPUs for virtual machines on the local three-node cluster (issue 43), with the real kubelet.

One helm install of files/charts/metax-operator with ``vfioManager.deploy: true`` (the chain's
driver, MACA and container-runtime off), shared by the module's tests, in order:

- first, vm-2 turned into a node without IOMMU: the ``IOMMUDisabled`` Event and the CR's condition
  naming it; its entry stays while the tests below run on vm and vm-3, and after them (2 minutes
  on) ``vfio-gpu`` is 0, its vfio-manager never restarted and gpu-device is unaffected;
- driver-config's ``vfio`` entry hands GPUs 6 and 7 of vm (8xC500) to VMs: ``metax-tech.com/gpu``
  drops to 6 and ``metax-tech.com/vfio-gpu`` rises to 2; a pod asking ``vfio-gpu: 1`` sees
  ``/dev/vfio/<group>`` and KubeVirt's variable with its PCI address; removing the entry restores
  8/0 and leaves no binding, override or record behind;
- a GPU held by a pod is refused (the node's message, the component Degraded) and nothing changes;
  the pod gone, the hand-over goes through;
- vm-3 (2xC550-sriov at vfnum 4): handing one PF over takes its VFs away first, handing it back
  restores vfnum 4;
- the module ``metax.gpu.gpu_passthrough`` (vfio-manager switched off: one front end per node) with
  check mode and diff, then for real, then back.

The nodes' roots are recreated from their presets where they predate the simulator's IOMMU groups,
put back as found, the operator uninstalled, and a GPU Extensions release found at the start
installed again.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time

import pytest
from polling import wait_until
from test_operator_cluster import (  # noqa: F401  # pylint: disable=unused-import  # fixtures shared with the operator's module
    CHART, NS, UNINSTALL_SCRIPT, cr, get_json, helm, no_extensions, nodes, patch_cr, strip_ours)

from ansible_collections.metax.gpu.plugins.module_utils import names as N
from ansible_collections.metax.gpu.plugins.module_utils.deviceplugin.vfio import kubevirt_env_var
from ansible_collections.metax.gpu.plugins.module_utils.host import HostRoot
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator
from ansible_collections.metax.gpu.plugins.module_utils.sim.spec import preset
from ansible_collections.metax.gpu.plugins.module_utils.vfio import backend
from ansible_collections.metax.gpu.plugins.module_utils.vfio.sysfs import NO_OVERRIDE

pytestmark = pytest.mark.cluster

SIM_PARENT = "/var/lib/metax-sim"
PRESETS = {"vm": "8xC500", "vm-2": "4xN100", "vm-3": "2xC550-sriov"}
VM_POD = "vfio-gpu-pod"
HOLDER_POD = "vfio-holder-pod"


def host(name):
    return HostRoot(os.path.join(SIM_PARENT, name))


def allocatable(cluster, name, resource):
    node = cluster.read_node(name) or {}
    return int((node.get("status") or {}).get("allocatable", {}).get(resource, "0"))


def counts(cluster, name):
    return allocatable(cluster, name, N.RESOURCE_NAME), allocatable(cluster, name, N.VFIO_RESOURCE_NAME)


def annotations(cluster, name):
    node = cluster.read_node(name) or {}
    return node.get("metadata", {}).get("annotations") or {}


# driver-config's entries that stay while other tests change theirs: the IOMMU-less vm-2's, from the
# first test to the one that checks, two minutes on, that its vfio-manager never restarted
STANDING = {"text": ""}
IOMMU_WATCH = {}
IOMMU_LESS = "- nodeName: vm-2\n  gpus: all\n"
VM2_GPUS = 4                       # the 4xN100 preset's
NO_RESTART_SECONDS = 120


def set_vfio(cluster, text):
    """driver-config's vfio key: ``text`` and the standing entries ("" removes the test's own); the
    ConfigMap is created when absent (the driver component, which creates it, is off here)."""
    text = text + STANDING["text"]
    found = get_json(cluster, "configmap", N.DRIVER_CONFIGMAP, "-n", NS)
    if found is None:
        cluster.kubectl("create", "configmap", N.DRIVER_CONFIGMAP, "-n", NS,
                        "--from-literal=%s=%s" % (N.DRIVER_CONFIG_VFIO_KEY, text), check=True)
        return
    cluster.kubectl("patch", "configmap", N.DRIVER_CONFIGMAP, "-n", NS, "--type=merge",
                    "-p", json.dumps({"data": {N.DRIVER_CONFIG_VFIO_KEY: text}}), check=True)


def settled_on_host(name):
    """Every GPU of the node back with the MetaX driver: no override, no record."""
    node = backend.read_node(host(name))
    return all(g.driver == "metax" and g.override == NO_OVERRIDE for g in node.gpus) and \
        not host(name).exists(backend.RECORD)


def vfio_pods(cluster):
    out = json.loads(cluster.kubectl("get", "pods", "-n", NS, "-l", "app.kubernetes.io/name=" + N.DAEMONSET_VFIO_MANAGER,
                                     "-o", "json", check=True).stdout)["items"]
    return {p["spec"].get("nodeName"): p for p in out if not p["metadata"].get("deletionTimestamp")}


def diagnose(cluster):
    out = [cluster.kubectl("get", "pods", "-n", NS, "-o", "wide").stdout]
    for node_name, pod in vfio_pods(cluster).items():
        out.append("--- %s on %s" % (pod["metadata"]["name"], node_name))
        out.append(cluster.kubectl("logs", "-n", NS, pod["metadata"]["name"], "--tail=30").stdout[-4000:])
    for name in PRESETS:
        out.append("%s: gpu/vfio-gpu %s, %s" % (name, counts(cluster, name), {
            k: v for k, v in annotations(cluster, name).items() if k.startswith(N.PREFIX + "vfio")}))
    out.append(json.dumps((cr(cluster) or {}).get("status", {}).get("conditions"))[:3000])
    return "\n".join(out)


def wait(cluster, predicate, timeout, what):
    return wait_until(predicate, timeout, what, diagnose=[lambda: diagnose(cluster)])


def pod_manifest(cluster, name, node, resource, count, tmp_path):
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
           "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "containers": [{"name": "c",
                                    "image": cluster.base_image.replace("localhost/", cluster.registry + "/"),
                                    "command": ["sleep", "600"],
                                    "resources": {"limits": {resource: str(count)}}}]}}
    path = tmp_path / (name + ".json")
    path.write_text(json.dumps(pod))
    cluster.kubectl("apply", "-f", str(path), check=True)
    wait_until(lambda: cluster.kubectl("get", "pod", name, "-o", "jsonpath={.status.phase}").stdout == "Running",
               180, "pod %s to run on %s" % (name, node))


@pytest.fixture(scope="module")
def roots(cluster):
    """Every node's root with the simulator's IOMMU groups (recreated from its preset when it predates them)."""
    names = sorted(n["name"] for n in cluster.nodes)
    if names != sorted(PRESETS):
        pytest.fail("needs the three-node cluster %s (have %s)" % (sorted(PRESETS), names))
    for name, preset_name in PRESETS.items():
        if not host(name).isdir("sys/kernel/iommu_groups") or not host(name).isdir("sys/bus/pci/drivers/vfio-pci"):
            generator.create(host(name).path, preset(preset_name), force=True)
    yield
    for name, preset_name in PRESETS.items():
        root = host(name)
        if not settled_on_host(name) or not backend.read_node(root).iommu or any(
                g.numvfs for g in backend.read_node(root).gpus):
            generator.create(root.path, preset(preset_name), force=True)


@pytest.fixture(scope="module")
def installed(cluster, images, no_extensions, roots):
    strip_ours(cluster)
    try:
        res = helm(cluster, "install", CHART, "--create-namespace", "-n", NS, "--generate-name", "--wait",
                   "--set", "registry=" + images["registry"], "--set-string", "imageTag=" + images["tag"],
                   "--set", "hostRoot.path=" + SIM_PARENT, "--set", "hostRoot.subPathExpr=$(NODE_NAME)",
                   "--set", "log.dir=", "--set", "gpuDevice.healthyInterval=2", "--set", "nodeAgentPolicy.enabled=true",
                   "--set", "vfioManager.deploy=true",
                   "--set", "runtime.deploy=false", "--set", "driver.deploy=false", "--set", "maca.deploy=false")
        assert res.returncode == 0, "helm install failed:\n%s\n%s" % (res.stdout, res.stderr)
        wait(cluster, lambda: len(vfio_pods(cluster)) == 3 and all(
            any(c["type"] == "Ready" and c["status"] == "True" for c in (p.get("status") or {}).get("conditions") or [])
            for p in vfio_pods(cluster).values()), 300, "vfio-manager Ready on the three nodes")
        wait(cluster, lambda: counts(cluster, "vm") == (8, 0), 120, "vm at 8 GPUs, 0 vfio-gpu")
        yield
    finally:
        for pod in (VM_POD, HOLDER_POD):
            cluster.kubectl("delete", "pod", pod, "-n", "default", "--ignore-not-found", "--wait=true")
        STANDING["text"] = ""
        set_vfio(cluster, "")
        wait_until(lambda: all(settled_on_host(n) for n in PRESETS), 120, "every GPU back with the MetaX driver")
        subprocess.run(["bash", "-c", UNINSTALL_SCRIPT], env=cluster.env, capture_output=True, timeout=600,
                       check=False)
        cluster.kubectl("delete", "namespace", NS, "--wait=true", "--timeout=120s")


def test_a_node_without_iommu_says_so(cluster, installed):
    """The first half: vm-2 without IOMMU, its Event and the CR's condition. Its vfio-manager is then
    left to run under its standing entry while the next tests use vm and vm-3; the second half checks,
    two minutes on, that it never restarted (the two minutes are the other tests', not a sleep)."""
    # gpu-device serving vm-2's GPUs first: the module's first test may come before its registration
    wait(cluster, lambda: counts(cluster, "vm-2") == (VM2_GPUS, 0), 120, "vm-2 at its GPUs, 0 vfio-gpu")
    generator.create(host("vm-2").path, dataclasses.replace(preset("4xN100"), iommu=False), force=True)
    STANDING["text"] = IOMMU_LESS
    set_vfio(cluster, "")
    wait(cluster, lambda: annotations(cluster, "vm-2").get(N.ANNOTATION_VFIO_IOMMU) == "disabled", 120,
         "vm-2 marked without IOMMU")
    events = json.loads(cluster.kubectl("get", "events", "-n", NS, "-o", "json", check=True).stdout)["items"]
    assert any(e["reason"] == "IOMMUDisabled" and e["message"] == "IOMMU support is missing on node vm-2. "
               "Please ensure that IOMMU is enabled on the node" for e in events)

    def condition():
        return next((c for c in (cr(cluster) or {}).get("status", {}).get("conditions", [])
                     if c["type"] == "IOMMUDisabled"), {})
    wait(cluster, lambda: condition().get("status") == "True" and "vm-2" in condition().get("message", ""),
         120, "the CR's IOMMUDisabled condition naming vm-2")
    IOMMU_WATCH.update(pod=vfio_pods(cluster)["vm-2"], since=time.monotonic())


def test_gpus_6_and_7_to_vms_and_back(cluster, installed, tmp_path):
    set_vfio(cluster, "- nodeName: vm\n  gpus: \"6,7\"\n")
    wait(cluster, lambda: counts(cluster, "vm") == (6, 2), 120, "vm at 6 GPUs and 2 vfio-gpu")
    node = backend.read_node(host("vm"))
    assert [g.driver for g in node.gpus] == ["metax"] * 6 + ["vfio-pci"] * 2
    groups = {str(g.iommu_group): g.bdf for g in node.gpus[6:]}
    # the topology annotations follow: six devices
    wait(cluster, lambda: sorted(d["bdf"] for d in json.loads(annotations(cluster, "vm").get(N.ANNOTATION_DEVICES, "[]")))
         == sorted(g.bdf for g in node.gpus[:6]), 60, "gpu.devices naming the six GPUs left")

    pod_manifest(cluster, VM_POD, "vm", N.VFIO_RESOURCE_NAME, 1, tmp_path)
    listing = cluster.kubectl("exec", VM_POD, "--", "ls", "/dev/vfio", check=True).stdout.split()
    env = dict(line.split("=", 1) for line in cluster.kubectl("exec", VM_POD, "--", "env", check=True).stdout.splitlines()
               if "=" in line)
    group = next(g for g in listing if g in groups)
    assert "vfio" in listing and env[kubevirt_env_var()] == groups[group]
    assert kubevirt_env_var() == "PCI_RESOURCE_METAX-TECH_COM_VFIO-GPU"
    cluster.kubectl("delete", "pod", VM_POD, "-n", "default", "--wait=true", check=True)

    set_vfio(cluster, "")
    wait(cluster, lambda: counts(cluster, "vm") == (8, 0), 120, "vm back at 8 GPUs and 0 vfio-gpu")
    assert settled_on_host("vm")
    assert N.ANNOTATION_VFIO_MESSAGE not in annotations(cluster, "vm")


def test_a_gpu_held_by_a_pod_is_refused_and_nothing_changes(cluster, installed, tmp_path):
    pod_manifest(cluster, HOLDER_POD, "vm", N.RESOURCE_NAME, 8, tmp_path)
    set_vfio(cluster, "- nodeName: vm\n  gpus: \"7\"\n")
    wait(cluster, lambda: "default/%s" % HOLDER_POD in annotations(cluster, "vm").get(N.ANNOTATION_VFIO_MESSAGE, ""),
         120, "vm's refusal naming the pod")
    assert settled_on_host("vm") and counts(cluster, "vm") == (8, 0)

    def degraded():
        entry = next((c for c in (cr(cluster) or {}).get("status", {}).get("components", [])
                      if c["name"] == N.DAEMONSET_VFIO_MANAGER), {})
        # "vm: ..." naming the holder: vm-2's standing entry is in the config too
        return any(c["type"] == "Degraded" and c["status"] == "True" and "vm: " in c["message"]
                   and HOLDER_POD in c["message"] for c in entry.get("conditions", []))
    wait(cluster, degraded, 120, "metax-vfio-manager Degraded naming vm")
    cluster.kubectl("delete", "pod", HOLDER_POD, "-n", "default", "--wait=true", check=True)
    # the round's backoff (10 s doubling) retries it
    wait(cluster, lambda: counts(cluster, "vm") == (7, 1), 300, "vm at 7 GPUs and 1 vfio-gpu once the pod is gone")
    set_vfio(cluster, "")
    wait(cluster, lambda: counts(cluster, "vm") == (8, 0) and settled_on_host("vm"), 120, "vm back at 8/0")


def test_a_pf_with_vfs_loses_them_first_and_gets_vfnum_4_back(cluster, installed):
    root = host("vm-3")
    for gpu in backend.read_node(root).gpus:
        root.write_attribute("sys/bus/pci/devices/%s/sriov_numvfs" % gpu.bdf, "4")
    wait(cluster, lambda: counts(cluster, "vm-3") == (8, 0), 120, "vm-3 at vfnum 4: 8 devices")
    set_vfio(cluster, "- nodeName: vm-3\n  gpus: \"0\"\n")
    wait(cluster, lambda: counts(cluster, "vm-3") == (4, 1), 120, "vm-3: PF 0 to VMs, its VFs gone")
    assert [(g.driver, g.numvfs) for g in backend.read_node(root).gpus] == [("vfio-pci", 0), ("metax", 4)]
    set_vfio(cluster, "")
    wait(cluster, lambda: counts(cluster, "vm-3") == (8, 0), 120, "vm-3 back at vfnum 4")
    assert [g.numvfs for g in backend.read_node(root).gpus] == [4, 4] and settled_on_host("vm-3")
    for gpu in backend.read_node(root).gpus:
        root.write_attribute("sys/bus/pci/devices/%s/sriov_numvfs" % gpu.bdf, "0")


def test_the_node_without_iommu_carried_on_for_two_minutes(cluster, installed):
    if not IOMMU_WATCH:
        pytest.fail("test_a_node_without_iommu_says_so did not get as far as vm-2's vfio-manager")
    try:
        time.sleep(max(0.0, IOMMU_WATCH["since"] + NO_RESTART_SECONDS - time.monotonic()))
        pod = IOMMU_WATCH["pod"]
        pod_now = get_json(cluster, "pod", pod["metadata"]["name"], "-n", NS)
        assert pod_now is not None and pod_now["metadata"]["uid"] == pod["metadata"]["uid"]
        assert all(s.get("restartCount", 0) == 0 for s in pod_now["status"].get("containerStatuses", []))
        assert counts(cluster, "vm-2") == (VM2_GPUS, 0)            # gpu-device unaffected
        assert settled_on_host("vm-2")
    finally:
        STANDING["text"] = ""
        set_vfio(cluster, "")
        generator.create(host("vm-2").path, preset("4xN100"), force=True)
    wait(cluster, lambda: annotations(cluster, "vm-2").get(N.ANNOTATION_VFIO_IOMMU) == "enabled", 120,
         "vm-2 with IOMMU again")


def _module(cluster, args, *flags):
    cmd = [os.path.join(os.path.dirname(sys.executable), "ansible"), "localhost", "-m", "metax.gpu.gpu_passthrough",
           "-a", json.dumps(args)] + list(flags)
    env = dict(cluster.env, ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="json")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    result = json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]
    return proc.returncode, result


def test_the_module_with_check_mode_and_diff(cluster, installed):
    assert patch_cr(cluster, {"vfioManager": {"deploy": False}}).returncode == 0
    wait(cluster, lambda: not vfio_pods(cluster), 120, "vfio-manager gone (one front end per node)")
    try:
        args = {"gpus": ["6", "7"], "host_root": host("vm").path, "node_name": "vm"}
        code, checked = _module(cluster, args, "--check", "--diff")
        assert code == 0 and checked["changed"] is True and settled_on_host("vm")
        assert [d["driver_after"] for d in checked["devices"]] == ["vfio-pci", "vfio-pci"]
        code, real = _module(cluster, args, "--diff")
        assert code == 0 and real["diff"] == checked["diff"]
        wait(cluster, lambda: allocatable(cluster, "vm", N.RESOURCE_NAME) == 6, 120, "vm at 6 GPUs (module)")
        code, back = _module(cluster, {"state": "absent", "host_root": host("vm").path})
        assert code == 0 and back["changed"] is True and settled_on_host("vm")
        wait(cluster, lambda: allocatable(cluster, "vm", N.RESOURCE_NAME) == 8, 120, "vm at 8 GPUs again")
    finally:
        patch_cr(cluster, {"vfioManager": {"deploy": True}})
