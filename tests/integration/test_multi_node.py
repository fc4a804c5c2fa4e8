# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Several simulated GPU nodes on the local cluster (issue 11).

Needs a cluster of at least three nodes (the test session brings up
``8xC500 4xN100 2xC550-sriov`` unless a cluster is already up; see
conftest.py). Checked with the real kubelets, containerd, apiserver and
kube-scheduler:

* every node is Ready on containerd 2 with its own address, pod CIDR,
  cgroupRoot and simulated root;
* a pod pinned to each node runs and reaches the apiserver (service IP), the
  registry and the pods of the other nodes; the host reaches every pod IP;
* gpu-device and gpu-label run as DaemonSets (one spec) on every node and each
  node reports its own preset's capacity and labels -- which proves the
  hostPaths resolve per node;
* gpu-aware runs as a pod behind a Service; a second kube-scheduler, run as
  a hostNetwork pod on the control-plane node, calls its prioritize through
  the Service's ClusterIP (kube-proxy; the pod is on another node) with all
  three nodes as candidates and binds a 4-GPU pod where the topology tables
  say;
* restarting one node's kubelet leaves the other nodes' kubelets and pods
  alone.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid

import pytest

pytestmark = pytest.mark.cluster

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from test_gpu_device_cluster import DEVICE_ARGS, NS, SIM_MOUNT, Agents, wait_for  # noqa: E402

from ansible_collections.metax.gpu.plugins.module_utils.extender.nodeinfo import gpu_state, node_fields  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.extender.policy import Weights, prioritize  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.gpu.discovery import discover  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.gpu.model import chip_name  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.host import HostRoot  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.sim.spec import preset  # noqa: E402

GPU = "metax-tech.com/gpu"
P = "metax-tech.com/"
SRIOV_VFS = 4


@pytest.fixture(scope="module")
def nodes(cluster):
    if len(cluster.nodes) < 3:
        pytest.fail("these tests need a cluster of three nodes; it has %d. Run 'make cluster-down' and then "
                    "'make cluster-up NODES=\"8xC500 4xN100 2xC550-sriov\"' (or let the test session bring "
                    "it up)" % len(cluster.nodes), pytrace=False)
    return cluster.nodes


def test_inventory_lists_every_node_with_its_sim_root(cluster, nodes, tmp_path):
    """cluster.sh inventory is an Ansible inventory: groups and vars as the collection's conventions say."""
    res = cluster.cluster_sh("inventory")
    assert res.returncode == 0, res.stderr
    path = tmp_path / "inventory.yml"
    path.write_text(res.stdout)
    tool = os.path.join(os.path.dirname(sys.executable), "ansible-inventory")
    listed = subprocess.run([tool if os.path.exists(tool) else "ansible-inventory", "-i", str(path), "--list"], capture_output=True, text=True,
                            timeout=120, check=False, env=cluster.env)
    assert listed.returncode == 0, listed.stderr
    inv = json.loads(listed.stdout)
    names = [n["name"] for n in nodes]
    assert inv["kube_control_plane"]["hosts"] == [names[0]]
    assert sorted(inv["gpu_nodes"]["hosts"]) == sorted(names)
    assert "localhost" in inv["ungrouped"]["hosts"]
    hostvars = inv["_meta"]["hostvars"]
    assert hostvars["localhost"]["ansible_connection"] == "local"
    assert hostvars["localhost"]["metax_gpu_kubeconfig"] == cluster.kubeconfig
    for node in nodes:
        got = hostvars[node["name"]]
        assert got["ansible_connection"] == "local"
        assert got["metax_gpu_host_root"] == node["sim_root"]
        assert got["metax_gpu_node_name"] == node["name"]
        assert got["metax_gpu_kubeconfig"] == cluster.kubeconfig
        assert os.path.isdir(node["sim_root"])


def _core(cluster):
    from kubernetes import client
    return client.CoreV1Api(cluster.api_client())


