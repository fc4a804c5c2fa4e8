# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The GPU Operator scheme on the local three-node cluster (issue 24, manual section 3.2).

helm install of files/charts/metax-operator (the manual's flags; the chart
from the checkout, not yet from oci://), then: the ClusterOperator becomes
Ready, every GPU node's allocatable equals its devices, the readiness labels
appear (first-seen times printed); a `kubectl patch` of
devicePlugin.healthyInterval rolls gpu-device only; bad values are refused by
the API server; dataExporter.deploy: true puts a gpu-exporter pod on every
GPU node serving each of its GPUs, false removes it; the manual's uninstall script (3.2.5) leaves no CR, no
DaemonSet and no metax-tech.com/ label or annotation on any node.

A GPU Extensions release found on the cluster is uninstalled first (two device
plugins must never register the same resource) and installed again afterwards
with the same values.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import urllib.request

import pytest
from polling import wait_until

from ansible_collections.metax.gpu.plugins.module_utils import names as N

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.path.join(ROOT, "files", "images", "agent", "build.sh")
CHART = os.path.join(ROOT, "files", "charts", "metax-operator")
EXTENSIONS_CHART = os.path.join(ROOT, "files", "charts", "metax-gpu-extensions")
NS = N.OPERATOR_NAMESPACE
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
    items = json.loads(cluster.kubectl("get", "nodes", "-o", "json", check=True).stdout)["items"]
    return {n["metadata"]["name"]: n for n in items}


def ours(node):
    meta = node["metadata"]
    return {k: v for part in ("labels", "annotations") for k, v in (meta.get(part) or {}).items()
            if k.startswith(N.PREFIX)}


def get_json(cluster, *args):
    res = cluster.kubectl("get", "-o", "json", *args)
    return json.loads(res.stdout) if res.returncode == 0 else None


@pytest.fixture(scope="module")
def images(cluster):
    res = subprocess.run([BUILD], env=cluster.env, capture_output=True, text=True, timeout=1800,
                         stdin=subprocess.DEVNULL, check=False)
    assert res.returncode == 0, "image build failed:\n%s%s" % (res.stdout, res.stderr[-3000:])
    refs = dict(line.split("=", 1) for line in res.stdout.split() if "=" in line)
    prefix, tag = refs["operator-controller"].rsplit(":", 1)
    return {"registry": prefix.rsplit("/", 1)[0], "tag": tag}


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


class LabelWatch(threading.Thread):
    """First time each readiness label is seen on each node (seconds after the install started)."""

    def __init__(self, cluster):
        super().__init__(daemon=True)
        self.cluster = cluster
        self.start_time = time.monotonic()
        self.seen = {}
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            res = self.cluster.kubectl("get", "nodes", "-o", "json")
            if res.returncode == 0:
                now = time.monotonic() - self.start_time
                for node in json.loads(res.stdout)["items"]:
                    labels = node["metadata"].get("labels") or {}
                    for label in READINESS:
                        if labels.get(label) == "true":
                            self.seen.setdefault((node["metadata"]["name"], label), round(now, 1))
            self.stop.wait(0.5)


@pytest.fixture(scope="module")
def installed(cluster, images, no_extensions):
    before = {name: ours(node) for name, node in nodes(cluster).items()}
    watch = LabelWatch(cluster)
    watch.start()
    res = helm(cluster, "install", CHART, "--create-namespace", "-n", NS, "--generate-name", "--wait",
               "--set", "registry=" + images["registry"], "--set", "imageTag=" + images["tag"],
               "--set", "hostRoot.path=/var/lib/metax-sim", "--set", "hostRoot.subPathExpr=$(NODE_NAME)",
               "--set", "log.dir=", "--set", "gpuDevice.healthyInterval=2",
               # the node-agent admission policy (issue 30) on, not only where auto finds it: the agents
               # must do their work under it, and an install where it did not render must fail here
               "--set", "nodeAgentPolicy.enabled=true")
    assert res.returncode == 0, "helm install failed:\n%s\n%s" % (res.stdout, res.stderr)
    info = {"before": before, "watch": watch, "helm_seconds": round(time.monotonic() - watch.start_time, 1)}
    yield info
    watch.stop.set()
    subprocess.run(["bash", "-c", UNINSTALL_SCRIPT], env=cluster.env, capture_output=True, timeout=600,
                   check=False)


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
        a == want > 0 for a, want in gpu_nodes_allocatable(cluster).values()), 120, "allocatable = devices")
    alloc = gpu_nodes_allocatable(cluster)
    assert len(alloc) == len(cluster.nodes) >= 3, alloc
    total = time.monotonic() - installed["watch"].start_time
    body = cr(cluster)
    print("\nhelm install --wait: %ss; every GPU node allocatable after %.1fs" % (installed["helm_seconds"], total))
    print("status: %s" % json.dumps(body["status"]["conditions"]))
    print("readiness labels first seen (s after install): %s" % sorted(
        (t, n, label) for (n, label), t in installed["watch"].seen.items()))
    components = {c["name"]: c for c in body["status"]["components"]}
    assert components["gpu-device"]["ready"] == len(alloc)
    assert components["gpu-aware"]["deployed"] is False
    # the chain today: gpu.installed gates gpu-device (no runtime/MACA component deployed yet)
    ds = get_json(cluster, "daemonset", "gpu-device", "-n", NS)
    assert ds["spec"]["template"]["spec"]["nodeSelector"] == {N.LABEL_GPU_INSTALLED: "true"}
    assert ds["metadata"]["ownerReferences"][0]["kind"] == N.OPERATOR_KIND
    for name in alloc:
        assert (name, N.LABEL_GPU_INSTALLED) in installed["watch"].seen


