# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The GPU Operator scheme on the local three-node cluster (issue 24, manual section 3.2).

One helm install of files/charts/metax-operator (the manual's flags; the chart
from the checkout, not yet from oci://) shared by the module's tests, in order:

- the ClusterOperator becomes Ready, every GPU node's allocatable = its devices;
- per node the chain's steps appear in order (gpu-label pod, gpu.installed,
  gpu-device pod, allocatable); the timeline is printed and written to
  tests/output/operator-chain.json;
- a `kubectl patch` of devicePlugin.healthyInterval rolls gpu-device only;
  bad values are refused by the API server;
- every service account's rights = docs/operator-rbac.md (scripts/gen_operator_rbac.py);
- an edited and a deleted owned DaemonSet are put back (drift), and a healthy
  install made no repair;
- the active controller, killed mid-reconcile (frozen after gpu-label was
  applied, its pod force-deleted, SIGKILL), is replaced by the other replica
  within 15 s; the objects are then exactly a render of the CR, none and no
  pod duplicated;
- a node without MetaX GPUs gets gpu-label only (a hand-made Node: every
  preset of the local cluster has GPUs, and adding a node restarts the cluster);
- the manual's uninstall script (3.2.5), run with the controller scaled to 0,
  leaves no CR, no DaemonSet and no metax-tech.com/ label or annotation on any
  node (with the controller up: test_operator_controller_apiserver.py);
- dataExporter.deploy: true puts a gpu-exporter pod on every GPU node serving
  each of its GPUs, false removes it; with no Prometheus operator CRDs nothing
  fails, and once they are installed (tests/integration/fixtures/) the
  controller creates gpu-exporter's ServiceMonitor and PrometheusRule without a
  CR change, puts a deleted one back, and removes both with deploy: false; the
  CRDs removed again, it carries on without a restart.