def _kubectl_apply(cluster, *objects):
    import yaml
    res = subprocess.run([cluster.kubectl_path, "--kubeconfig", cluster.kubeconfig, "apply", "-f", "-"],
                         input=yaml.safe_dump_all(objects), env=cluster.env, capture_output=True, text=True,
                         timeout=120, check=False)
    assert res.returncode == 0, res.stderr


def _in(address, node):
    return ipaddress.ip_address(address) in ipaddress.ip_network(node["pod_cidr"])


def _pid_of(name):
    state = os.environ.get("METAX_CLUSTER_DIR", "/var/lib/metax-gpu-cluster")
    with open(os.path.join(state, "pids", name + ".pid")) as handle:
        return int(handle.read().strip())


# ---------------------------------------------------------------- nodes
def test_every_node_ready_on_containerd_2_with_its_own_network(cluster, nodes):
    core = _core(cluster)
    cidrs = set()
    for node in nodes:
        obj = core.read_node(node["name"])
        ready = [c.status for c in obj.status.conditions if c.type == "Ready"]
        assert ready == ["True"], (node["name"], obj.status.conditions)
        assert obj.status.node_info.container_runtime_version.startswith("containerd://2."), obj.status.node_info
        addresses = {a.type: a.address for a in obj.status.addresses}
        assert addresses["InternalIP"] == node["ip"]
        assert obj.spec.pod_cidr == node["pod_cidr"]
        cidrs.add(obj.spec.pod_cidr)
        roles = [k for k in obj.metadata.labels if k.startswith("node-role.kubernetes.io/")]
        assert roles == (["node-role.kubernetes.io/control-plane"] if node["control_plane"] else []), roles
        # own cgroupRoot: the kubelets do not garbage-collect each other's pod cgroups
        assert os.path.isdir("/sys/fs/cgroup/memory/metax-gpu-%s/kubepods" % node["name"]), node["name"]
        # own simulated root, made from the node's preset
        state = generator.load_state(HostRoot(node["sim_root"]))
        assert len(state["gpus"]) == len(preset(node["preset"]).gpus)
    assert len(cidrs) == len(nodes)


POD_SCRIPT = r"""
import json, socket, sys, time, urllib.request
out = {}
socket.create_connection(("10.96.0.1", 443), 5).close()
out["apiserver"] = True
out["registry"] = urllib.request.urlopen("http://10.250.0.1:%s/v2/" % sys.argv[1], timeout=5).status
out["peers"] = {}
for peer in sys.argv[2:]:
    if peer == "--no-serve":
        continue
    for attempt in range(15):  # kube-proxy programs a new Service within its sync period
        try:
            socket.create_connection((peer, 8080), 5).close()
            out["peers"][peer] = True
            break
        except OSError as exc:
            out["peers"][peer] = str(exc)
            time.sleep(1)
print(json.dumps(out), flush=True)
if "--no-serve" in sys.argv:  # a hostNetwork pod: port 8080 of the node is not ours
    time.sleep(86400)
import http.server
http.server.HTTPServer(("0.0.0.0", 8080), http.server.SimpleHTTPRequestHandler).serve_forever()
"""


@pytest.fixture(scope="module")
def namespace(cluster, nodes):
    core = _core(cluster)
    name = "metax-multinode-" + uuid.uuid4().hex[:6]
    core.create_namespace({"metadata": {"name": name}})
    wait_for(lambda: any(sa.metadata.name == "default" for sa in core.list_namespaced_service_account(name).items),
             60, "the default ServiceAccount")
    yield name
    core.delete_namespace(name, grace_period_seconds=0)


