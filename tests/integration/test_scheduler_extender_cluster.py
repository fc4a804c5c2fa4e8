# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""metax.gpu.scheduler_extender on the local cluster's real static-pod kube-scheduler (node vm).

The scheduler is the kubelet's static pod from /etc/kubernetes/manifests; it
runs in vm's network namespace, so the module's health and extender checks go
through setns. The extender here is a small HTTP process of the test (on the
host's bridge address, reachable from that namespace) that accepts every node
and logs each call, so the test sees the real scheduler call it.

* enable: the scheduler restarts with --config and calls the extender for a
  pod asking for metax-tech.com/gpu; a second run changes nothing;
* drift: the manifest rewritten as kubeadm upgrade does is reported by check
  mode and repaired by a run;
* disable: the scheduler restarts without it; the manifest is byte for byte
  the original;
* faults: a configuration the scheduler rejects (v1beta3 on 1.36) and an
  unreachable extender with ignorable=false: the module restores the backup,
  the scheduler is healthy again and the module says where the backup is;
* the playbooks enable_gpu_aware / disable_gpu_aware with the example inventory.

After every test manifests/ holds exactly the files it held before (the
fixture restores them, and fails the test, if not).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid

import pytest
from playbook_output import recap
from polling import wait_until

from ansible_collections.metax.gpu.plugins.module_utils.names import RESOURCE_NAME
from ansible_collections.metax.gpu.plugins.module_utils.scheduler import backend as be
from ansible_collections.metax.gpu.plugins.modules import scheduler_extender

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "unit", "modules"))
from module_runner import run_module  # noqa: E402

pytestmark = pytest.mark.cluster

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
INVENTORY = os.path.join(ROOT, "docs", "examples", "local-cluster-inventory.yml")
KUBE_ETC = os.environ.get("METAX_KUBE_ETC", "/etc/kubernetes")
MANIFESTS = os.path.join(KUBE_ETC, "manifests")
SCHEDULER = os.path.join(MANIFESTS, "kube-scheduler.yaml")
CONFIG = "/etc/metax/extender.yaml"
TAINT = "metax.gpu/scheduler-extender-it"
PAUSE = "metax-gpu/pause:3.10"

EXTENDER = r'''
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
log = sys.argv[2]
class H(BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        verb = self.path.rsplit("/", 1)[-1]
        pod = (body.get("Pod") or {}).get("metadata", {}).get("name")
        names = body.get("NodeNames") or [n["metadata"]["name"] for n in (body.get("Nodes") or {}).get("items", [])]
        with open(log, "a") as fh:
            fh.write(json.dumps({"verb": verb, "pod": pod, "nodes": names}) + "\n")
        if verb == "filter":
            out = {"Nodes": body.get("Nodes"), "NodeNames": body.get("NodeNames"), "FailedNodes": {}, "Error": ""}
        else:
            out = [{"Host": n, "Score": 0} for n in names]
        data = json.dumps(out).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def log_message(self, *args):
        pass
srv = HTTPServer(("0.0.0.0", 0), H)
print(srv.server_address[1], flush=True)
srv.serve_forever()
'''


def _apply(cluster, obj):
    subprocess.run([cluster.kubectl_path, "--kubeconfig", cluster.kubeconfig, "apply", "-f", "-"],
                   input=json.dumps(obj), capture_output=True, text=True, env=cluster.env, timeout=60, check=True)


def _snapshot():
    files = {}
    for name in sorted(os.listdir(MANIFESTS)):
        with open(os.path.join(MANIFESTS, name), "rb") as handle:
            files[name] = handle.read()
    return files


def _processes():
    return be.scheduler_processes()


def _scheduler_ready(cluster):
    out = cluster.kubectl("-n", "kube-system", "get", "pod", "kube-scheduler-" + cluster.node_name, "-o",
                          "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}")
    return out.returncode == 0 and out.stdout.strip() == "True"


