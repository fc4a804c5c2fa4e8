# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""gpu-device as a DaemonSet pod on the local cluster: the real kubelet and apiserver.

The agent image (files/images/agent/build.sh, content-hash tag, local
registry) runs privileged with the kubelet's device-plugin and pod-resources
directories and the simulated MetaX root (hostPath) mounted; it hands out
device nodes by their host path under the simulated root.

Checked here: capacity and allocatable ``metax-tech.com/gpu: 8`` on 8xC500;
a pod asking for 2 gets the allocator's pair and sees exactly those device
nodes; the annotations follow allocations; a failed GPU leaves allocatable 7
with capacity 8 and comes back after recovery; 2 x C550 with vfnum 4 gives
capacity 8; a kubelet restart is survived (when the cluster tooling can
restart the kubelet). The agents run under the chart's node-agent admission
policy (tests/integration/node_policy.py), as an installation does: every
annotation write above passes it.

Shared helpers for tests/integration/test_gpu_label_cluster.py live here too.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid

import pytest
import yaml

pytestmark = pytest.mark.cluster

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, ".build", "collections"))

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import node_policy  # noqa: E402
from polling import poll, wait_until  # noqa: E402

from ansible_collections.metax.gpu.plugins.module_utils.kubelet.registration import socket_identity  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.gpu.allocator import allocate  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.gpu.discovery import discover  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.host import HostRoot  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.sim.spec import preset  # noqa: E402

GPU = "metax-tech.com/gpu"
NS = "metax-gpu-agents-it"
HEALTHY_INTERVAL = 2
SIM_MOUNT = "/host-sim"          # the simulated root's parent directory, in the agent pods
ANNOTATIONS = ("metax-tech.com/gpu.topology.scores", "metax-tech.com/gpu.topology.losses",
               "metax-tech.com/gpu.devices")


DIAGNOSE = []      # callables adding context to a timeout (the agents under test register theirs)


def wait_for(predicate, timeout, what, interval=0.25):
    return wait_until(predicate, timeout, what, interval=interval, diagnose=DIAGNOSE)