def _pinned_pod(cluster, namespace, name, node, args, host_network=False):
    port = cluster.registry.rsplit(":", 1)[1]
    container = {"name": "main", "image": cluster.info["METAX_REGISTRY_BASE_IMAGE"],
                 "command": ["python3", "-c", POD_SCRIPT, port] + list(args)}
    if not host_network:
        # the script serves port 8080 only after its own checks: Running comes a second or two before that
        container["readinessProbe"] = {"tcpSocket": {"port": 8080}, "periodSeconds": 1}
    _kubectl_apply(cluster, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": node}, "terminationGracePeriodSeconds": 0,
                 "hostNetwork": host_network, "containers": [container]}})


def _ready_ip(core, namespace, name):
    # Ready, not only Running (Ready implies it): a serving pod is Ready once its port answers (its readiness probe)
    pod = core.read_namespaced_pod(name, namespace)
    ready = any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])
    return pod.status.pod_ip if ready else None


def test_pinned_pod_runs_on_every_node_and_pods_reach_each_other_and_services(cluster, nodes, namespace):
    core = _core(cluster)
    first = ["p1-" + n["name"] for n in nodes]
    for pod, node in zip(first, nodes):
        _pinned_pod(cluster, namespace, pod, node["name"], [])
    ips = {}
    for pod, node in zip(first, nodes):
        ips[pod] = wait_for(lambda p=pod: _ready_ip(core, namespace, p), 120, "pod %s Ready" % pod, interval=1)
        got = core.read_namespaced_pod(pod, namespace)
        assert got.spec.node_name == node["name"]
        assert _in(ips[pod], node), (ips[pod], node["pod_cidr"])
        # the host (the scheduler's extender calls, tests) reaches every pod IP
        assert urllib.request.urlopen("http://%s:8080/" % ips[pod], timeout=5).status == 200
    # a Service (kube-proxy on every node) in front of the last node's pod
    service = core.create_namespaced_service(namespace, {
        "metadata": {"name": "peer"},
        "spec": {"selector": {"app": first[-1]}, "ports": [{"port": 8080, "targetPort": 8080}]}})
    cluster_ip = service.spec.cluster_ip
    # kube-proxy rejects a Service's ClusterIP until its EndpointSlice has a ready endpoint
    from kubernetes import client as kclient
    discovery = kclient.DiscoveryV1Api(cluster.api_client())
    wait_for(lambda: any(e.conditions and e.conditions.ready
                         for sl in discovery.list_namespaced_endpoint_slice(
                             namespace, label_selector="kubernetes.io/service-name=peer").items
                         for e in sl.endpoints or []), 60, "a ready endpoint of Service peer", interval=1)
    targets = sorted(ips.values()) + [cluster_ip]
    # from every node, in pods and in hostNetwork pods: apiserver by service
    # IP, registry, the pods on every node and the Service's ClusterIP
    second = ["p2-" + n["name"] for n in nodes]
    third = ["p3-host-" + n["name"] for n in nodes]
    for pod, host_pod, node in zip(second, third, nodes):
        _pinned_pod(cluster, namespace, pod, node["name"], targets)
        _pinned_pod(cluster, namespace, host_pod, node["name"], targets + ["--no-serve"], host_network=True)
    for pod in second + third:
        wait_for(lambda p=pod: _ready_ip(core, namespace, p), 120, "pod %s Ready" % pod, interval=1)
        log = wait_for(lambda p=pod: core.read_namespaced_pod_log(p, namespace).strip(), 60, "%s output" % pod)
        report = json.loads(log.splitlines()[0])
        assert report["apiserver"] is True and report["registry"] == 200, (pod, report)
        assert report["peers"] == {ip: True for ip in targets}, (pod, report)