def _healthy(cluster):
    procs = _processes()
    return len(procs) == 1 and be.http_healthy("https://127.0.0.1:10259/readyz", procs[0][0]) and \
        _scheduler_ready(cluster)


def _ready_soon(cluster):
    """The module saw /readyz answer; the mirror pod's Ready condition follows at the kubelet's next status update."""
    wait_until(lambda: _healthy(cluster), 60, "the kube-scheduler mirror pod to turn Ready")
    return True


def _with_config(flag=True):
    procs = _processes()
    return len(procs) == 1 and (("--config=" + CONFIG) in procs[0][1]) == flag


@pytest.fixture
def pristine(cluster):
    """manifests/ and the extender configuration exactly as they were, after every test."""
    before = _snapshot()
    had_config = os.path.exists(CONFIG)
    backups = tempfile.mkdtemp(prefix="metax-sched-it-", dir="/var/tmp")
    yield backups
    after = _snapshot()
    if after != before:
        for name in after:
            if name not in before:
                os.unlink(os.path.join(MANIFESTS, name))
        for name, data in before.items():
            tmp = os.path.join(MANIFESTS, ".metax-it-restore")
            with open(tmp, "wb") as handle:
                handle.write(data)
            os.replace(tmp, os.path.join(MANIFESTS, name))
    if not had_config and os.path.exists(CONFIG):
        wait_until(lambda: _with_config(False), 120, "the scheduler to drop --config before removing it")
        os.unlink(CONFIG)
    wait_until(lambda: _healthy(cluster), 180, "kube-scheduler to be healthy after the test")
    shutil.rmtree(backups, ignore_errors=True)
    assert after == before, "manifests/ changed: %s -> %s (restored)" % (sorted(before), sorted(after))


@pytest.fixture(scope="module")
def extender(cluster):
    log = tempfile.NamedTemporaryFile(prefix="metax-ext-", suffix=".log", delete=False)
    log.close()
    proc = subprocess.Popen([sys.executable, "-c", EXTENDER, "serve", log.name], stdout=subprocess.PIPE, text=True)
    port = int(proc.stdout.readline())
    # cluster.sh: the host is .1 on the nodes' bridge, reachable from vm's network namespace
    host = cluster.node(cluster.node_name)["ip"].rsplit(".", 1)[0] + ".1"

    class Extender:
        url = "http://%s:%d" % (host, port)
        closed_url = "http://%s:%d" % (host, _closed_port())

        @staticmethod
        def calls(pod=None):
            with open(log.name) as handle:
                rows = [json.loads(line) for line in handle if line.strip()]
            return [r for r in rows if pod is None or r["pod"] == pod]

    yield Extender
    proc.terminate()
    proc.wait(10)
    os.unlink(log.name)


def _closed_port():
    import socket
    sock = socket.socket()
    sock.bind(("0.0.0.0", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


@pytest.fixture(scope="module")
def gpu_node(cluster):
    """A hand-made Node with GPUs (tainted for our pods only) and a namespace for the test pods."""
    suffix = uuid.uuid4().hex[:6]
    name = "sched-ext-it-" + suffix
    namespace = "sched-ext-it-" + suffix
    node = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "spec": {"taints": [{"key": TAINT, "value": suffix, "effect": "NoSchedule"}]}}
    _apply(cluster, node)
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110", RESOURCE_NAME: "8"}
    cluster.kubectl("patch", "node", name, "--subresource=status", "--type=merge", "-p",
                    json.dumps({"status": {"capacity": resources, "allocatable": resources}}), check=True)
    cluster.kubectl("create", "namespace", namespace, check=True)
    yield {"name": name, "namespace": namespace}
    cluster.kubectl("delete", "namespace", namespace, "--wait=false")
    cluster.kubectl("delete", "node", name)


def _gpu_pod(cluster, gpu_node, name):
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": gpu_node["namespace"]},
           "spec": {"terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "main", "image": "%s/%s" % (cluster.registry, PAUSE),
                                    "resources": {"limits": {RESOURCE_NAME: "1"}}}],
                    "tolerations": [{"operator": "Exists"}],
                    "nodeSelector": {"kubernetes.io/hostname": gpu_node["name"]}}}
    _apply(cluster, pod)

    def bound():
        out = cluster.kubectl("-n", gpu_node["namespace"], "get", "pod", name, "-o", "jsonpath={.spec.nodeName}")
        return out.stdout.strip() == gpu_node["name"]

    wait_until(bound, 120, "pod %s to be scheduled" % name)
    cluster.kubectl("-n", gpu_node["namespace"], "delete", "pod", name, "--grace-period=0", "--force", "--wait=false")


