# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""operator-controller against a real kube-apiserver, under the chart's own RBAC (issue 24).

A private control plane (controlplane.py: etcd, kube-apiserver, garbage
collector; no nodes run pods, so no shared cluster is needed) gets the
metax-operator chart's CRDs, RBAC and ClusterOperator; two controller
replicas run as processes with the chart service account's token. Then:

- the CR is reconciled into the Extensions chart's objects, owned by the CR,
  gpu-device gated on gpu.installed;
- a `kubectl patch` of devicePlugin.healthyInterval changes gpu-device only
  (time printed), bad values are refused by the API server;
- the active replica (the Lease's holder) is SIGKILLed: the standby takes the
  Lease and applies the next patch (time printed, the issue's bound is 15 s)
  and no object is duplicated;
- deploy: false removes a component's objects and what it wrote on nodes;
- drift: an edited or deleted owned DaemonSet or ServiceAccount is put back
  without a CR change (times printed);
- dataExporter.deploy: true adds gpu-exporter's DaemonSet, Service and
  dashboard ConfigMap (owned by the CR); the Prometheus operator's CRDs
  (tests/integration/fixtures/) applied later add its ServiceMonitor and
  PrometheusRule without a CR change, a deleted one is put back;
  deploy: false removes them all; the CRDs deleted, a CR change is still
  reconciled and no controller died;
- idle: no status or object writes (the leader's Lease renewals counted and printed);
- the CR is cluster-scoped (`kubectl get` without -n, the sample's `kubectl patch -n`),
  one replica holds the Lease metax-operator-controller, only our CRD exists;
- an edit of gpu-aware-plugin and of driver-config is kept (a CR change
  included); a later change of driver.vfnumsConfig is not applied: a
  VfnumsConfigNotApplied condition and a Warning Event that `kubectl describe
  clusteroperator cluster-operator` shows;
- deleting the CR leaves no object and no metax-tech.com/ node label or
  annotation; with every controller down, the chart's --cleanup hook does it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import yaml
from controlplane import ControlPlane, free_port, lib_dir
from polling import wait_until

from ansible_collections.metax.gpu.plugins.module_utils import names as N
from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator.components import REGISTRY

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CHART = os.path.join(ROOT, "files", "charts", "metax-operator")
CHAIN_OFF = ("runtime.deploy=false", "driver.deploy=false", "maca.deploy=false")
EXTENSIONS = os.path.join(ROOT, "files", "charts", "metax-gpu-extensions")
MONITORING_CRDS = os.path.join(ROOT, "tests", "integration", "fixtures", "prometheus-operator-crds")
NS = N.OPERATOR_NAMESPACE
MODULE = "ansible_collections.metax.gpu.plugins.module_utils.agents.operator_controller"
CHART_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ClusterOperator")
_SPEC = importlib.util.spec_from_file_location("gen_operator_rbac", os.path.join(ROOT, "scripts", "gen_operator_rbac.py"))
gen_operator_rbac = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(gen_operator_rbac)
GPU_LABELS = {N.LABEL_GPU_INSTALLED: "true", N.LABEL_GPU_PRODUCT: "C500", N.LABEL_DRIVER_READY: "true"}


LOGS = []   # callables giving context when a wait times out (the controllers' logs)


def wait(predicate, timeout, what, interval=0.2):
    return wait_until(predicate, timeout, what, interval=interval, diagnose=LOGS)


class Env:
    def __init__(self, cp):
        self.cp = cp
        self.helm = os.path.join(lib_dir("helm_bin_dir"), "helm")
        self.controllers = {}
        self.ports = {}

    def get(self, *args):
        res = self.cp.kubectl("get", "-o", "json", *args)
        return json.loads(res.stdout) if res.returncode == 0 else None

    def ok(self, *args, **kwargs):
        res = self.cp.kubectl(*args, **kwargs)
        assert res.returncode == 0, res.stderr
        return res

    def chart_objects(self, *sets):
        args = [self.helm, "template", "metax-operator", CHART, "-n", NS]
        for pair in sets:
            args += ["--set", pair]
        out = subprocess.run(args, capture_output=True, text=True, check=True, timeout=60).stdout
        return [o for o in yaml.safe_load_all(out) if o and o["kind"] in CHART_KINDS]

    def start_controller(self, name):
        kubeconfig = os.path.join(self.cp.dir, "controller.kubeconfig")
        if not os.path.exists(kubeconfig):
            token = self.ok("-n", NS, "create", "token", "operator-controller", "--duration=2h").stdout.strip()
            self.cp.write_kubeconfig(kubeconfig, token)
        env = dict(os.environ, PYTHONWARNINGS="ignore")
        log = open(os.path.join(self.cp.dir, name + ".log"), "w")
        self.ports[name] = (free_port(), free_port())
        proc = subprocess.Popen(
            [sys.executable, "-m", MODULE, "--kubeconfig", kubeconfig, "--namespace", NS,
             "--chart-dir", EXTENSIONS, "--helm", self.helm,
             "--crd", os.path.join(CHART, "crds", "clusteroperator.yaml"),
             "--health-port", str(self.ports[name][0]), "--metrics-port", str(self.ports[name][1]), "--log-dir=", "--log-format=text"],
            env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.controllers[name] = proc
        return proc

    def logs(self, lines=12):
        out = []
        for name in self.controllers:
            with open(os.path.join(self.cp.dir, name + ".log")) as fh:
                tail = [line for line in fh.read().splitlines() if "Insecure" not in line and "warnings.warn" not in line]
            out.append("--- controller %s:\n%s" % (name, "\n".join(tail[-lines:])))
        return "\n".join(out)

    def cr_metadata(self):
        """What holds a ClusterOperator that does not go (diagnostics)."""
        meta = (self.get("clusteroperator", N.OPERATOR_CR_NAME) or {}).get("metadata") or {}
        return "--- ClusterOperator: %s" % {k: meta.get(k) for k in ("deletionTimestamp", "finalizers", "resourceVersion")}

    def identity(self, name):
        """The Lease holderIdentity of controller ``name`` (a process outside a pod: host_pid)."""
        return "%s_%d" % (socket.gethostname(), self.controllers[name].pid)

    def leader(self):
        """The controller holding the Lease (None: none)."""
        holder = ((self.get("lease", N.OPERATOR_LEADER_LEASE, "-n", NS) or {}).get("spec") or {}).get("holderIdentity")
        return next((n for n, p in self.controllers.items() if p.poll() is None and self.identity(n) == holder), None)

    def reconciles(self, name):
        return open(os.path.join(self.cp.dir, name + ".log")).read().count("reconciled:")

    def daemonsets(self):
        items = (self.get("daemonsets", "-n", NS) or {"items": []})["items"]
        return {d["metadata"]["name"]: d for d in items}

    def patch(self, spec):
        return self.cp.kubectl("-n", NS, "patch", "clusteroperator", N.OPERATOR_CR_NAME, "--type=merge",
                               "-p", json.dumps({"spec": spec}))

    def node_metax(self):
        return {n["metadata"]["name"]: {k: v for part in ("labels", "annotations")
                                        for k, v in (n["metadata"].get(part) or {}).items()
                                        if k.startswith(N.PREFIX)}
                for n in self.get("nodes")["items"]}


@pytest.fixture(scope="module")
def env():
    cp = ControlPlane().start()
    e = Env(cp)
    LOGS[:] = [e.logs, e.cr_metadata]
    try:
        e.ok("apply", "--server-side", "-f", os.path.join(CHART, "crds"))
        e.ok("create", "namespace", NS)
        for name, labels in (("gpu-a", GPU_LABELS), ("gpu-b", GPU_LABELS), ("cpu", {})):
            node = {"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": name, "labels": dict(labels, **{"kubernetes.io/os": "linux"}),
                                 "annotations": {N.ANNOTATION_DEVICES: "[]"} if labels else {}}}
            e.ok("create", "-f", "-", input=json.dumps(node))
        wait(lambda: e.cp.kubectl("get", "crd", "clusteroperators.gpu.metax-tech.com").returncode == 0, 30, "CRD")
        # gpu-label and gpu-device (the chain components, on by default since issue 38, are off here)
        objects = e.chart_objects("registry=127.0.0.1:5000/metax-gpu", "imageTag=test", *CHAIN_OFF)
        # no -n: the events Role is in namespace default, the ClusterOperator in none
        e.ok("apply", "-f", "-", input=yaml.safe_dump_all(objects))
        for name in ("a", "b"):
            e.start_controller(name)
        yield e
    finally:
        for proc in e.controllers.values():
            if proc.poll() is None:
                proc.kill()
        cp.stop()


def test_reconciled_into_owned_gated_objects(env):
    ds = wait(lambda: len(env.daemonsets()) == 2 and env.daemonsets(), 60, "gpu-device and gpu-label")
    device = ds["metax-gpu-device"]
    assert device["metadata"]["ownerReferences"][0]["kind"] == N.OPERATOR_KIND
    assert device["spec"]["template"]["spec"]["nodeSelector"] == {N.LABEL_GPU_INSTALLED: "true"}
    assert device["spec"]["template"]["spec"]["containers"][0]["image"] == "127.0.0.1:5000/metax-gpu/gpu-device:test"
    roles = env.get("clusterroles", "-l", N.LABEL_OPERATOR_OWNER)["items"]
    assert sorted(r["metadata"]["name"] for r in roles) == ["metax-gpu-gpu-device", "metax-gpu-gpu-label"]
    cr = wait(lambda: (env.get("clusteroperator", N.OPERATOR_CR_NAME, "-n", NS) or {}).get("status") and
              env.get("clusteroperator", N.OPERATOR_CR_NAME, "-n", NS), 30, "status")
    assert cr["status"]["nodes"]["gpu"] == 2 and cr["status"]["nodes"]["total"] == 3
    # every registered component, deployed or not, in chain order
    assert [c["name"] for c in cr["status"]["components"]] == [c.name for c in REGISTRY]
    printed = env.ok("get", "clusteroperator", "-n", NS).stdout
    assert re.search(r"cluster-operator\s+(True|False)\s+\S+\s+2\s+", printed), printed


def test_rbac_is_the_committed_table_least_privilege(env):
    """The live rights of every service account = docs/operator-rbac.md (scripts/gen_operator_rbac.py)."""
    optional = gen_operator_rbac.OPTIONAL_COMPONENTS
    assert env.patch({key: {"deploy": True} for key in optional}).returncode == 0
    wait(lambda: env.get("deployment", "gpu-aware", "-n", NS), 30, "gpu-aware deployed")
    for binding in optional.values():
        wait(lambda b=binding: env.get("clusterrolebinding", b), 30, "%s applied" % binding)
    live, problems = gen_operator_rbac.check(lambda args: env.ok(*args).stdout, NS)
    if os.environ.get("METAX_WRITE_RBAC_TABLE") == "1":   # a developer regenerating the table from this run
        gen_operator_rbac.write(live)
    assert env.patch({key: {"deploy": False} for key in optional}).returncode == 0
    wait(lambda: not env.get("deployment", "gpu-aware", "-n", NS), 30, "gpu-aware removed")
    for binding in optional.values():
        wait(lambda b=binding: not env.get("clusterrolebinding", b), 30, "%s removed" % binding)
    assert "| nodes |" in live and "### gpu-aware" in live and "### gpu-dra" in live and "### vfio-manager" in live
    assert not problems, "%s\n%s" % (problems, live)


def test_health_and_metrics_endpoints(env):
    for name, (health, metrics) in env.ports.items():
        assert env.controllers[name].poll() is None, env.logs()
        for port, path, expect in ((health, "/healthz", "{"), (metrics, "/metrics", "process_resident_memory_bytes")):
            body = wait(lambda: _http(port, path), 30, "%s of controller %s" % (path, name))
            assert expect in body, body[:300]


def _http(port, path):
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=5) as resp:
            return resp.read().decode() if resp.status == 200 else None
    except OSError:
        return None


def test_patch_changes_gpu_device_only_and_bad_values_are_refused(env):
    before = {n: d["metadata"]["generation"] for n, d in env.daemonsets().items()}
    start = time.monotonic()
    assert env.patch({"devicePlugin": {"healthyInterval": 3}}).returncode == 0
    wait(lambda: env.daemonsets()["metax-gpu-device"]["metadata"]["generation"] > before["metax-gpu-device"], 15, "metax-gpu-device")
    print("\npatch -> gpu-device changed in %.2fs" % (time.monotonic() - start))
    after = env.daemonsets()
    assert "--healthy-interval=3" in after["metax-gpu-device"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert after["metax-gpu-label"]["metadata"]["generation"] == before["metax-gpu-label"]
    generation = env.get("clusteroperator", N.OPERATOR_CR_NAME, "-n", NS)["metadata"]["generation"]
    for bad, field in (({"driver": {"deployPolicy": "Sometimes"}}, "deployPolicy"),
                       ({"devicePlugin": {"healthyInterval": -1}}, "healthyInterval")):
        res = env.patch(bad)
        assert res.returncode != 0 and field in res.stderr, res.stderr
    assert env.get("clusteroperator", N.OPERATOR_CR_NAME, "-n", NS)["metadata"]["generation"] == generation


def test_drift_of_owned_objects_is_repaired(env):
    """An edited or deleted owned object is put back by the active controller, without a CR change."""
    generation = env.get("clusteroperator", N.OPERATOR_CR_NAME, "-n", NS)["metadata"]["generation"]
    start = time.monotonic()
    env.ok("-n", NS, "patch", "daemonset", "metax-gpu-device", "--type=json", "-p", json.dumps(
        [{"op": "replace", "path": "/spec/template/spec/nodeSelector", "value": {"edited": "by-hand"}}]))
    wait(lambda: env.daemonsets()["metax-gpu-device"]["spec"]["template"]["spec"]["nodeSelector"] ==
         {N.LABEL_GPU_INSTALLED: "true"}, 15, "the edited gpu-device DaemonSet put back")
    edited = time.monotonic() - start
    uid = env.daemonsets()["metax-gpu-label"]["metadata"]["uid"]
    start = time.monotonic()
    env.ok("-n", NS, "delete", "daemonset", "metax-gpu-label", "--wait=false")
    recreated = wait(lambda: (env.daemonsets().get("metax-gpu-label") or {"metadata": {"uid": uid}})["metadata"]["uid"]
                     != uid and env.daemonsets()["metax-gpu-label"], 15, "the deleted gpu-label DaemonSet recreated")
    deleted = time.monotonic() - start
    assert recreated["metadata"]["ownerReferences"][0]["kind"] == N.OPERATOR_KIND
    env.ok("-n", NS, "delete", "serviceaccount", "gpu-device", "--wait=false")
    wait(lambda: env.get("serviceaccount", "gpu-device", "-n", NS), 15, "the deleted ServiceAccount recreated")
    print("\ndrift: edited DaemonSet put back in %.2fs, deleted DaemonSet recreated in %.2fs" % (edited, deleted))
    assert env.get("clusteroperator", N.OPERATOR_CR_NAME, "-n", NS)["metadata"]["generation"] == generation
    metrics = [_http(port, "/metrics") or "" for _health, port in env.ports.values()]
    assert any('metax_operator_drift_repairs_total{action="recreated",kind="DaemonSet"} 1.0' in m
               for m in metrics), [m for m in metrics if "drift" in m]


def test_idle_controller_writes_no_status_or_objects(env):
    time.sleep(6)  # one status round after the last change
    cr = env.get("clusteroperator", N.OPERATOR_CR_NAME, "-n", NS)
    ds = {n: d["metadata"]["resourceVersion"] for n, d in env.daemonsets().items()}
    lease = env.get("lease", N.OPERATOR_LEADER_LEASE, "-n", NS)["metadata"]["resourceVersion"]
    heartbeats = 0
    for _second in range(20):
        time.sleep(1)
        now = env.get("lease", N.OPERATOR_LEADER_LEASE, "-n", NS)["metadata"]["resourceVersion"]
        heartbeats += now != lease
        lease = now
    assert env.get("clusteroperator", N.OPERATOR_CR_NAME, "-n", NS)["metadata"]["resourceVersion"] == \
        cr["metadata"]["resourceVersion"]
    assert {n: d["metadata"]["resourceVersion"] for n, d in env.daemonsets().items()} == ds
    print("\nidle 20 s: 0 CR/object writes; Lease renewals (the leader's): %d" % heartbeats)


def test_the_cr_is_cluster_scoped_and_one_replica_leads(env):
    res = env.ok("get", "clusteroperator", N.OPERATOR_CR_NAME, "-o", "json")   # no -n, as on a real install
    assert "namespace" not in json.loads(res.stdout)["metadata"]
    # the sample's command, -n included (kubectl ignores it for a cluster-scoped kind)
    res = env.patch({"vfioManager": {"deploy": False}})
    assert res.returncode == 0 and "patched" in res.stdout, res.stderr
    assert env.get("clusteroperator", N.OPERATOR_CR_NAME)["spec"]["vfioManager"]["deploy"] is False
    wait(env.leader, 30, "a leader")
    lease = env.get("lease", N.OPERATOR_LEADER_LEASE, "-n", NS)["spec"]
    assert lease["leaseDurationSeconds"] == 8 and lease["holderIdentity"] == env.identity(env.leader())
    crds = {c["metadata"]["name"] for c in env.get("crd")["items"]}
    assert crds == {"clusteroperators.gpu.metax-tech.com"}, crds


def test_administrator_owned_objects_are_kept_and_a_vfnums_change_is_refused_with_an_event(env):
    driver = {"deploy": True, "payload": {"version": "2.29.0.13"}, "vfnumsConfig": {"gpu-a": {"vfnum": 2}}}
    assert env.patch({"gpuAware": {"deploy": True}, "driver": driver}).returncode == 0
    try:
        wait(lambda: env.get("configmap", N.GPU_AWARE_CONFIGMAP, "-n", NS), 30, "gpu-aware-plugin")
        config = wait(lambda: env.get("configmap", N.DRIVER_CONFIGMAP, "-n", NS), 30, "driver-config")
        assert "vfnum: 2" in config["data"]["node-vfnums"]
        env.ok("-n", NS, "patch", "configmap", N.GPU_AWARE_CONFIGMAP, "--type=merge",
               "-p", json.dumps({"data": {"scoreWeight": "3", "lossWeight": "0.5"}}))
        edited_vfnums = "nodes:\n  gpu-a:\n    vfnum: 8\n"
        env.ok("-n", NS, "patch", "configmap", N.DRIVER_CONFIGMAP, "--type=merge",
               "-p", json.dumps({"data": {"node-vfnums": edited_vfnums}}))
        # a CR change reconciles every component; the vfnumsConfig change is the one refused
        driver["vfnumsConfig"] = {"gpu-a": {"vfnum": 4}}
        assert env.patch({"driver": driver}).returncode == 0

        def noted():
            conditions = (env.get("clusteroperator", N.OPERATOR_CR_NAME).get("status") or {}).get("conditions") or []
            return next((c for c in conditions if c["type"] == "VfnumsConfigNotApplied"), None)
        cond = wait(noted, 30, "the VfnumsConfigNotApplied condition")
        assert cond["status"] == "True" and "kubectl -n %s edit configmap driver-config" % NS in cond["message"]
        described = wait(lambda: "VfnumsConfigNotApplied" in env.ok(
            "describe", "clusteroperator", N.OPERATOR_CR_NAME).stdout and env.ok(
            "describe", "clusteroperator", N.OPERATOR_CR_NAME).stdout, 30, "the Warning Event in describe")
        assert "Warning" in described
        events = env.get("events", "-n", "default", "--field-selector", "reason=VfnumsConfigNotApplied")["items"]
        assert len(events) == 1 and "namespace" not in events[0]["involvedObject"]
        time.sleep(6)   # one more status round and the drift watch: nothing put back
        assert env.get("configmap", N.GPU_AWARE_CONFIGMAP, "-n", NS)["data"] == {"scoreWeight": "3", "lossWeight": "0.5"}
        assert env.get("configmap", N.DRIVER_CONFIGMAP, "-n", NS)["data"]["node-vfnums"] == edited_vfnums
        # everything else is still put back
        env.ok("-n", NS, "patch", "deployment", "gpu-aware", "--type=merge", "-p", json.dumps({"spec": {"replicas": 3}}))
        wait(lambda: env.get("deployment", "gpu-aware", "-n", NS)["spec"]["replicas"] == 1, 15,
             "gpu-aware's Deployment put back")
    finally:
        assert env.patch({"gpuAware": {"deploy": False}, "driver": {"deploy": False}}).returncode == 0
        wait(lambda: not env.get("deployment", "gpu-aware", "-n", NS), 30, "gpu-aware removed")


def test_killed_active_replica_is_replaced(env):
    active = env.leader()
    assert active and env.reconciles(active) >= 1, env.logs()
    standby = next(n for n in env.controllers if n != active)
    rss = int(re.search(r"VmRSS:\s+(\d+)", open("/proc/%d/status" % env.controllers[active].pid).read()).group(1))
    before = env.daemonsets()["metax-gpu-device"]["metadata"]["generation"]
    standby_runs = env.reconciles(standby)
    env.controllers[active].send_signal(signal.SIGKILL)
    env.controllers[active].wait()
    start = time.monotonic()
    assert env.patch({"devicePlugin": {"healthyInterval": 4}}).returncode == 0
    wait(lambda: env.daemonsets()["metax-gpu-device"]["metadata"]["generation"] > before, 15, "the standby's reconcile")
    print("\nactive replica (RSS %d MiB) SIGKILLed: the standby applied the patch after %.1fs"
          % (rss // 1024, time.monotonic() - start))
    # "reconciled:" is logged after the whole pass (every component's apply and prune), a moment after
    # gpu-device's DaemonSet changed
    wait(lambda: env.reconciles(standby) > standby_runs, 15, "the standby's reconcile logged")
    assert "--healthy-interval=4" in env.daemonsets()["metax-gpu-device"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert sorted(env.daemonsets()) == ["metax-gpu-device", "metax-gpu-label"]
    env.start_controller(active)  # two replicas again for the next tests


def test_deploy_false_removes_the_component_and_its_node_labels(env):
    assert env.patch({"labelgen": {"deploy": False}}).returncode == 0
    wait(lambda: "metax-gpu-label" not in env.daemonsets(), 15, "gpu-label removed")
    wait(lambda: all(N.LABEL_GPU_PRODUCT not in m for m in env.node_metax().values()), 15, "gpu.* labels removed")
    assert not env.get("serviceaccounts", "gpu-label", "-n", NS)
    # gpu-device's annotations stay: it is still deployed
    assert N.ANNOTATION_DEVICES in env.node_metax()["gpu-a"]
    assert env.patch({"labelgen": {"deploy": True}}).returncode == 0
    wait(lambda: "metax-gpu-label" in env.daemonsets(), 15, "gpu-label back")


def test_an_upgraded_controller_deletes_its_objects_under_former_names(env):
    """Issue 38 renamed the DaemonSets (gpu-device -> metax-gpu-device): objects an earlier version applied,
    with this CR's owner label and an earlier component name, go at the next reconcile (a device plugin
    left beside the new one would register the resource twice); nothing current is touched."""
    cr = env.get("clusteroperator", N.OPERATOR_CR_NAME, "-n", NS)
    current = {n: d["metadata"]["uid"] for n, d in env.daemonsets().items()}
    labels = {N.LABEL_OPERATOR_OWNER: cr["metadata"]["uid"], "app.kubernetes.io/name": "gpu-device"}
    former = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "former-gpu-device", "namespace": NS,
                                                                    "labels": labels}},
        {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "gpu-device", "namespace": NS,
                                                                    "labels": labels},
         "spec": {"selector": {"matchLabels": {"app": "former-gpu-device"}}, "template": {
             "metadata": {"labels": {"app": "former-gpu-device"}},
             "spec": {"nodeSelector": {"former": "none"},
                      "containers": [{"name": "gpu-device", "image": "registry.invalid/gpu-device:0"}]}}}},
    ]
    res = env.cp.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": former}))
    assert res.returncode == 0, res.stderr
    assert "gpu-device" in env.daemonsets()
    assert env.patch({"devicePlugin": {"healthyInterval": 6}}).returncode == 0
    wait(lambda: "gpu-device" not in env.daemonsets(), 15, "the former gpu-device DaemonSet deleted")
    wait(lambda: not env.get("serviceaccount", "former-gpu-device", "-n", NS), 15, "its ServiceAccount deleted")
    assert {n: d["metadata"]["uid"] for n, d in env.daemonsets().items()} == current


def test_data_exporter_deploys_gpu_exporter_and_removes_it(env):
    # the real product's field (ClusterOperator dataExporter), off by default
    assert "metax-gpu-exporter" not in env.daemonsets()
    assert env.patch({"dataExporter": {"deploy": True, "service": {"port": 30445}}}).returncode == 0
    ds = wait(lambda: env.daemonsets().get("metax-gpu-exporter"), 15, "gpu-exporter deployed")
    assert ds["metadata"]["ownerReferences"][0]["kind"] == N.OPERATOR_KIND
    assert ds["spec"]["template"]["spec"]["nodeSelector"] == {N.LABEL_GPU_INSTALLED: "true"}
    container = ds["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "127.0.0.1:5000/metax-gpu/gpu-exporter:test"
    assert "--port=30445" in container["args"]
    service = wait(lambda: env.get("service", "gpu-exporter", "-n", NS), 15, "its Service")
    assert service["spec"]["ports"][0]["port"] == 30445
    dashboard = wait(lambda: env.get("configmap", "gpu-exporter-dashboard", "-n", NS), 15, "its dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["metax-gpu.json"])["panels"]
    # no Prometheus operator: no ServiceMonitor or PrometheusRule, and the reconcile succeeded
    assert env.cp.kubectl("get", "crd", "servicemonitors.monitoring.coreos.com").returncode != 0
    generation = env.get("clusteroperator", N.OPERATOR_CR_NAME, "-n", NS)["metadata"]["generation"]
    start = time.monotonic()
    env.ok("apply", "--server-side", "-f", MONITORING_CRDS)
    monitor = wait(lambda: env.get("servicemonitor", "gpu-exporter", "-n", NS), 30, "the ServiceMonitor")
    rule = wait(lambda: env.get("prometheusrule", "gpu-exporter", "-n", NS), 15, "the PrometheusRule")
    created = time.monotonic() - start
    for obj in (monitor, rule):
        assert obj["metadata"]["ownerReferences"][0]["kind"] == N.OPERATOR_KIND
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    assert env.get("clusteroperator", N.OPERATOR_CR_NAME, "-n", NS)["metadata"]["generation"] == generation
    uid = monitor["metadata"]["uid"]
    start = time.monotonic()
    env.ok("-n", NS, "delete", "servicemonitor", "gpu-exporter", "--wait=false")
    wait(lambda: (env.get("servicemonitor", "gpu-exporter", "-n", NS) or {"metadata": {"uid": uid}})["metadata"][
        "uid"] != uid, 15, "the deleted ServiceMonitor recreated")
    print("\nmonitoring CRDs applied -> ServiceMonitor and PrometheusRule in %.2fs (no CR change); "
          "deleted ServiceMonitor recreated in %.2fs" % (created, time.monotonic() - start))
    assert env.patch({"dataExporter": {"deploy": False}}).returncode == 0
    wait(lambda: "metax-gpu-exporter" not in env.daemonsets(), 15, "gpu-exporter removed")
    wait(lambda: not env.get("service", "gpu-exporter", "-n", NS), 15, "its Service removed")
    wait(lambda: not env.get("configmap", "gpu-exporter-dashboard", "-n", NS), 15, "its dashboard removed")
    wait(lambda: not env.get("servicemonitor", "gpu-exporter", "-n", NS), 15, "its ServiceMonitor removed")
    wait(lambda: not env.get("prometheusrule", "gpu-exporter", "-n", NS), 15, "its PrometheusRule removed")
    # the CRDs go again (their watches stop): the controllers carry on
    env.ok("delete", "--wait=true", "-f", MONITORING_CRDS)
    reconciled = sum(env.reconciles(n) for n in env.controllers)
    assert env.patch({"dataExporter": {"interval": 10}}).returncode == 0
    wait(lambda: sum(env.reconciles(n) for n in env.controllers) > reconciled, 15, "a reconcile without the CRDs")
    assert all(proc.poll() is None for proc in env.controllers.values()), env.logs()


def test_delete_leaves_nothing(env):
    env.ok("label", "node", "gpu-a", "gpu-b", N.LABEL_GPU_INSTALLED + "=true", "--overwrite")
    env.ok("-n", NS, "delete", "clusteroperator", N.OPERATOR_CR_NAME, "--wait=false")
    wait(lambda: not env.get("clusteroperator", N.OPERATOR_CR_NAME), 60, "the ClusterOperator gone")
    wait(lambda: not env.daemonsets(), 30, "DaemonSets gone")
    wait(lambda: not env.get("clusterroles", "-l", N.LABEL_OPERATOR_OWNER)["items"], 30, "ClusterRoles gone")
    assert env.node_metax() == {"gpu-a": {}, "gpu-b": {}, "cpu": {}}


def test_cleanup_hook_works_with_every_controller_down(env):
    cr = [o for o in env.chart_objects(*CHAIN_OFF) if o["kind"] == "ClusterOperator"]
    env.ok("apply", "-n", NS, "-f", "-", input=yaml.safe_dump_all(cr))
    wait(lambda: len(env.daemonsets()) == 2, 30, "reconciled again")
    env.ok("label", "node", "gpu-a", N.LABEL_GPU_INSTALLED + "=true", N.LABEL_GPU_PRODUCT + "=C500")
    for proc in env.controllers.values():
        proc.kill()
        proc.wait()
    kubeconfig = os.path.join(env.cp.dir, "controller.kubeconfig")
    res = subprocess.run([sys.executable, "-m", MODULE, "--cleanup", "--kubeconfig", kubeconfig, "--namespace", NS,
                          "--log-dir="], capture_output=True, text=True, timeout=300, check=False,
                         env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert res.returncode == 0, res.stderr[-3000:]
    assert env.get("clusteroperators", "-n", NS)["items"] == []
    wait(lambda: not env.daemonsets(), 30, "DaemonSets gone")
    assert env.node_metax() == {"gpu-a": {}, "gpu-b": {}, "cpu": {}}