# ---------------------------------------------------------------- agents on every node
class AllNodes(Agents):
    """The DaemonSets of the single-node tests, without their node selector: one spec for every node."""

    def daemonset(self, name, args, volumes):
        body = super().daemonset(name, args, volumes)
        del body["spec"]["template"]["spec"]["nodeSelector"]
        return body

    def pods(self, name):
        return [p for p in self.api.list_namespaced_pod(NS, label_selector="app=%s" % name).items
                if p.metadata.deletion_timestamp is None]

    def wait_all_ready(self, name, count, timeout=300):
        def ready():
            pods = [p for p in self.pods(name) if p.status.phase == "Running" and p.status.container_statuses
                    and all(s.ready for s in p.status.container_statuses)]
            return pods if len(pods) == count else None
        return wait_for(ready, timeout, "%d %s pods Running" % (count, name), interval=1)

    def start_all(self, name, args, volumes, count):
        self.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
                   *self.rbac(name), self.daemonset(name, args, volumes))
        return self.wait_all_ready(name, count)


def _sriov(node):
    return preset(node["preset"]).gpus[0].sriov_totalvfs > 0


def _reset_sims(nodes, vfs):
    for node in nodes:
        host = generator.create(node["sim_root"], preset(node["preset"]), force=True)
        if vfs and _sriov(node):
            for gpu in generator.load_state(host)["gpus"]:
                host.write_attribute("sys/bus/pci/devices/%s/sriov_numvfs" % gpu["bdf"], str(vfs))


@pytest.fixture(scope="module")
def agents(cluster, nodes, agent_images):  # noqa: F811
    agents = AllNodes(cluster, agent_images)
    # SR-IOV node split into VFs, so that all three nodes can take a 4-GPU pod
    _reset_sims(nodes, SRIOV_VFS)
    device_volumes = {
        "device-plugins": ("/var/lib/kubelet/device-plugins", "/var/lib/kubelet/device-plugins"),
        "pod-resources": ("/var/lib/kubelet/pod-resources", "/var/lib/kubelet/pod-resources"),
        "sim": (agents.sim_parent, SIM_MOUNT),
    }
    try:
        agents.start_all("gpu-device", DEVICE_ARGS + ["--host-prefix", agents.sim_root], device_volumes, len(nodes))
        agents.start_all("gpu-label", ["--host-root", SIM_MOUNT + "/root", "--interval", "2", "--log-format",
                                       "json"], {"sim": (agents.sim_parent, SIM_MOUNT)}, len(nodes))
        yield agents
    finally:
        agents.delete("gpu-device")
        agents.delete("gpu-label")
        _reset_sims(nodes, 0)


def _resources(core, name):
    status = core.read_node(name).status
    return (int((status.capacity or {}).get(GPU, "0")), int((status.allocatable or {}).get(GPU, "0")))


def test_agents_report_each_nodes_own_preset(cluster, nodes, agents):
    core = _core(cluster)
    by_node = {p.spec.node_name for p in agents.pods("gpu-device")}
    assert by_node == {n["name"] for n in nodes}
    for node in nodes:
        spec = preset(node["preset"])
        want = len(discover(HostRoot(node["sim_root"])).devices)
        assert want == len(spec.gpus) * (SRIOV_VFS if _sriov(node) else 1)
        wait_for(lambda n=node["name"], w=want: _resources(core, n) == (w, w), 90,
                 "%s: %s capacity/allocatable %d" % (node["name"], GPU, want))

        # the label is the chip name (MXC500) whatever the spec spells (C500)
        product = chip_name(spec.gpus[0].product)

        def labels(name=node["name"], product=product):
            got = core.read_node(name).metadata.labels or {}
            return got if got.get(P + "gpu.product") == product else None
        got = wait_for(labels, 60, "%s: gpu.product=%s" % (node["name"], product))
        assert got[P + "gpu.count"] == str(len(spec.gpus)), got
        assert got[P + "gpu.installed"] == "true" and got[P + "driver.ready"] == "true", got
        if _sriov(node):
            assert got[P + "gpu.vfnum"] == str(SRIOV_VFS), got