class Agents:
    """Namespace, RBAC and DaemonSets of the agents under test; restores the node afterwards."""

    def __init__(self, cluster, images):
        from kubernetes import client

        self.cluster = cluster
        self.images = images
        self.policy = None      # the node-agent admission policy objects, once start() applied them
        self.api = client.CoreV1Api(cluster.api_client())
        self.apps = client.AppsV1Api(self.api.api_client)
        self.node = cluster.node_name
        self.sim_root = cluster.sim_root
        self.sim_parent = os.path.dirname(self.sim_root)
        DIAGNOSE[:] = [self.diagnose]

    # -- manifests ----------------------------------------------------------
    def apply(self, *objects):
        res = subprocess.run([self.cluster.kubectl_path, "--kubeconfig", self.cluster.kubeconfig, "apply", "-f", "-"],
                             input=yaml.safe_dump_all(objects), env=self.cluster.env, capture_output=True,
                             text=True, timeout=120, check=False)
        assert res.returncode == 0, res.stderr

    def rbac(self, name):
        return [
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": NS}},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
             "metadata": {"name": "%s-%s" % (NS, name)},
             "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": {"name": "%s-%s" % (NS, name)},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "%s-%s" % (NS, name)},
             "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": NS}]},
        ]

    def daemonset(self, name, args, volumes, run_as_user=None):
        mounts = [{"name": v, "mountPath": where[1]} for v, where in volumes.items()]
        host_volumes = [{"name": v, "hostPath": {"path": where[0], "type": "Directory"}} for v, where in volumes.items()]
        return {
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": name, "namespace": NS},
            "spec": {
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {
                        "serviceAccountName": name,
                        "nodeSelector": {"kubernetes.io/hostname": self.node},
                        "tolerations": [{"operator": "Exists"}],
                        "terminationGracePeriodSeconds": 10,
                        "containers": [{
                            "name": name, "image": self.images[name], "imagePullPolicy": "IfNotPresent",
                            "command": [name], "args": args,
                            "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
                            "securityContext": dict({"privileged": True},
                                                    **({} if run_as_user is None else {"runAsUser": run_as_user})),
                            "volumeMounts": mounts,
                        }],
                        "volumes": host_volumes,
                    },
                },
            },
        }

    def start(self, name, args, volumes, run_as_user=None):
        self.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}, *self.rbac(name))
        # the agents run under the chart's node-agent admission policy, as installed (issue 30)
        self.policy = node_policy.apply_policy(self.cluster, NS)
        self.apply(self.daemonset(name, args, volumes, run_as_user))
        return self.wait_ready(name)

    def pod_of(self, name):
        pods = self.api.list_namespaced_pod(NS, label_selector="app=%s" % name).items
        live = [p for p in pods if p.metadata.deletion_timestamp is None and p.status.phase in ("Pending", "Running")]
        return live[0] if len(live) == 1 else None

    def wait_ready(self, name, timeout=240):
        def ready():
            pod = self.pod_of(name)
            if pod is None or pod.status.phase != "Running":
                return None
            statuses = pod.status.container_statuses or []
            return pod if statuses and all(s.ready for s in statuses) else None
        return wait_for(ready, timeout, "%s pod Running" % name, interval=1)

    def restart(self, name):
        old = self.pod_of(name)
        assert old is not None, "no %s pod to restart\n%s" % (name, self.diagnose())
        self.api.delete_namespaced_pod(old.metadata.name, NS)
        wait_for(lambda: self.pod_of(name) is not None and self.pod_of(name).metadata.uid != old.metadata.uid,
                 120, "a new %s pod" % name, interval=1)
        return self.wait_ready(name)

    def diagnose(self):
        """Pods, node GPU resources and the agents' last log lines, for failure messages."""
        out = ["pods in %s:" % NS]
        for pod in self.api.list_namespaced_pod(NS).items:
            deleting = pod.metadata.deletion_timestamp is not None
            out.append("  %s %s deleting=%s" % (pod.metadata.name, pod.status.phase, deleting))
        out.append("node %s %s: capacity/allocatable %s" % (self.node, GPU, self.gpu_resources()))
        for name in ("gpu-device", "gpu-label"):
            try:
                tail = self.logs(name).splitlines()[-15:]
            except Exception:  # pylint: disable=broad-except
                continue
            if tail:
                out.append("last %s log lines:" % name)
                out.extend("  " + line[:300] for line in tail)
        return "\n".join(out)

    def logs(self, name):
        pod = self.pod_of(name)
        return self.api.read_namespaced_pod_log(pod.metadata.name, NS) if pod else ""

    def delete(self, name):
        self.cluster.kubectl("-n", NS, "delete", "daemonset", name, "--ignore-not-found", "--wait=true",
                             timeout=180)

        def gone():
            return not self.api.list_namespaced_pod(NS, label_selector="app=%s" % name).items
        if not poll(gone, 60):
            # a pod whose kubelet is gone (a node restarted or taken down by
            # another session) is never confirmed deleted: force it, as
            # `kubectl delete --force` would, so teardown cannot hang
            from kubernetes.client.rest import ApiException
            for pod in self.api.list_namespaced_pod(NS, label_selector="app=%s" % name).items:
                try:
                    self.api.delete_namespaced_pod(pod.metadata.name, NS, grace_period_seconds=0)
                except ApiException as exc:
                    if exc.status != 404:
                        raise
            wait_for(gone, 60, "%s pods gone after a forced delete" % name, interval=1)
        self.cluster.kubectl("delete", "clusterrolebinding,clusterrole", "%s-%s" % (NS, name), "--ignore-not-found")

    # -- node ------------------------------------------------------------------
    def node_obj(self):
        return self.api.read_node(self.node)

    def gpu_resources(self):
        status = self.node_obj().status
        return (int((status.capacity or {}).get(GPU, "0")), int((status.allocatable or {}).get(GPU, "0")))

    def annotations(self):
        return dict(self.node_obj().metadata.annotations or {})

    def remove_annotations(self, keys):
        self.api.patch_node(self.node, {"metadata": {"annotations": {k: None for k in keys}}},
                            _content_type="application/merge-patch+json")

    # -- simulated root ----------------------------------------------------------
    def sim(self):
        return HostRoot(self.sim_root)

    def recreate_sim(self, preset_name, vfs=0):
        host = generator.create(self.sim_root, preset(preset_name), force=True)
        if vfs:
            for gpu in generator.load_state(host)["gpus"]:
                host.write_attribute("sys/bus/pci/devices/%s/sriov_numvfs" % gpu["bdf"], str(vfs))
        return host