def _module(backups, **args):
    full = {"backup_dir": backups, "wait_timeout": 150}
    full.update(args)
    return run_module(scheduler_extender, full)


def test_enable_drift_disable(cluster, extender, gpu_node, pristine):
    original = _snapshot()
    assert _ready_soon(cluster)       # an earlier module (or etcd under a burst of writes) may have restarted it
    failed, on = _module(pristine, url=extender.url)
    assert not failed, on
    assert on["changed"] and on["waited"] and on["backup"].startswith(pristine)
    assert on["api_version"] == "kubescheduler.config.k8s.io/v1"
    assert _with_config(True) and _ready_soon(cluster)
    assert sorted(os.listdir(MANIFESTS)) == sorted(original)
    with open(os.path.join(on["backup"], "kube-scheduler.yaml"), "rb") as handle:
        assert handle.read() == original["kube-scheduler.yaml"]

    _gpu_pod(cluster, gpu_node, "through-extender")
    assert [c["verb"] for c in extender.calls("through-extender")][:1] == ["filter"]

    failed, again = _module(pristine, url=extender.url)
    assert not failed and again["changed"] is False

    # kubeadm upgrade writes its own manifest: the patch is gone, the scheduler restarts without it
    with open(os.path.join(MANIFESTS, ".kubeadm-like"), "wb") as handle:
        handle.write(original["kube-scheduler.yaml"])
    os.replace(os.path.join(MANIFESTS, ".kubeadm-like"), SCHEDULER)
    wait_until(lambda: _with_config(False), 120, "the scheduler to restart without --config")
    failed, checked = run_module(scheduler_extender, {"url": extender.url, "backup_dir": pristine}, check_mode=True)
    assert not failed and checked["changed"] and checked["drift"] and "kubeadm upgrade" in checked["msg"]
    failed, fixed = _module(pristine, url=extender.url)
    assert not failed and fixed["changed"] and fixed["waited"]
    assert _with_config(True)

    failed, off = _module(pristine, state="absent")
    assert not failed, off
    assert off["changed"] and off["waited"]
    assert _with_config(False) and _ready_soon(cluster)
    assert _snapshot() == original and not os.path.exists(CONFIG)
    calls = len(extender.calls())
    _gpu_pod(cluster, gpu_node, "without-extender")
    assert len(extender.calls()) == calls


@pytest.mark.parametrize("fault", ["rejected-config", "unreachable-extender"])
def test_fault_restores_the_backup(cluster, extender, pristine, fault):
    original = _snapshot()
    # The module waits all of wait_timeout for a scheduler that never comes right, then restores and waits up
    # to wait_timeout again. The restore (the failed pod stopped, the old manifest written: about 4 s to a new
    # process, then 3 healthy checks a second apart) fits 25 s with room for a loaded machine.
    args = {"url": extender.url, "wait_timeout": 25}
    if fault == "rejected-config":
        args["kubernetes_version"] = "1.24"     # v1beta3: kube-scheduler 1.29+ refuses to start with it
    else:
        args["url"] = extender.closed_url
    failed, result = _module(pristine, **args)
    assert failed, result
    msg = result["msg"]
    assert "restored" in msg and "healthy again" in msg and pristine in msg, msg
    if fault == "unreachable-extender":
        assert "not reachable" in msg
    else:
        # the scheduler exits at start: seen as no process, a crash-looping one, or no answer
        assert any(seen in msg for seen in ("no kube-scheduler process", "does not answer 200", "restarted with")), msg
    assert _snapshot() == original
    assert not os.path.exists(CONFIG)
    assert _with_config(False) and _ready_soon(cluster)
    backups = os.listdir(pristine)
    assert len(backups) == 1
    assert sorted(os.listdir(os.path.join(pristine, backups[0]))) == ["extender.yaml.absent", "kube-scheduler.yaml"]