# ---------------------------------------------------------------- gpu-aware + the real scheduler
SCHEDULER_CONFIG = """\
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: /etc/kubernetes/scheduler.conf
leaderElection:
  leaderElect: false
profiles:
  - schedulerName: {name}
extenders:
  - urlPrefix: http://{address}:8080
    filterVerb: filter
    prioritizeVerb: prioritize
    weight: 500
    enableHTTPS: false
    nodeCacheCapable: true
    ignorable: false
    managedResources:
      - name: metax-tech.com/gpu
        ignoredByScheduler: false
"""


def _gpu_aware(agents, cluster, nodes):
    """gpu-aware as a pod on the LAST node behind a Service; in-cluster config; weights ConfigMap in NS.

    Returns (pod IP, ClusterIP)."""
    name = "gpu-aware"
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "%s-%s" % (NS, name)},
            "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
                      {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}]}
    rbac = agents.rbac(name)
    rbac[1] = role
    agents.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "gpu-aware-plugin", "namespace": NS},
                  "data": {"scoreWeight": "1", "lossWeight": "1"}}, *rbac, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS, "labels": {"app": name}},
        "spec": {"serviceAccountName": name, "nodeSelector": {"kubernetes.io/hostname": nodes[-1]["name"]},
                 "tolerations": [{"operator": "Exists"}], "terminationGracePeriodSeconds": 2,
                 "containers": [{"name": name, "image": agents.images[name], "command": [name],
                                 "args": ["--port", "8080", "--namespace", NS, "--log-level", "debug",
                                          "--log-format", "text"],
                                 "readinessProbe": {"httpGet": {"path": "/readyz", "port": 8080},
                                                    "periodSeconds": 1}}]}})
    agents.apply({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": NS},
                  "spec": {"selector": {"app": name}, "ports": [{"port": 8080, "targetPort": 8080}]}})
    pod = agents.wait_all_ready(name, 1, timeout=180)[0]
    service = agents.api.read_namespaced_service(name, NS)
    return pod.status.pod_ip, service.spec.cluster_ip


def _scheduler_pod(agents, cluster, nodes, scheduler_name, address):
    """A second kube-scheduler as a hostNetwork pod on the control-plane node (as the static one runs)."""
    name = "second-scheduler"
    agents.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": NS},
                  "data": {"config.yaml": SCHEDULER_CONFIG.format(name=scheduler_name, address=address)}}, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS, "labels": {"app": name}},
        "spec": {"hostNetwork": True, "nodeSelector": {"kubernetes.io/hostname": nodes[0]["name"]},
                 "tolerations": [{"operator": "Exists"}], "terminationGracePeriodSeconds": 1,
                 "containers": [{"name": name, "image": cluster.scheduler_image,
                                 "command": ["kube-scheduler", "--config=/config/config.yaml", "--secure-port=0",
                                             "--v=2"],
                                 "volumeMounts": [{"name": "config", "mountPath": "/config"},
                                                  {"name": "kubeconfig", "mountPath": "/etc/kubernetes/scheduler.conf",
                                                   "readOnly": True}]}],
                 "volumes": [{"name": "config", "configMap": {"name": name}},
                             {"name": "kubeconfig", "hostPath": {"path": "/etc/kubernetes/scheduler.conf",
                                                                 "type": "File"}}]}})
    agents.wait_all_ready(name, 1, timeout=120)