def test_patch_rolls_gpu_device_only(cluster, installed):
    wait_until(lambda: cr_ready(cluster), 240, "ClusterOperator Ready")
    before = {n: get_json(cluster, "daemonset", n, "-n", NS)["metadata"]["generation"]
              for n in ("gpu-device", "gpu-label")}
    start = time.monotonic()
    res = cluster.kubectl("patch", "clusteroperator", N.OPERATOR_CR_NAME, "-n", NS, "--type=merge",
                          "-p", '{"spec":{"devicePlugin":{"healthyInterval":3}}}')
    assert res.returncode == 0, res.stderr
    wait_until(lambda: get_json(cluster, "daemonset", "gpu-device", "-n", NS)["metadata"]["generation"]
               > before["gpu-device"], 30, "gpu-device to change", interval=0.2)
    print("\npatch -> gpu-device DaemonSet changed in %.1fs" % (time.monotonic() - start))
    ds = get_json(cluster, "daemonset", "gpu-device", "-n", NS)
    assert "--healthy-interval=3" in ds["spec"]["template"]["spec"]["containers"][0]["args"]
    assert get_json(cluster, "daemonset", "gpu-label", "-n", NS)["metadata"]["generation"] == before["gpu-label"]


@pytest.mark.parametrize("patch,field", [({"driver": {"deployPolicy": "Sometimes"}}, "deployPolicy"),
                                         ({"devicePlugin": {"healthyInterval": -1}}, "healthyInterval")])
def test_bad_values_are_refused_by_the_api_server(cluster, installed, patch, field):
    generation = cr(cluster)["metadata"]["generation"]
    res = cluster.kubectl("patch", "clusteroperator", N.OPERATOR_CR_NAME, "-n", NS, "--type=merge",
                          "-p", json.dumps({"spec": patch}))
    assert res.returncode != 0 and field in res.stderr, res.stderr
    assert cr(cluster)["metadata"]["generation"] == generation


def exporter_gpus(pod):
    """{bdf: healthy} of the PFs a gpu-exporter pod serves (its /metrics, as Prometheus would read it)."""
    try:
        text = urllib.request.urlopen("http://%s:9401/metrics" % pod["status"]["podIP"], timeout=10).read().decode()
    except OSError:
        return {}       # not listening yet
    out = {}
    for line in text.splitlines():
        if line.startswith("metax_gpu_healthy{") and 'function="pf"' in line:
            out[line.split('bdf="', 1)[1].split('"', 1)[0]] = float(line.rsplit(" ", 1)[1])
    return out


def test_data_exporter_serves_every_gpu_node(cluster, installed):
    wait_until(lambda: cr_ready(cluster), 240, "ClusterOperator Ready")
    res = cluster.kubectl("patch", "clusteroperator", N.OPERATOR_CR_NAME, "-n", NS, "--type=merge",
                          "-p", '{"spec":{"dataExporter":{"deploy":true}}}')
    assert res.returncode == 0, res.stderr
    counts = {name: int((n["metadata"].get("labels") or {}).get(N.LABEL_GPU_COUNT, "0"))
              for name, n in nodes(cluster).items()}

    def ready_pods():
        ds = get_json(cluster, "daemonset", "gpu-exporter", "-n", NS)
        if not ds or (ds.get("status") or {}).get("numberReady") != len(counts):
            return None
        pods = get_json(cluster, "pods", "-n", NS, "-l", "app.kubernetes.io/name=gpu-exporter")["items"]
        return pods if len(pods) == len(counts) else None

    try:
        wait_until(ready_pods, 180, "a gpu-exporter pod Ready on every GPU node")
        pods = ready_pods()
        ds = get_json(cluster, "daemonset", "gpu-exporter", "-n", NS)
        assert ds["metadata"]["ownerReferences"][0]["kind"] == N.OPERATOR_KIND
        wait_until(lambda: all(len(exporter_gpus(p)) == counts[p["spec"]["nodeName"]] for p in pods), 60,
                   "every GPU in its node's exporter")
        served = {p["spec"]["nodeName"]: exporter_gpus(p) for p in pods}
        assert {node: sorted(set(gpus.values())) for node, gpus in served.items()} == {n: [1.0] for n in counts}
        wait_until(lambda: cr_ready(cluster), 120, "Ready with gpu-exporter")
        entry = next(c for c in cr(cluster)["status"]["components"] if c["name"] == "gpu-exporter")
        assert entry["deployed"] is True and entry["ready"] == len(counts)
        print("\ndataExporter: gpu-exporter serves %s GPUs on %s" % (sum(counts.values()), sorted(counts)))
    finally:
        cluster.kubectl("patch", "clusteroperator", N.OPERATOR_CR_NAME, "-n", NS, "--type=merge",
                        "-p", '{"spec":{"dataExporter":{"deploy":false}}}')
    wait_until(lambda: not get_json(cluster, "daemonset", "gpu-exporter", "-n", NS), 60, "gpu-exporter removed")


def test_zz_manual_uninstall_leaves_nothing(cluster, installed):
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