- runtime.deploy: true (issue 26) puts a container-runtime pod on every GPU
  node and runtime.ready on it; the nodes' containerd configs (a copy of
  each node's own, and of a vendor-rewritten one) get only the runtime
  handler metax while it runs (none on the vendor's, which has its own),
  and are byte-identical, mode included, after deploy: false.

A GPU Extensions release found on the cluster is uninstalled first (two device
plugins must never register the same resource) and installed again afterwards
with the same values.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import threading
import time
import tomllib
import urllib.request

import pytest
from polling import wait_until

from ansible_collections.metax.gpu.plugins.module_utils import names as N
from ansible_collections.metax.gpu.plugins.module_utils.agents.operator_handlers import STATUS_INTERVAL
from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator import render

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CHART = os.path.join(ROOT, "files", "charts", "metax-operator")
EXTENSIONS_CHART = os.path.join(ROOT, "files", "charts", "metax-gpu-extensions")
OUTPUT = os.path.join(ROOT, "tests", "output")
MONITORING_CRDS = os.path.join(ROOT, "tests", "integration", "fixtures", "prometheus-operator-crds")
NS = N.OPERATOR_NAMESPACE
_SPEC = importlib.util.spec_from_file_location("gen_operator_rbac", os.path.join(ROOT, "scripts", "gen_operator_rbac.py"))
gen_operator_rbac = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(gen_operator_rbac)
READINESS = (N.LABEL_GPU_INSTALLED, N.LABEL_DRIVER_READY, N.LABEL_MACA_READY, N.LABEL_RUNTIME_READY)
# manual 3.2.5, as written
UNINSTALL_SCRIPT = """
chart=$(helm list -q -f "metax" -n metax-operator)
if [[ -n $chart ]]; then
helm uninstall $chart -n metax-operator --wait
fi
"""
pytestmark = pytest.mark.cluster


def helm(cluster, *args, **kwargs):
    kwargs.setdefault("timeout", 600)
    return subprocess.run([cluster.helm or "helm"] + list(args), env=cluster.env, capture_output=True, text=True,
                          check=False, stdin=subprocess.DEVNULL if "input" not in kwargs else None, **kwargs)


def nodes(cluster):
    return {n["metadata"]["name"]: n for n in cluster.read_nodes()}


def ours(node):
    meta = node["metadata"]
    return {k: v for part in ("labels", "annotations") for k, v in (meta.get(part) or {}).items()
            if k.startswith(N.PREFIX)}


def get_json(cluster, *args):
    res = cluster.kubectl("get", "-o", "json", *args)
    return json.loads(res.stdout) if res.returncode == 0 else None


@pytest.fixture(scope="module")
def no_extensions(cluster):
    """Uninstall a GPU Extensions release for the module's duration; install it again afterwards."""
    res = helm(cluster, "list", "-A", "-o", "json")
    assert res.returncode == 0, res.stderr
    found = [r for r in json.loads(res.stdout or "[]") if r["chart"].startswith("metax-gpu-extensions")]
    saved = []
    for release in found:
        values = helm(cluster, "get", "values", release["name"], "-n", release["namespace"], "-o", "json")
        saved.append((release, values.stdout))
        res = helm(cluster, "uninstall", release["name"], "-n", release["namespace"], "--wait")
        assert res.returncode == 0, res.stderr
    yield [release["name"] for release, _values in saved]
    for release, values in saved:
        helm(cluster, "install", release["name"], EXTENSIONS_CHART, "-n", release["namespace"], "--wait",
             "--values", "-", input=values)


class ChainWatch(threading.Thread):
    """When each step of the chain is first seen on each node, in seconds after the install started.

    Per poll the pods are read before the nodes: a gpu-device pod seen in a
    poll proves its node had gpu.installed before that node read, so the
    label's first-seen time can never come after the pod's.
    """

    def __init__(self, cluster):
        super().__init__(daemon=True)
        self.cluster = cluster
        self.start_time = time.monotonic()
        self.seen = {}
        self.stop = threading.Event()

    def _poll(self):
        try:
            pods = self.cluster.read_pods(NS)
            nodes_now = self.cluster.read_nodes()
        except Exception:  # pylint: disable=broad-except  # a poll that fails is retried 0.5 s later
            return
        now = round(time.monotonic() - self.start_time, 1)
        for pod in pods:
            component = (pod["metadata"].get("labels") or {}).get("app.kubernetes.io/name")
            node = pod["spec"].get("nodeName")
            if component in ("metax-gpu-label", "metax-gpu-device") and node:
                self.seen.setdefault((node, component + " pod"), now)
                if any(c["type"] == "Ready" and c["status"] == "True"
                       for c in (pod.get("status") or {}).get("conditions") or []):
                    self.seen.setdefault((node, component + " Ready"), now)
        for node in nodes_now:
            name = node["metadata"]["name"]
            labels = node["metadata"].get("labels") or {}
            for label in READINESS:
                if labels.get(label) == "true":
                    self.seen.setdefault((name, label), now)
            if int(node["status"].get("allocatable", {}).get(N.RESOURCE_NAME, "0")) > 0:
                self.seen.setdefault((name, "allocatable"), now)

    def run(self):
        while not self.stop.is_set():
            self._poll()
            self.stop.wait(0.5)

    def timeline(self):
        return sorted((t, node, step) for (node, step), t in self.seen.items())


def strip_ours(cluster):
    """Remove every metax-tech.com/ label and annotation from every node, as the cluster admin."""
    for name, node in nodes(cluster).items():
        meta = node["metadata"]
        patch = {part: {k: None for k in (meta.get(part) or {}) if k.startswith(N.PREFIX)}
                 for part in ("labels", "annotations")}
        if any(patch.values()):
            cluster.kubectl("patch", "node", name, "--type=merge", "-p", json.dumps({"metadata": patch}),
                            check=True)


@pytest.fixture(scope="module")
def installed(cluster, images, no_extensions):
    before = {name: ours(node) for name, node in nodes(cluster).items()}
    # The chain is timed from nodes without our keys: agents run by earlier
    # modules (and a plain `helm uninstall` of Extensions) leave gpu-label's
    # labels behind, which would be "seen" before the operator started.
    strip_ours(cluster)
    watch = ChainWatch(cluster)
    watch.start()
    res = helm(cluster, "install", CHART, "--create-namespace", "-n", NS, "--generate-name", "--wait",
               "--set", "registry=" + images["registry"], "--set-string", "imageTag=" + images["tag"],
               "--set", "hostRoot.path=/var/lib/metax-sim", "--set", "hostRoot.subPathExpr=$(NODE_NAME)",
               "--set", "log.dir=", "--set", "gpuDevice.healthyInterval=2",
               # the node-agent admission policy (issue 30) on, not only where auto finds it: the agents
               # must do their work under it, and an install where it did not render must fail here
               "--set", "nodeAgentPolicy.enabled=true",
               # this module times gpu-label and gpu-device alone (the chain components are switched on by
               # their own tests: runtime here, the driver and MACA in their modules); on by default since issue 38
               "--set", "runtime.deploy=false", "--set", "driver.deploy=false", "--set", "maca.deploy=false")
    assert res.returncode == 0, "helm install failed:\n%s\n%s" % (res.stdout, res.stderr)
    info = {"before": before, "watch": watch, "helm_seconds": round(time.monotonic() - watch.start_time, 1)}
    yield info
    watch.stop.set()
    cluster.kubectl("scale", "deployment", "operator-controller", "-n", NS, "--replicas=2")
    subprocess.run(["bash", "-c", UNINSTALL_SCRIPT], env=cluster.env, capture_output=True, timeout=600,
                   check=False)


def patch_cr(cluster, spec):
    return cluster.kubectl("patch", "clusteroperator", N.OPERATOR_CR_NAME, "-n", NS, "--type=merge",
                           "-p", json.dumps({"spec": spec}))


def cr(cluster):
    return get_json(cluster, "clusteroperator", N.OPERATOR_CR_NAME, "-n", NS)


def cr_ready(cluster):
    body = cr(cluster) or {}
    return any(c["type"] == "Ready" and c["status"] == "True" for c in (body.get("status") or {}).get("conditions", []))


def gpu_nodes_allocatable(cluster):
    out = {}
    for name, node in nodes(cluster).items():
        labels = node["metadata"].get("labels") or {}
        if labels.get(N.LABEL_GPU_INSTALLED) != "true":
            continue
        count = int(labels.get(N.LABEL_GPU_COUNT, "0"))
        vfnum = int(labels.get(N.LABEL_GPU_VFNUM, "0"))
        out[name] = (int(node["status"].get("allocatable", {}).get(N.RESOURCE_NAME, "0")),
                     count * vfnum if vfnum else count)
    return out


def test_install_brings_every_gpu_node_to_its_devices(cluster, installed):
    wait_until(lambda: cr_ready(cluster), 240, "ClusterOperator Ready")
    wait_until(lambda: gpu_nodes_allocatable(cluster) and all(
        a == want > 0 for a, want in gpu_nodes_allocatable(cluster).values()), 120, "allocatable = devices",
        diagnose=[lambda: "(allocatable, devices) per GPU node: %s" % gpu_nodes_allocatable(cluster),
                  lambda: cluster.kubectl("get", "pods", "-A", "-o", "wide").stdout])
    alloc = gpu_nodes_allocatable(cluster)
    assert len(alloc) == len(cluster.nodes) >= 3, alloc
    total = time.monotonic() - installed["watch"].start_time
    body = cr(cluster)
    print("\nhelm install --wait: %ss; every GPU node allocatable after %.1fs" % (installed["helm_seconds"], total))
    print("status: %s" % json.dumps(body["status"]["conditions"]))
    components = {c["name"]: c for c in body["status"]["components"]}
    assert components["metax-gpu-device"]["ready"] == len(alloc)
    assert components["gpu-aware"]["deployed"] is False
    # the chain today: gpu.installed gates gpu-device (no runtime/MACA component deployed yet)
    ds = get_json(cluster, "daemonset", "metax-gpu-device", "-n", NS)
    assert ds["spec"]["template"]["spec"]["nodeSelector"] == {N.LABEL_GPU_INSTALLED: "true"}
    assert ds["metadata"]["ownerReferences"][0]["kind"] == N.OPERATOR_KIND


def test_readiness_labels_appear_in_chain_order(cluster, installed):
    """Per GPU node: gpu-label's pod, then gpu.installed, then the gpu-device pod it gates, then allocatable.
    The timeline is printed and written to tests/output/operator-chain.json."""
    watch = installed["watch"]
    wait_until(lambda: all((n, "allocatable") in watch.seen for n in gpu_nodes_allocatable(cluster)), 60,
               "the watch to see every node allocatable")
    watch.stop.set()
    timeline = watch.timeline()
    os.makedirs(OUTPUT, exist_ok=True)
    with open(os.path.join(OUTPUT, "operator-chain.json"), "w") as fh:
        json.dump([{"seconds": t, "node": n, "step": step} for t, n, step in timeline], fh, indent=1)
    print("\nchain, first seen (s after helm install started):")
    for t, node, step in timeline:
        print("  %6.1f  %-6s %s" % (t, node, step))
    seen = watch.seen
    for node in gpu_nodes_allocatable(cluster):
        chain = [(node, "metax-gpu-label pod"), (node, N.LABEL_GPU_INSTALLED), (node, "metax-gpu-device pod"),
                 (node, "allocatable")]
        times = [seen.get(step) for step in chain]
        assert None not in times, (node, times)
        assert times == sorted(times), "out of chain order on %s: %s" % (node, list(zip(chain, times)))
        # gpu-label sets driver.ready with gpu.installed (no driver component yet)
        assert seen.get((node, N.LABEL_DRIVER_READY)) is not None


def test_patch_rolls_gpu_device_only(cluster, installed):
    wait_until(lambda: cr_ready(cluster), 240, "ClusterOperator Ready")
    before = {n: get_json(cluster, "daemonset", n, "-n", NS)["metadata"]["generation"]
              for n in ("metax-gpu-device", "metax-gpu-label")}
    start = time.monotonic()
    res = cluster.kubectl("patch", "clusteroperator", N.OPERATOR_CR_NAME, "-n", NS, "--type=merge",
                          "-p", '{"spec":{"devicePlugin":{"healthyInterval":3}}}')
    assert res.returncode == 0, res.stderr
    wait_until(lambda: get_json(cluster, "daemonset", "metax-gpu-device", "-n", NS)["metadata"]["generation"]
               > before["metax-gpu-device"], 30, "gpu-device to change", interval=0.2)
    print("\npatch -> gpu-device DaemonSet changed in %.1fs" % (time.monotonic() - start))
    ds = get_json(cluster, "daemonset", "metax-gpu-device", "-n", NS)
    assert "--healthy-interval=3" in ds["spec"]["template"]["spec"]["containers"][0]["args"]
    assert get_json(cluster, "daemonset", "metax-gpu-label", "-n", NS)["metadata"]["generation"] == before["metax-gpu-label"]


@pytest.mark.parametrize("patch,field", [({"driver": {"deployPolicy": "Sometimes"}}, "deployPolicy"),
                                         ({"devicePlugin": {"healthyInterval": -1}}, "healthyInterval")])
def test_bad_values_are_refused_by_the_api_server(cluster, installed, patch, field):
    generation = cr(cluster)["metadata"]["generation"]
    res = cluster.kubectl("patch", "clusteroperator", N.OPERATOR_CR_NAME, "-n", NS, "--type=merge",
                          "-p", json.dumps({"spec": patch}))
    assert res.returncode != 0 and field in res.stderr, res.stderr
    assert cr(cluster)["metadata"]["generation"] == generation


def test_rbac_on_the_cluster_is_the_committed_table(cluster, installed):
    """`kubectl auth can-i --list` per service account = docs/operator-rbac.md; no wildcard, no Secrets."""
    wait_until(lambda: cr_ready(cluster), 240, "ClusterOperator Ready")
    optional = gen_operator_rbac.OPTIONAL_COMPONENTS
    assert patch_cr(cluster, {key: {"deploy": True} for key in optional}).returncode == 0
    try:
        for binding in optional.values():
            wait_until(lambda b=binding: get_json(cluster, "clusterrolebinding", b), 30, "%s applied" % binding)

        def kubectl(args):
            return cluster.kubectl(*args, check=True).stdout
        live, problems = gen_operator_rbac.check(kubectl, NS)
    finally:
        assert patch_cr(cluster, {key: {"deploy": False} for key in optional}).returncode == 0
        wait_until(lambda: not get_json(cluster, "deployment", "gpu-aware", "-n", NS), 60, "gpu-aware removed")
        for binding in optional.values():
            wait_until(lambda b=binding: not get_json(cluster, "clusterrolebinding", b), 60, "%s removed" % binding)
    assert "### gpu-aware" in live and "### vfio-manager" in live and "| nodes |" in live
    assert not gen_operator_rbac.violations(live)
    assert not problems, "%s\n%s" % (problems, live)


def controller_pods(cluster):
    items = json.loads(cluster.kubectl("get", "pods", "-n", NS, "-l", "app.kubernetes.io/name=operator-controller",
                                       "-o", "json", check=True).stdout)["items"]
    return {p["metadata"]["name"]: p for p in items if not p["metadata"].get("deletionTimestamp")}


def active_controller(cluster):
    """The pod name of the active replica: the holder of the leader election's Lease, if it lives."""
    lease = get_json(cluster, "lease", N.OPERATOR_LEADER_LEASE, "-n", NS) or {}
    holder = (lease.get("spec") or {}).get("holderIdentity")
    return holder if holder in controller_pods(cluster) else None


def controller_logs(cluster, grep):
    out = []
    for name in controller_pods(cluster):
        res = cluster.kubectl("logs", "-n", NS, name)
        out += ["%s: %s" % (name, line) for line in res.stdout.splitlines() if grep in line]
    return "\n".join(out[-40:])


def reconciling(cluster):
    """kopf's progress annotations on the CR: present while a handler is retried."""
    annotations = cr(cluster)["metadata"].get("annotations") or {}
    return N.OPERATOR_GROUP + "/reconcile" in annotations   # the handler's id (kopf's touch-dummy stays)


def drift_repairs(cluster):
    """metax_operator_drift_repairs_total summed over every controller replica (its /metrics, by pod IP)."""
    total = 0.0
    for pod in controller_pods(cluster).values():
        ip = (pod.get("status") or {}).get("podIP")
        if not ip:
            continue
        with urllib.request.urlopen("http://%s:9400/metrics" % ip, timeout=10) as resp:
            for line in resp.read().decode().splitlines():
                if line.startswith("metax_operator_drift_repairs_total{"):
                    total += float(line.rsplit(" ", 1)[1])
    return total


def test_drift_of_owned_objects_is_repaired(cluster, installed):
    """An edited DaemonSet and a deleted one are put back without a CR change; a healthy install,
    with all its DaemonSet status events, made no repair (no false drift)."""
    wait_until(lambda: cr_ready(cluster), 240, "ClusterOperator Ready")
    # no reconcile still retrying (gpu-aware's removal waits for its pods): its applies would undo the edit first
    wait_until(lambda: not reconciling(cluster), 90, "no reconcile in progress")
    assert drift_repairs(cluster) == 0, controller_logs(cluster, "drift")
    generation = cr(cluster)["metadata"]["generation"]
    start = time.monotonic()
    cluster.kubectl("patch", "daemonset", "metax-gpu-device", "-n", NS, "--type=json", "-p", json.dumps(
        [{"op": "replace", "path": "/spec/template/spec/nodeSelector", "value": {"edited": "by-hand"}}]), check=True)
    wait_until(lambda: get_json(cluster, "daemonset", "metax-gpu-device", "-n", NS)["spec"]["template"]["spec"][
        "nodeSelector"] == {N.LABEL_GPU_INSTALLED: "true"}, 15, "the edited DaemonSet put back", interval=0.1)
    edited = time.monotonic() - start
    uid = get_json(cluster, "daemonset", "metax-gpu-label", "-n", NS)["metadata"]["uid"]
    start = time.monotonic()
    cluster.kubectl("delete", "daemonset", "metax-gpu-label", "-n", NS, "--wait=false", check=True)
    try:
        wait_until(lambda: (get_json(cluster, "daemonset", "metax-gpu-label", "-n", NS) or {"metadata": {"uid": uid}})[
            "metadata"]["uid"] != uid, 15, "the deleted DaemonSet recreated", interval=0.1)
    except pytest.fail.Exception:
        pytest.fail("the deleted DaemonSet was not recreated; controllers:\n" + controller_logs(cluster, ""))
    deleted = time.monotonic() - start
    print("\ndrift: edited DaemonSet put back in %.2fs, deleted DaemonSet recreated in %.2fs" % (edited, deleted))
    assert cr(cluster)["metadata"]["generation"] == generation
    # counted once the repair's apply returned, just after the object is back
    wait_until(lambda: drift_repairs(cluster) == 2, 10, "two repairs counted:\n" + controller_logs(cluster, "drift"))
    wait_until(lambda: cr_ready(cluster), 120, "ClusterOperator Ready again")


def test_the_cr_is_cluster_scoped_as_the_real_one(cluster, installed):
    """`kubectl get clusteroperator cluster-operator` without -n, as on a real 0.9.2 install, and the
    sample's `kubectl patch ... -n metax-operator` of a field we do not act on (vfioManager) succeeds;
    only our own CRD is installed (no kopf peering)."""
    res = cluster.kubectl("get", "clusteroperator", N.OPERATOR_CR_NAME, "-o", "json")
    assert res.returncode == 0, res.stderr
    assert "namespace" not in json.loads(res.stdout)["metadata"]
    res = cluster.kubectl("patch", "clusteroperator", N.OPERATOR_CR_NAME, "-n", NS, "--type=merge",
                          "-p", json.dumps({"spec": {"vfioManager": {"deploy": False}}}))
    assert res.returncode == 0 and "patched" in res.stdout, res.stderr
    assert cr(cluster)["spec"]["vfioManager"]["deploy"] is False
    crds = json.loads(cluster.kubectl("get", "crd", "-o", "json", check=True).stdout)["items"]
    assert "kopfpeerings.kopf.dev" not in {c["metadata"]["name"] for c in crds}
    lease = get_json(cluster, "lease", N.OPERATOR_LEADER_LEASE, "-n", NS)
    assert lease["spec"]["holderIdentity"] in controller_pods(cluster)


def gpu_aware_args(cluster):
    dep = get_json(cluster, "deployment", "gpu-aware", "-n", NS) or {}
    containers = ((dep.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or [{}]
    return containers[0].get("args") or []


# Each way the controller could put the weights back, and how long the test watches for it: the drift
# watch's event for the edit (at once), the status timer's rounds with their audit of owned objects
# (every STATUS_INTERVAL s; three rounds before the CR change and three after it) and the reconcile of
# a CR change, which applies every component again (watched until gpu-aware's Deployment shows that change).
# It watched a fixed 60 s before; no mechanism of the controller has a longer period than the status round.
KEEP_SECONDS = 3 * STATUS_INTERVAL + 1


def test_an_edit_of_gpu_aware_plugin_survives_the_controller(cluster, installed):
    """Manual 2.1.5 step 4: `kubectl edit configmap gpu-aware-plugin` (the weights) stays through the
    controller's drift watch, three status rounds, a CR change's reconcile and three more rounds; an edited
    object the manual does not hand to the administrator (gpu-aware's Deployment) is still put back."""
    wait_until(lambda: cr_ready(cluster), 240, "ClusterOperator Ready")
    assert patch_cr(cluster, {"gpuAware": {"deploy": True}}).returncode == 0
    try:
        wait_until(lambda: get_json(cluster, "configmap", N.GPU_AWARE_CONFIGMAP, "-n", NS), 60, "gpu-aware-plugin")
        weights = {"scoreWeight": "3", "lossWeight": "0.5"}
        cluster.kubectl("patch", "configmap", N.GPU_AWARE_CONFIGMAP, "-n", NS, "--type=merge",
                        "-p", json.dumps({"data": weights}), check=True)
        cluster.kubectl("patch", "deployment", "gpu-aware", "-n", NS, "--type=merge",
                        "-p", json.dumps({"spec": {"replicas": 3}}), check=True)
        wait_until(lambda: get_json(cluster, "deployment", "gpu-aware", "-n", NS)["spec"]["replicas"] == 1, 15,
                   "gpu-aware's Deployment put back")
        start = time.monotonic()

        def kept():
            data = get_json(cluster, "configmap", N.GPU_AWARE_CONFIGMAP, "-n", NS)["data"]
            assert {k: data.get(k) for k in weights} == weights, "reverted after %.1fs" % (time.monotonic() - start)
            return True

        def watch(seconds):
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                kept()
                time.sleep(1)

        watch(KEEP_SECONDS)
        assert "--log-level=debug" not in gpu_aware_args(cluster)
        # a CR change makes the controller apply every component again
        assert patch_cr(cluster, {"gpuAware": {"log": {"level": "debug"}}}).returncode == 0
        wait_until(lambda: kept() and "--log-level=debug" in gpu_aware_args(cluster), 60,
                   "the CR change applied to gpu-aware's Deployment")
        watch(KEEP_SECONDS)
        kept()
        print("\ngpu-aware-plugin's edited weights kept for %.0f s (a CR change's reconcile included)"
              % (time.monotonic() - start))
    finally:
        assert patch_cr(cluster, {"gpuAware": {"deploy": False, "log": {"level": "info"}}}).returncode == 0
        wait_until(lambda: not get_json(cluster, "deployment", "gpu-aware", "-n", NS), 60, "gpu-aware removed")


def owned_objects(cluster, uid):
    """kind/name of every object labelled with the CR's uid (namespaced and cluster-scoped)."""
    selector = "%s=%s" % (N.LABEL_OPERATOR_OWNER, uid)
    out = set()
    for kinds, scope in (("daemonsets,deployments,services,configmaps,serviceaccounts,roles,rolebindings",
                          ["-n", NS]), ("clusterroles,clusterrolebindings", [])):
        items = json.loads(cluster.kubectl("get", kinds, "-l", selector, "-o", "json", *scope,
                                           check=True).stdout)["items"]
        out |= {"%s/%s" % (o["kind"], o["metadata"]["name"]) for o in items}
    return out


def host_pid(pod_name):
    """The host pid of the operator-controller process of ``pod_name`` (containers are host processes)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % entry, "rb") as fh:
                if b"operator_controller" not in fh.read():
                    continue
            with open("/proc/%s/environ" % entry, "rb") as fh:
                if ("POD_NAME=%s" % pod_name).encode() in fh.read().split(b"\0"):
                    return int(entry)
        except OSError:
            continue
    return None


def test_killed_active_controller_mid_reconcile(cluster, installed):
    """The active replica is frozen (SIGSTOP) right after the reconcile of a CR change applied gpu-label and
    before gpu-device, its pod force-deleted and the process SIGKILLed: the other replica takes over
    (the 8 s lease, then the reconcile; the time is printed, and only its arrival asserted), and the result
    is what a render of the CR gives, with no object and no pod duplicated."""
    from kubernetes import client, watch as kwatch

    wait_until(lambda: cr_ready(cluster), 240, "ClusterOperator Ready")
    wait_until(lambda: len(controller_pods(cluster)) == 2 and active_controller(cluster), 60, "two replicas, one active")
    active = active_controller(cluster)
    pid = host_pid(active)
    assert pid, "no host process for %s" % active
    body = cr(cluster)
    uid = body["metadata"]["uid"]
    objects_before = owned_objects(cluster, uid)
    generations = {n: get_json(cluster, "daemonset", n, "-n", NS)["metadata"]["generation"]
                   for n in ("metax-gpu-label", "metax-gpu-device")}
    api = cluster.api_client()
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    stream = kwatch.Watch()
    since = get_json(cluster, "daemonsets", "-n", NS)["metadata"]["resourceVersion"]   # before the change
    changed = {"labelgen": {"log": {"level": "debug"}}, "devicePlugin": {"healthyInterval": 4}}
    assert patch_cr(cluster, changed).returncode == 0
    stopped_at = None
    for event in stream.stream(apps.list_namespaced_daemon_set, NS, timeout_seconds=30, resource_version=since):
        ds = event["object"]
        if ds.metadata.name == "metax-gpu-label" and ds.metadata.generation > generations["metax-gpu-label"]:
            os.kill(pid, signal.SIGSTOP)   # frozen: from the API's view it died here
            stopped_at = time.monotonic()
            break
    stream.stop()
    assert stopped_at, "the reconcile of gpu-label was not seen"
    device_at_stop = apps.read_namespaced_daemon_set("metax-gpu-device", NS).metadata.generation
    core.delete_namespaced_pod(active, NS, grace_period_seconds=0)
    os.kill(pid, signal.SIGKILL)
    mid = device_at_stop == generations["metax-gpu-device"]

    def device_done():
        ds = get_json(cluster, "daemonset", "metax-gpu-device", "-n", NS)
        return "--healthy-interval=4" in ds["spec"]["template"]["spec"]["containers"][0]["args"]
    # 15 s (the lease and a reconcile) ran out once under a loaded machine (ci-history, session 23)
    wait_until(device_done, 45, "the other replica to finish the reconcile", interval=0.2)
    took = time.monotonic() - stopped_at
    print("\nactive %s killed %s; the other replica applied gpu-device %.1fs later"
          % (active, "mid-reconcile (gpu-label applied, gpu-device not yet)" if mid
             else "after the reconcile had reached gpu-device", took))
    assert mid, "the kill landed after gpu-device was applied: not mid-reconcile"
    wait_until(lambda: cr_ready(cluster), 180, "ClusterOperator Ready after the failover")
    # the result: the objects a render of the live CR gives, each as rendered, nothing more
    body = cr(cluster)
    desired = render.desired_objects(
        render.helm_template(cluster.helm or "helm", EXTENSIONS_CHART, render.chart_values(body["spec"]), NS),
        body["spec"], body)
    want = {"%s/%s" % (o["kind"], o["metadata"]["name"]) for objs in desired.values() for o in objs}
    assert owned_objects(cluster, uid) == want == objects_before
    for obj in (o for objs in desired.values() for o in objs):
        scope = [] if obj["kind"] in ("ClusterRole", "ClusterRoleBinding") else ["-n", NS]
        live = get_json(cluster, obj["kind"].lower(), obj["metadata"]["name"], *scope)
        assert not render.drifted(live, obj), "%s/%s differs from the render" % (obj["kind"], obj["metadata"]["name"])

    def rolled_out(name):
        ds = get_json(cluster, "daemonset", name, "-n", NS)
        st = ds.get("status") or {}
        return st.get("observedGeneration") == ds["metadata"]["generation"] and \
            st.get("updatedNumberScheduled") == st.get("desiredNumberScheduled") == st.get("numberReady") == \
            st.get("numberAvailable")

    wait_until(lambda: rolled_out("metax-gpu-label") and rolled_out("metax-gpu-device"), 180, "both DaemonSets rolled out")
    pods = json.loads(cluster.kubectl("get", "pods", "-n", NS, "-o", "json", check=True).stdout)["items"]
    per_node = {}
    for pod in pods:
        component = pod["metadata"]["labels"].get("app.kubernetes.io/name")
        if component in ("metax-gpu-label", "metax-gpu-device") and not pod["metadata"].get("deletionTimestamp"):
            per_node.setdefault((component, pod["spec"]["nodeName"]), []).append(pod["metadata"]["name"])
    assert all(len(v) == 1 for v in per_node.values()), per_node
    assert len(per_node) == 2 * len(cluster.nodes)


@pytest.fixture
def gpu_less_node(cluster):
    """A hand-made Node without MetaX GPUs (no kubelet: the local cluster's presets all have GPUs, and a
    node is added only by a cluster restart). Ready by its status, so nothing but labels tells it apart."""
    name = "operator-it-nogpu"
    node = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}}}
    cluster.kubectl("create", "-f", "-", input=json.dumps(node), check=True)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    cluster.kubectl("patch", "node", name, "--subresource=status", "--type=merge", "-p", json.dumps(
        {"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                    "lastHeartbeatTime": now, "lastTransitionTime": now}],
                    "capacity": {"cpu": "4", "memory": "8Gi", "pods": "110"},
                    "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}}}), check=True)
    yield name
    cluster.kubectl("delete", "node", name, "--wait=true")
    cluster.kubectl("delete", "pods", "-n", NS, "--field-selector", "spec.nodeName=" + name, "--force",
                    "--grace-period=0")


def test_node_without_gpus_gets_gpu_label_only(cluster, installed, gpu_less_node):
    def pods_on_node():
        pods = json.loads(cluster.kubectl("get", "pods", "-n", NS, "--field-selector",
                                          "spec.nodeName=" + gpu_less_node, "-o", "json", check=True).stdout)
        return sorted(p["metadata"]["labels"].get("app.kubernetes.io/name") for p in pods["items"])
    wait_until(lambda: pods_on_node() == ["metax-gpu-label"], 60, "a gpu-label pod on the GPU-less node")
    wait_until(lambda: (cr(cluster)["status"]["nodes"]["total"] == len(cluster.nodes) + 1), 30, "status counts it")
    status = cr(cluster)["status"]
    time.sleep(3)   # a gpu-device pod would be created by now: the DaemonSet controller acts within a second
    assert pods_on_node() == ["metax-gpu-label"]
    assert status["nodes"]["gpu"] == len(cluster.nodes)
    assert N.LABEL_GPU_INSTALLED not in (nodes(cluster)[gpu_less_node]["metadata"].get("labels") or {})


# dataExporter.service.port of a real 0.9.2 install (samples/kubernetes/clusteroperator-0.9.2.txt): the CR's
# port is the exporter's and its Service's
EXPORTER_PORT = 30445


def exporter_text(pod):
    """A gpu-exporter pod's /metrics, as Prometheus would read it ("" while it is not listening)."""
    try:
        return urllib.request.urlopen("http://%s:%d/metrics" % (pod["status"]["podIP"], EXPORTER_PORT),
                                      timeout=10).read().decode()
    except OSError:
        return ""       # not listening yet


def exporter_gpus(pod):
    """{bdf: healthy} of the PFs a gpu-exporter pod serves."""
    out = {}
    for line in exporter_text(pod).splitlines():
        if line.startswith("metax_gpu_healthy{") and 'function="pf"' in line:
            out[line.split('bdf="', 1)[1].split('"', 1)[0]] = float(line.rsplit(" ", 1)[1])
    return out


def mx_exporter_series(text):
    """{family: [labels]} of the mx-exporter families dashboards made for MetaX's operator query."""
    from prometheus_client.parser import text_string_to_metric_families
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in ("mx_gpu_usage", "mx_memory_used"):
                out.setdefault(sample.name, []).append(dict(sample.labels))
    return out


def monitoring_objects(cluster):
    """kind -> object of gpu-exporter's ServiceMonitor and PrometheusRule in the namespace (absent: not there)."""
    out = {}
    for kind in ("servicemonitor", "prometheusrule"):
        obj = get_json(cluster, kind, "gpu-exporter", "-n", NS)
        if obj and not obj["metadata"].get("deletionTimestamp"):
            out[obj["kind"]] = obj
    return out


def handled_spec(cluster):
    """The spec kopf's handlers last finished with (its diff-base annotation, written after a success)."""
    annotations = cr(cluster)["metadata"].get("annotations") or {}
    return (json.loads(annotations.get(N.OPERATOR_GROUP + "/last-handled-configuration", "{}")) or {}).get("spec") or {}


def controller_restarts(cluster):
    return {name: sum(c.get("restartCount", 0) for c in (p.get("status") or {}).get("containerStatuses") or [])
            for name, p in controller_pods(cluster).items()}


def test_data_exporter_serves_every_gpu_node(cluster, installed):
    wait_until(lambda: cr_ready(cluster), 240, "ClusterOperator Ready")
    crds = ["crd/servicemonitors.monitoring.coreos.com", "crd/prometheusrules.monitoring.coreos.com"]
    # the local cluster has no Prometheus operator: the first half runs without its CRDs
    assert cluster.kubectl("get", *crds).returncode != 0, "Prometheus operator CRDs already on the cluster"
    restarts = controller_restarts(cluster)
    res = cluster.kubectl("patch", "clusteroperator", N.OPERATOR_CR_NAME, "-n", NS, "--type=merge",
                          "-p", '{"spec":{"dataExporter":{"deploy":true,"service":{"port":%d}}}}' % EXPORTER_PORT)
    assert res.returncode == 0, res.stderr
    counts = {name: int((n["metadata"].get("labels") or {}).get(N.LABEL_GPU_COUNT, "0"))
              for name, n in nodes(cluster).items()}

    def ready_pods():
        ds = get_json(cluster, "daemonset", "metax-gpu-exporter", "-n", NS)
        if not ds or (ds.get("status") or {}).get("numberReady") != len(counts):
            return None
        pods = get_json(cluster, "pods", "-n", NS, "-l", "app.kubernetes.io/name=metax-gpu-exporter")["items"]
        return pods if len(pods) == len(counts) else None

    try:
        wait_until(ready_pods, 180, "a gpu-exporter pod Ready on every GPU node")
        pods = ready_pods()
        ds = get_json(cluster, "daemonset", "metax-gpu-exporter", "-n", NS)
        assert ds["metadata"]["ownerReferences"][0]["kind"] == N.OPERATOR_KIND
        wait_until(lambda: all(len(exporter_gpus(p)) == counts[p["spec"]["nodeName"]] for p in pods), 60,
                   "every GPU in its node's exporter")
        served = {p["spec"]["nodeName"]: exporter_gpus(p) for p in pods}
        assert {node: sorted(set(gpus.values())) for node, gpus in served.items()} == {n: [1.0] for n in counts}
        # mx-exporter's names beside ours, one series per GPU: what dashboards built for the real product query
        for pod in pods:
            mx = mx_exporter_series(exporter_text(pod))
            gpus = counts[pod["spec"]["nodeName"]]
            assert len(mx.get("mx_gpu_usage", [])) == gpus, pod["spec"]["nodeName"]
            assert len([lab for lab in mx.get("mx_memory_used", []) if lab.get("type") == "vram"]) == gpus
            assert {lab["Hostname"] for lab in mx["mx_gpu_usage"]} == {pod["spec"]["nodeName"]}

        # Ready was already True before the patch: wait for a status round that has seen it (the
        # exporter can be serving before the next round, every 5 s, writes the status)
        def exporter_entry():
            body = cr(cluster) or {}
            return next((c for c in (body.get("status") or {}).get("components") or []
                         if c["name"] == "metax-gpu-exporter" and c.get("deployed")), None)
        wait_until(lambda: cr_ready(cluster) and (exporter_entry() or {}).get("ready") == len(counts), 120,
                   "Ready with gpu-exporter", diagnose=[lambda: controller_logs(cluster, "")])
        assert not reconciling(cluster), "a reconcile is retried without the CRDs:\n" + controller_logs(cluster, "")
        print("\ndataExporter: gpu-exporter serves %s GPUs on %s" % (sum(counts.values()), sorted(counts)))

        # The Prometheus operator's CRDs arrive: no CR change, the controller renders again.
        generation = cr(cluster)["metadata"]["generation"]
        start = time.monotonic()
        cluster.kubectl("apply", "--server-side", "-f", MONITORING_CRDS, check=True)
        wait_until(lambda: len(monitoring_objects(cluster)) == 2, 60, "ServiceMonitor and PrometheusRule created",
                   interval=0.2, diagnose=[lambda: controller_logs(cluster, "")])
        created = time.monotonic() - start
        objs = monitoring_objects(cluster)
        uid = cr(cluster)["metadata"]["uid"]
        for obj in objs.values():
            assert obj["metadata"]["labels"][N.LABEL_OPERATOR_OWNER] == uid
            assert obj["metadata"]["ownerReferences"][0]["uid"] == uid
        service = get_json(cluster, "service", "gpu-exporter", "-n", NS)
        assert [p["port"] for p in service["spec"]["ports"]] == [EXPORTER_PORT]
        selector = objs["ServiceMonitor"]["spec"]["selector"]["matchLabels"]
        assert selector.items() <= service["metadata"]["labels"].items()
        assert "MetaxGpuUnhealthy" in json.dumps(objs["PrometheusRule"]["spec"])
        assert cr(cluster)["metadata"]["generation"] == generation
        # their drift watch started with the CRDs
        old = objs["ServiceMonitor"]["metadata"]["uid"]
        start = time.monotonic()
        cluster.kubectl("delete", "servicemonitor", "gpu-exporter", "-n", NS, "--wait=false", check=True)
        wait_until(lambda: (monitoring_objects(cluster).get("ServiceMonitor") or {"metadata": {"uid": old}})[
            "metadata"]["uid"] != old, 15, "the deleted ServiceMonitor recreated", interval=0.1,
            diagnose=[lambda: controller_logs(cluster, "")])
        recreated = time.monotonic() - start
        print("monitoring CRDs applied -> ServiceMonitor and PrometheusRule in %.1fs; "
              "deleted ServiceMonitor recreated in %.2fs" % (created, recreated))
    finally:
        cluster.kubectl("patch", "clusteroperator", N.OPERATOR_CR_NAME, "-n", NS, "--type=merge",
                        "-p", '{"spec":{"dataExporter":{"deploy":false}}}')
        try:
            wait_until(lambda: not get_json(cluster, "daemonset", "metax-gpu-exporter", "-n", NS)
                       and not monitoring_objects(cluster), 60, "gpu-exporter and its monitoring objects removed")
        finally:
            cluster.kubectl("delete", "--ignore-not-found", "--wait=true", "--timeout=60s", "-f", MONITORING_CRDS)
    # Without the CRDs again the controller carries on: a CR change is reconciled, nothing restarted.
    res = cluster.kubectl("patch", "clusteroperator", N.OPERATOR_CR_NAME, "-n", NS, "--type=merge",
                          "-p", '{"spec":{"dataExporter":{"interval":10}}}')
    assert res.returncode == 0, res.stderr
    wait_until(lambda: handled_spec(cluster).get("dataExporter", {}).get("interval") == 10 and not reconciling(cluster),
               60, "the CR change reconciled without the CRDs", diagnose=[lambda: controller_logs(cluster, "")])
    wait_until(lambda: cr_ready(cluster), 60, "Ready without the CRDs")
    assert controller_restarts(cluster) == restarts


VENDOR_CONFIG = os.path.join(ROOT, "tests", "unit", "cdi", "fixtures", "containerd-config-after-vendor-runtime.toml")
STATE_DIR = os.environ.get("METAX_CLUSTER_DIR", "/var/lib/metax-gpu-cluster")


def tree(root):
    """What container-runtime may write in a node's root (its /etc, and its state under /var/lib/metax-gpu):
    every file and directory there, relative path -> (mode, bytes or None for a directory)."""
    out = {}
    for top in ("etc", "var/lib/metax-gpu"):
        out.update(_tree(root, os.path.join(root, top)))
    return out


def _tree(root, top):
    out = {}
    for dirpath, dirs, files in os.walk(top):
        for name in dirs + files:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            data = None
            if os.path.isfile(path) and not os.path.islink(path):
                with open(path, "rb") as handle:
                    data = handle.read()
            out[os.path.relpath(path, root)] = (st.st_mode, data)
    return out


@pytest.fixture
def runtime_configs(cluster):
    """Each GPU node's root gets a containerd config for container-runtime to find: a copy of the node's own
    (its containerd's config.toml) and, on the last node, a copy of a real node's config after MetaX's
    runtime rewrote it (default_runtime_name = "metax"); removed afterwards."""
    planted = {}
    for i, node in enumerate(cluster.nodes):
        etc = os.path.join(node["sim_root"], "etc")
        if os.path.exists(os.path.join(etc, "containerd")):
            pytest.fail("%s already has /etc/containerd" % node["sim_root"])
        source = VENDOR_CONFIG if i == len(cluster.nodes) - 1 else os.path.join(
            STATE_DIR, "nodes", node["name"], "containerd", "config.toml")
        with open(source, "rb") as handle:
            content = handle.read()
        made_etc = not os.path.isdir(etc)
        os.makedirs(os.path.join(etc, "containerd"))
        path = os.path.join(etc, "containerd", "config.toml")
        with open(path, "wb") as handle:
            handle.write(content)
        os.chmod(path, 0o600)
        planted[node["name"]] = (node["sim_root"], made_etc)
    try:
        yield {name: tree(root) for name, (root, _made) in planted.items()}
    finally:
        for root, made_etc in planted.values():
            shutil.rmtree(os.path.join(root, "etc", "containerd"), ignore_errors=True)
            if made_etc:
                shutil.rmtree(os.path.join(root, "etc"), ignore_errors=True)


def runtime_pods(cluster):
    return (get_json(cluster, "pods", "-n", NS, "-l", "app.kubernetes.io/name=metax-container-runtime")
            or {"items": []})["items"]


def test_container_runtime_installs_gets_ready_and_leaves_the_configs_byte_identical(
        cluster, installed, runtime_configs):
    """The runtime component (issue 26) through the operator: every GPU node gets runtime.ready; containerd 2.4
    reads CDI by default, so its config gets only the runtime handler metax of the RuntimeClass metax (issue 38),
    a copy of runc, and a vendor config's own metax (its default runtime) is left alone; gpu-device (which
    requires runtime.ready) still serves every GPU, and after `deploy: false` the nodes' roots are
    byte-identical, mode included, with nothing of the component's left (the RuntimeClass neither)."""
    wait_until(lambda: cr_ready(cluster), 240, "ClusterOperator Ready")
    # run alone, the CR can be Ready before gpu-label has labelled every node: wait for the chain's end
    gpu_nodes = sorted(runtime_configs)
    wait_until(lambda: sorted(gpu_nodes_allocatable(cluster)) == gpu_nodes and all(
        have == want > 0 for have, want in gpu_nodes_allocatable(cluster).values()), 120,
        "every GPU node labelled and allocatable",
        diagnose=[lambda: "(allocatable, devices) per GPU node: %s" % gpu_nodes_allocatable(cluster)])
    res = patch_cr(cluster, {"runtime": {"deploy": True}})
    assert res.returncode == 0, res.stderr
    try:
        def ready_everywhere():
            pods = runtime_pods(cluster)
            ready = {p["spec"].get("nodeName") for p in pods if any(
                c["type"] == "Ready" and c["status"] == "True" for c in (p.get("status") or {}).get("conditions") or [])}
            labelled = {n for n, node in nodes(cluster).items()
                        if (node["metadata"].get("labels") or {}).get(N.LABEL_RUNTIME_READY) == "true"}
            return ready == labelled == set(gpu_nodes)
        start = time.monotonic()
        wait_until(ready_everywhere, 180, "container-runtime Ready and runtime.ready=true on every GPU node",
                   diagnose=[lambda: controller_logs(cluster, "container-runtime")])
        print("\nruntime.deploy: true -> runtime.ready on %d nodes in %.1fs"
              % (len(gpu_nodes), time.monotonic() - start))
        ds = get_json(cluster, "daemonset", "metax-container-runtime", "-n", NS)
        assert ds["metadata"]["ownerReferences"][0]["kind"] == N.OPERATOR_KIND
        for pod in runtime_pods(cluster):
            log = cluster.kubectl("logs", "-n", NS, pod["metadata"]["name"]).stdout
            assert "containerd://2." in log and "reads CDI" in log, log[-2000:]
        # while it runs: on the nodes whose default runtime is runc, the runtime handler metax (issue 38) beside
        # it in a drop-in, and its import, nothing else; the vendor's node, whose own metax is its default,
        # untouched
        vendor_node = cluster.nodes[-1]["name"]
        for node in cluster.nodes:
            during = tree(node["sim_root"])
            if node["name"] == vendor_node:
                assert during == runtime_configs[vendor_node]
                continue
            changed = {p for p in set(during) | set(runtime_configs[node["name"]])
                       if during.get(p) != runtime_configs[node["name"]].get(p)}
            assert changed <= {"etc/containerd/config.toml", "etc/containerd/conf.d",
                               "etc/containerd/conf.d/99-metax-gpu-cdi.toml"} | {
                p for p in during if p.startswith("var/lib/metax-gpu")}, changed
            dropin = tomllib.loads(during["etc/containerd/conf.d/99-metax-gpu-cdi.toml"][1].decode())
            config = tomllib.loads(during["etc/containerd/config.toml"][1].decode())
            runtimes = config["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]
            assert dropin["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"] == {
                "metax": runtimes["runc"]}
            assert config["imports"] == ["/etc/containerd/conf.d/99-metax-gpu-cdi.toml"]
        # the chart's RuntimeClass metax, the operator's (cluster-scoped, found by the owner label)
        runtime_class = get_json(cluster, "runtimeclass", N.RUNTIME_CLASS)
        assert runtime_class["handler"] == N.RUNTIME_HANDLER
        assert runtime_class["metadata"]["labels"][N.LABEL_OPERATOR_OWNER] == cr(cluster)["metadata"]["uid"]
        wait_until(lambda: all(have == want for have, want in gpu_nodes_allocatable(cluster).values()), 120,
                   "gpu-device serving every GPU with runtime.ready")
        wait_until(lambda: cr_ready(cluster), 120, "Ready with container-runtime")
        entry = next(c for c in cr(cluster)["status"]["components"] if c["name"] == "metax-container-runtime")
        assert entry["deployed"] is True and entry["ready"] == len(gpu_nodes)
    finally:
        res = patch_cr(cluster, {"runtime": {"deploy": False}})
    assert res.returncode == 0, res.stderr
    wait_until(lambda: not get_json(cluster, "daemonset", "metax-container-runtime", "-n", NS)
               and not runtime_pods(cluster), 120, "container-runtime removed")
    wait_until(lambda: not any((n["metadata"].get("labels") or {}).get(N.LABEL_RUNTIME_READY)
                               for n in nodes(cluster).values()), 60, "runtime.ready removed")
    after = {n["name"]: tree(n["sim_root"]) for n in cluster.nodes}
    assert after == runtime_configs
    assert get_json(cluster, "runtimeclass", N.RUNTIME_CLASS) is None
    with open(os.path.join(cluster.nodes[-1]["sim_root"], "etc", "containerd", "config.toml"), "rb") as handle:
        assert b'default_runtime_name = "metax"' in handle.read()
    wait_until(lambda: all(have == want for have, want in gpu_nodes_allocatable(cluster).values()), 120,
               "gpu-device serving every GPU after the runtime component went")
    wait_until(lambda: cr_ready(cluster), 120, "Ready without container-runtime")


def test_zz_uninstall_with_the_controller_scaled_to_zero_leaves_nothing(cluster, installed):
    """Manual 3.2.5 as written, after `kubectl scale deployment operator-controller --replicas=0`:
    the chart's pre-delete hook does the finalizer's work."""
    cluster.kubectl("scale", "deployment", "operator-controller", "-n", NS, "--replicas=0", check=True)
    wait_until(lambda: not controller_pods(cluster), 60, "no controller pod")
    res = subprocess.run(["bash", "-c", UNINSTALL_SCRIPT], env=cluster.env, capture_output=True, text=True,
                         timeout=600, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert json.loads(cluster.kubectl("get", "clusteroperators", "-A", "-o", "json", check=True).stdout)["items"] == []
    left = get_json(cluster, "daemonsets,deployments", "-n", NS) or {"items": []}
    assert left["items"] == [], [o["metadata"]["name"] for o in left["items"]]
    for name, node in nodes(cluster).items():
        assert ours(node) == {}, (name, ours(node))
    roles = json.loads(cluster.kubectl("get", "clusterroles", "-o", "json", check=True).stdout)["items"]
    assert not [r["metadata"]["name"] for r in roles
                if (r["metadata"].get("labels") or {}).get(N.LABEL_OPERATOR_OWNER)]