def test_real_scheduler_asks_gpu_aware_about_three_nodes(cluster, nodes, agents):
    core = _core(cluster)
    for node in nodes:
        want = len(discover(HostRoot(node["sim_root"])).devices)
        wait_for(lambda n=node["name"], w=want: _resources(core, n) == (w, w), 90, "%s GPUs" % node["name"])
    address, cluster_ip = _gpu_aware(agents, cluster, nodes)
    assert _in(address, nodes[-1]) and not _in(address, nodes[0]), "gpu-aware must run on another node"
    # pod IPs are routable from the host too
    assert urllib.request.urlopen("http://%s:8080/readyz" % address, timeout=5).status == 200
    scheduler_name = "metax-multinode-" + uuid.uuid4().hex[:6]
    _scheduler_pod(agents, cluster, nodes, scheduler_name, cluster_ip)
    names = [n["name"] for n in nodes]

    def states():
        out = {}
        for name in names:
            raw = json.loads(core.read_node(name, _preload_content=False).data)
            out[name] = gpu_state(node_fields(raw))
        return out if all(s.source == "devices" and s.fit >= 4 for s in out.values()) else None
    candidates = wait_for(states, 60, "gpu-device's tables on all three nodes")
    scores = prioritize(4, [candidates[n] for n in names], Weights(1, 1))
    best = max(scores)
    assert scores.count(best) == 1, "no single favoured node: %s" % dict(zip(names, scores))
    favoured = names[scores.index(best)]

    pod = "four-gpus"
    try:
        agents.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod, "namespace": NS},
                      "spec": {"schedulerName": scheduler_name, "terminationGracePeriodSeconds": 0,
                               "tolerations": [{"operator": "Exists"}],
                               "containers": [{"name": "main", "image": "%s/metax-gpu/pause:3.10" % cluster.registry,
                                               "resources": {"limits": {GPU: "4"}}}]}})
        bound = wait_for(lambda: core.read_namespaced_pod(pod, NS).spec.node_name, 90, "the 4-GPU pod bound")
        log = agents.logs("gpu-aware")
        asked = [line for line in log.splitlines() if "prioritize %s/%s" % (NS, pod) in line]
        assert asked, "gpu-aware's prioritize was not called:\n%s" % log[-3000:]
        assert all(name in asked[-1] for name in names), asked[-1]
        assert bound == favoured, (bound, dict(zip(names, scores)), asked[-1])
        sys.stderr.write("gpu-aware scores %s: the real scheduler bound the 4-GPU pod to %s\n"
                         % (dict(zip(names, scores)), bound))
        wait_for(lambda: core.read_namespaced_pod(pod, NS).status.phase == "Running", 120,
                 "the kubelet of %s to run the 4-GPU pod" % bound)
    finally:
        core.delete_namespaced_pod(pod, NS, grace_period_seconds=0)
        core.delete_namespaced_service("gpu-aware", NS)
        for name in ("second-scheduler", "gpu-aware"):
            core.delete_namespaced_pod(name, NS, grace_period_seconds=0)
            core.delete_namespaced_config_map(name if name != "gpu-aware" else "gpu-aware-plugin", NS)
        cluster.kubectl("delete", "clusterrolebinding,clusterrole", "%s-gpu-aware" % NS, "--ignore-not-found")


# ---------------------------------------------------------------- kubelet restart
def test_restarting_one_kubelet_leaves_the_others_alone(cluster, nodes, namespace):
    core = _core(cluster)
    target, others = nodes[1]["name"], [n["name"] for n in nodes if n is not nodes[1]]
    kubelets = {n: _pid_of("kubelet-" + n) for n in others}
    pods = {p.metadata.name: (p.metadata.uid, p.spec.node_name, p.status.container_statuses[0].restart_count)
            for p in core.list_namespaced_pod(namespace).items if p.status.phase == "Running"}
    assert {value[1] for value in pods.values()} >= set(others), pods
    old = _pid_of("kubelet-" + target)
    res = cluster.cluster_sh("restart-kubelet", target)
    assert res.returncode == 0, res.stdout + res.stderr
    assert _pid_of("kubelet-" + target) != old
    time.sleep(5)
    assert {n: _pid_of("kubelet-" + n) for n in others} == kubelets
    for name, (uid, node, restarts) in pods.items():
        pod = core.read_namespaced_pod(name, namespace)
        assert pod.metadata.uid == uid and pod.status.phase == "Running", (name, pod.status.phase)
        assert pod.status.container_statuses[0].restart_count == restarts, name
    for node in nodes:
        ready = [c.status for c in core.read_node(node["name"]).status.conditions if c.type == "Ready"]
        assert ready == ["True"], node["name"]