def node_status_update_seconds(cluster):
    """The kubelet's nodeStatusUpdateFrequency: how late allocatable may reach the apiserver."""
    path = os.path.join(os.environ.get("METAX_CLUSTER_DIR", "/var/lib/metax-gpu-cluster"), "kubelet", "config.yaml")
    try:
        with open(path) as handle:
            value = (yaml.safe_load(handle) or {}).get("nodeStatusUpdateFrequency", "10s")
    except OSError:
        value = "10s"
    value = str(value)
    if value.endswith("ms"):
        return float(value[:-2]) / 1000
    if value.endswith("s"):
        return float(value[:-1])
    if value.endswith("m"):
        return float(value[:-1]) * 60
    return 10.0


# --cdi-mode devices: these DaemonSets mount no /var/run/cdi, and the pods check device nodes handed over
# by Allocate itself (the fallback for runtimes without CDI); test_cdi_cluster.py runs the CDI mode.
DEVICE_ARGS = ["--host-root", SIM_MOUNT + "/root", "--healthy-interval", str(HEALTHY_INTERVAL),
               "--pod-resources-interval", "1", "--log-format", "json", "--metrics-port", "9400",
               "--cdi-mode", "devices"]


@pytest.fixture(scope="module")
def device_agent(cluster, agent_images):
    agents = Agents(cluster, agent_images)
    if generator.load_state(agents.sim())["gpus"].__len__() != 8 or not agents.sim().exists("sys/module/metax"):
        agents.recreate_sim("8xC500")
    # a root made by an older checkout keeps its older mx-smi (no load, no -j): this simulator's
    generator.reinstall_mx_smi(agents.sim())
    volumes = {
        "device-plugins": ("/var/lib/kubelet/device-plugins", "/var/lib/kubelet/device-plugins"),
        "pod-resources": ("/var/lib/kubelet/pod-resources", "/var/lib/kubelet/pod-resources"),
        "sim": (agents.sim_parent, SIM_MOUNT),
    }
    args = DEVICE_ARGS + ["--host-prefix", agents.sim_root]
    try:
        agents.start("gpu-device", args, volumes)
        yield agents
    finally:
        agents.delete("gpu-device")
        agents.remove_annotations(ANNOTATIONS)
        state = generator.load_state(agents.sim())
        if len(state["gpus"]) != 8 or any(g["failed"] for g in state["gpus"]) or not state["driver_loaded"]:
            agents.recreate_sim("8xC500")