def _playbook(cluster, name, *extra):
    cmd = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", INVENTORY,
           "-e", "metax_gpu_kubeconfig=" + cluster.kubeconfig, "metax.gpu." + name] + list(extra)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=cluster.env, timeout=900, check=False)
    assert proc.returncode == 0, "%s failed:\n%s\n%s" % (name, proc.stdout[-5000:], proc.stderr[-2000:])
    return proc.stdout


def _gpu_aware_service(cluster, namespace, extender):
    """Service gpu-aware:8080 (no selector) whose EndpointSlice is the test's extender on the host."""
    host, port = extender.url.rsplit("/", 1)[-1].rsplit(":", 1)
    _apply(cluster, {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "gpu-aware", "namespace": namespace},
                     "spec": {"ports": [{"name": "http", "port": 8080, "targetPort": int(port)}]}})
    _apply(cluster, {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                     "metadata": {"name": "gpu-aware-test", "namespace": namespace,
                                  "labels": {"kubernetes.io/service-name": "gpu-aware"}},
                     "addressType": "IPv4", "ports": [{"name": "http", "port": int(port), "protocol": "TCP"}],
                     "endpoints": [{"addresses": [host], "conditions": {"ready": True}}]})
    _apply(cluster, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "gpu-aware-plugin", "namespace": namespace},
                     "data": {"scoreWeight": "1", "lossWeight": "1"}})
    out = cluster.kubectl("-n", namespace, "get", "service", "gpu-aware", "-o", "jsonpath={.spec.clusterIP}", check=True)
    return "http://%s:8080" % out.stdout.strip()


def test_playbooks_enable_and_disable(cluster, extender, gpu_node, pristine):
    """The role finds the Service (as the manual does), sets the weights, patches, verifies; then disables."""
    original = _snapshot()
    namespace = gpu_node["namespace"]
    url = _gpu_aware_service(cluster, namespace, extender)
    out = _playbook(cluster, "enable_gpu_aware", "-e", "gpu_aware_namespace=" + namespace,
                    "-e", "gpu_aware_score_weight=3", "-e", "gpu_aware_loss_weight=2",
                    "-e", "gpu_aware_backup_dir=" + pristine)
    assert "calls gpu-aware at " + url in out
    assert _with_config(True)
    with open(CONFIG) as handle:
        assert "urlPrefix: " + url in handle.read()
    data = json.loads(cluster.kubectl("-n", namespace, "get", "configmap", "gpu-aware-plugin", "-o",
                                      "jsonpath={.data}", check=True).stdout)
    assert data == {"scoreWeight": "3", "lossWeight": "2"}
    _gpu_pod(cluster, gpu_node, "playbook-extender")
    assert extender.calls("playbook-extender")      # the real scheduler reached it through the Service
    again = _playbook(cluster, "enable_gpu_aware", "-e", "gpu_aware_namespace=" + namespace,
                      "-e", "gpu_aware_backup_dir=" + pristine)
    assert [host for host, c in recap(again).items() if c["changed"]] == []
    out = _playbook(cluster, "disable_gpu_aware", "-e", "gpu_aware_backup_dir=" + pristine)
    assert "runs without the gpu-aware extender" in out
    assert _with_config(False) and _snapshot() == original