def metrics(agents):
    pod = agents.pod_of("gpu-device")
    text = urllib.request.urlopen("http://%s:9400/metrics" % pod.status.pod_ip, timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def wait_registered(agents):
    """The current gpu-device pod is registered with the kubelet (/healthz 200)."""
    def ok():
        pod = agents.pod_of("gpu-device")
        try:
            return urllib.request.urlopen("http://%s:9400/healthz" % pod.status.pod_ip, timeout=2).status == 200
        except (OSError, AttributeError):
            return False
    wait_for(ok, 60, "gpu-device registered (/healthz)")


def devices_annotation(agents):
    text = agents.annotations().get("metax-tech.com/gpu.devices")
    return json.loads(text) if text else None


def test_capacity_allocatable_and_annotations(device_agent):
    agents = device_agent
    # The kubelet keeps a departed plugin's resources for a grace period, so an
    # earlier module's gpu-device can still show 8/8: wait for this pod's own registration.
    wait_registered(agents)
    wait_for(lambda: agents.gpu_resources() == (8, 8), 60, "capacity and allocatable 8")
    devices = wait_for(lambda: devices_annotation(agents), 30, "the gpu.devices annotation")
    inv = discover(agents.sim())
    assert [d["id"] for d in devices] == [d.id for d in inv.devices]
    assert all(d["health"] == "Healthy" for d in devices)
    scores = json.loads(agents.annotations()["metax-tech.com/gpu.topology.scores"])
    assert sorted(scores, key=int) == [str(n) for n in range(1, 9)]
    m = metrics(agents)
    assert m["metax_gpu_devices"] == 8 and m["metax_gpu_devices_healthy"] == 8
    assert m["metax_gpu_registrations_total"] >= 1
    # written under the node-agent admission policy, none refused
    assert agents.policy and "ValidatingAdmissionPolicy" not in agents.logs("gpu-device")


def test_pod_gets_the_allocators_pair(device_agent, cluster):
    agents = device_agent
    wait_for(lambda: agents.gpu_resources() == (8, 8), 60, "allocatable 8")
    inv = discover(agents.sim())
    busy = {d["id"] for d in devices_annotation(agents) if d["allocated"]}
    free = [d.index for d in inv.devices if d.healthy and d.id not in busy]
    pair = [inv.devices[i] for i in allocate(inv.topology, free, 2).devices]
    name = "gpu-pair-%s" % uuid.uuid4().hex[:6]
    script = "ls /dev/dri | sort | tr '\\n' ' '; echo; ls /dev/mxcd; env | grep ^METAX_ | sort; sleep 3600"
    agents.apply({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
        "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                 "nodeSelector": {"kubernetes.io/hostname": agents.node},
                 "tolerations": [{"operator": "Exists"}],
                 "containers": [{"name": "main", "image": agents.images["gpu-device"], "command": ["sh", "-c", script],
                                 "resources": {"limits": {GPU: "2"}}}]}})
    try:
        wait_for(lambda: agents.api.read_namespaced_pod(name, NS).status.phase == "Running", 180, "the GPU pod")
        running_at = time.monotonic()
        log = wait_for(lambda: agents.api.read_namespaced_pod_log(name, NS).strip(), 30, "the pod's output")
        lines = log.splitlines()
        expect_dri = sorted([d.drm_card for d in pair] + [d.drm_render for d in pair])
        assert lines[0].split() == expect_dri, log
        assert lines[1] == "/dev/mxcd"
        env = dict(line.split("=", 1) for line in lines[2:])
        assert env["METAX_VISIBLE_DEVICES"] == ",".join(d.id for d in pair)
        # the annotations follow within 5 s of the pod starting (pod-resources poll + patch)
        wait_for(lambda: {d["id"] for d in devices_annotation(agents) if d["allocated"]} == {d.id for d in pair},
                 5 + max(0.0, running_at - time.monotonic()) + 5, "allocated devices in the annotation")
        # the contract (docs/agents.md): keys 1..capacity always; sizes above the 6 free GPUs
        # carry the worst values, so HAMi never mistakes this node for an empty one
        scores = json.loads(agents.annotations()["metax-tech.com/gpu.topology.scores"])
        losses = json.loads(agents.annotations()["metax-tech.com/gpu.topology.losses"])
        assert sorted(scores, key=int) == [str(n) for n in range(1, 9)]
        assert [scores[n] for n in ("7", "8")] == [0, 0] and [losses[n] for n in ("7", "8")] == [1000, 1000]
        assert all(scores[str(n)] > 0 and losses[str(n)] < 1000 for n in range(1, 7)), (scores, losses)
        assert agents.gpu_resources() == (8, 8)        # allocatable counts devices, not free ones
    finally:
        agents.api.delete_namespaced_pod(name, NS, grace_period_seconds=0)
    wait_for(lambda: not any(d["allocated"] for d in devices_annotation(agents)), 60,
             "the pair released in the annotation")


def test_failed_gpu_leaves_allocatable_and_recovers(device_agent, cluster):
    agents = device_agent
    wait_for(lambda: agents.gpu_resources() == (8, 8), 60, "allocatable 8")
    status_delay = node_status_update_seconds(cluster)
    budget = HEALTHY_INTERVAL + 2
    try:
        t0 = time.monotonic()
        generator.fail_gpu(agents.sim(), 3, "bus")
        wait_for(lambda: metrics(agents)["metax_gpu_devices_healthy"] == 7, budget + 1, "Unhealthy in the plugin")
        plugin_seconds = time.monotonic() - t0
        wait_for(lambda: agents.gpu_resources() == (8, 7), budget + status_delay + 2,
                 "allocatable 7 (kubelet nodeStatusUpdateFrequency %ss)" % status_delay)
        node_seconds = time.monotonic() - t0
        sys.stderr.write("health: plugin %.1fs, node allocatable %.1fs (budget %ss + status %ss)\n"
                         % (plugin_seconds, node_seconds, budget, status_delay))
        assert plugin_seconds <= budget
        if status_delay <= 1:
            assert node_seconds <= budget
        # the annotation is patched after the plugin's own view changes: under load, later than allocatable
        wait_for(lambda: [d["health"] for d in devices_annotation(agents)].count("Unhealthy") == 1, budget + 10,
                 "one Unhealthy device in the annotation")
    finally:
        generator.recover_gpu(agents.sim(), 3)
    wait_for(lambda: agents.gpu_resources() == (8, 8), budget + status_delay + 2, "allocatable back to 8")
    log = agents.logs("gpu-device")
    assert "is Unhealthy" in log and "is Healthy" in log


def test_sriov_vfnum_4_on_2xc550(device_agent):
    agents = device_agent
    try:
        agents.recreate_sim("2xC550-sriov", vfs=4)
        agents.restart("gpu-device")
        wait_registered(agents)
        wait_for(lambda: agents.gpu_resources() == (8, 8), 60, "capacity 8 = 2 GPUs x 4 VFs")
        devices = wait_for(lambda: [d for d in (devices_annotation(agents) or []) if d["vf"]], 30, "VF devices")
        assert len(devices) == 8 and len({d["gpu"] for d in devices}) == 2
    finally:
        agents.recreate_sim("8xC500")
        agents.restart("gpu-device")
        wait_registered(agents)
    wait_for(lambda: agents.gpu_resources() == (8, 8), 60, "8 x C500 again")
    wait_for(lambda: devices_annotation(agents) and not any(d["vf"] for d in devices_annotation(agents)), 30,
             "PF devices in the annotation again")


def test_reregisters_when_its_socket_is_removed(device_agent):
    """What a kubelet restart does to the plugin (its socket removed), with the real kubelet."""
    agents = device_agent
    wait_for(lambda: agents.gpu_resources() == (8, 8), 60, "allocatable 8")
    wait_registered(agents)
    before = metrics(agents)["metax_gpu_registrations_total"]
    t0 = time.monotonic()
    old = glob.glob("/var/lib/kubelet/device-plugins/metax-gpu-*.sock")
    assert len(old) == 1, old
    os.unlink(old[0])
    wait_for(lambda: metrics(agents)["metax_gpu_registrations_total"] > before, 5, "re-registration", interval=0.1)
    sys.stderr.write("socket removed: re-registered with the kubelet in %.2fs\n" % (time.monotonic() - t0))
    time.sleep(2)       # the old gRPC server is gone by now: nothing may remove the new socket
    new = glob.glob("/var/lib/kubelet/device-plugins/metax-gpu-*.sock")
    assert len(new) == 1 and new != old, new
    assert metrics(agents)["metax_gpu_registrations_total"] == before + 1
    wait_for(lambda: agents.gpu_resources() == (8, 8), 30, "allocatable 8 after re-registration")


def test_kubelet_restart_is_survived(device_agent, cluster):
    agents = device_agent
    command = ["bash", os.path.join(REPO, "scripts", "cluster", "cluster.sh"), "restart-kubelet"]
    wait_for(lambda: agents.gpu_resources() == (8, 8), 60, "allocatable 8")
    wait_registered(agents)
    before = metrics(agents)["metax_gpu_registrations_total"]
    sock = "/var/lib/kubelet/device-plugins/kubelet.sock"
    # inode numbers are reused at once on this filesystem: identity is (dev, inode, ctime), as gpu-device sees it
    old = socket_identity(sock)
    res = subprocess.run(command, env=cluster.env, capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    wait_for(lambda: socket_identity(sock) not in (None, old), 120, "a new kubelet.sock")
    back = time.monotonic()
    wait_for(lambda: metrics(agents)["metax_gpu_registrations_total"] > before, 5, "re-registration")
    sys.stderr.write("kubelet restart: re-registered %.1fs after kubelet.sock reappeared\n"
                     % (time.monotonic() - back))
    wait_for(lambda: agents.gpu_resources() == (8, 8), 60, "allocatable 8 after the kubelet restart")
