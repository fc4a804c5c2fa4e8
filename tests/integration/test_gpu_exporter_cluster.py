# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""gpu-exporter on the local cluster, scraped by Debian's real Prometheus.

gpu-device and gpu-exporter run as DaemonSet pods (the agent image) over the
8xC500 simulated root; Debian's ``prometheus`` (2.42, requirements/system.txt)
runs on the host with the chart's rule file and scrapes the exporter pod
every second. Checked: every GPU is a series; a pod asking for a GPU is found
by its ``pod`` label with the utilisation the simulator reports for its
device (the test puts the load on the device the kubelet gave the pod); a GPU
marked failed in the simulator shows as ``metax_gpu_healthy 0`` and its alert
goes pending; every dashboard query returns data, and the panels are drawn
to tests/output/gpu-exporter-dashboard.png (matplotlib). The simulated
root gets this checkout's mx-smi first (generator.reinstall_mx_smi): a root
made by an older checkout kept an mx-smi without load, so utilisation stayed 0.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
import uuid

import pytest

pytestmark = pytest.mark.cluster

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "unit", "exporter"))

import dashboard_png  # noqa: E402
from prometheus_server import DASHBOARD, OUTPUT, Prometheus, values  # noqa: E402
from test_gpu_device_cluster import DIAGNOSE, GPU, NS, SIM_MOUNT, wait_for  # noqa: E402
from test_gpu_device_cluster import device_agent  # noqa: E402,F401  pylint: disable=unused-import

from ansible_collections.metax.gpu.plugins.module_utils.gpu import mxsmi_json  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator  # noqa: E402

PORT = 9401


@pytest.fixture(scope="module")
def exporter(device_agent):  # noqa: F811
    agents = device_agent
    volumes = {"pod-resources": ("/var/lib/kubelet/pod-resources", "/var/lib/kubelet/pod-resources"),
               "sim": (agents.sim_parent, SIM_MOUNT)}
    args = ["--host-root", SIM_MOUNT + "/root", "--interval", "1", "--mx-smi-timeout", "10", "--port", str(PORT),
            "--log-format", "json"]
    generator.clear_load(agents.sim())
    try:
        pod = agents.start("gpu-exporter", args, volumes, run_as_user=0)
        prometheus = Prometheus("%s:%d" % (pod.status.pod_ip, PORT))
        DIAGNOSE.append(lambda: _diagnose(agents, pod))
        try:
            yield agents, prometheus
        finally:
            prometheus.stop()
    finally:
        agents.delete("gpu-exporter")
        generator.clear_load(agents.sim())


def _diagnose(agents, pod):
    """What the exporter serves, what mx-smi says in its pod and on the host, its last log lines."""
    out = []
    try:
        text = urllib.request.urlopen("http://%s:%d/metrics" % (pod.status.pod_ip, PORT), timeout=5).read().decode()
        out.append("exporter:\n" + "\n".join(line for line in text.splitlines()
                                             if line.startswith(("metax_gpu_utilization", "metax_gpu_exporter"))))
    except OSError as exc:
        out.append("exporter /metrics: %s" % exc)
    script = "cat %s/root/.metax-sim/load.json; %s/root/usr/bin/mx-smi -j | head -30" % (SIM_MOUNT, SIM_MOUNT)
    res = agents.cluster.kubectl("-n", NS, "exec", pod.metadata.name, "--", "sh", "-c", script)
    out.append("in the exporter pod:\n%s%s" % (res.stdout[-3000:], res.stderr[-1000:]))
    out.append("host load.json: %s" % generator.read_load(agents.sim()))
    out.append("exporter log:\n" + "\n".join(agents.logs("gpu-exporter").splitlines()[-15:]))
    return "\n".join(out)


def test_prometheus_scrapes_every_gpu(exporter):
    agents, prom = exporter
    state = generator.load_state(agents.sim())
    result = wait_for(lambda: prom.query('metax_gpu_healthy{function="pf"}') if len(
        prom.query('metax_gpu_healthy{function="pf"}')) == 8 else None, 60, "8 GPUs in Prometheus")
    assert values(result) == {g["bdf"]: 1.0 for g in state["gpus"]}
    assert {r["metric"]["node"] for r in result} == {agents.node}
    assert {r["metric"]["uuid"] for r in result} == {g["uuid"] for g in state["gpus"]}
    up = prom.query('up{job="gpu-exporter"}')
    assert [float(r["value"][1]) for r in up] == [1.0]
    # mx-exporter's names beside ours: a dashboard made for MetaX's operator gets every GPU
    usage = wait_for(lambda: prom.query("mx_gpu_usage") if len(prom.query("mx_gpu_usage")) == 8 else None, 60,
                     "mx_gpu_usage of 8 GPUs")
    assert {r["metric"]["uuid"] for r in usage} == {g["uuid"] for g in state["gpus"]}
    assert {r["metric"]["Hostname"] for r in usage} == {agents.node}
    assert {r["metric"]["deviceId"] for r in usage} == {str(i) for i in range(8)}
    used = prom.query('mx_memory_used{type="vram"}')
    total = prom.query('mx_memory_total{type="vram"} * 1024')
    assert len(used) == 8 and all(float(r["value"][1]) > 0 for r in used)
    assert {float(r["value"][1]) for r in total} == {64.0 * 1024 ** 3}


def gpu_pod(agents, name, container):
    """A pod holding one GPU on the agents' node, idle until deleted."""
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
        "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                 "nodeSelector": {"kubernetes.io/hostname": agents.node},
                 "tolerations": [{"operator": "Exists"}],
                 "containers": [{"name": container, "image": agents.images["gpu-device"],
                                 "command": ["sh", "-c", "sleep 3600"], "resources": {"limits": {GPU: "1"}}}]}}


def test_a_gpu_pods_devices_by_pod_label(exporter):
    agents, prom = exporter
    name = "gpu-load-%s" % uuid.uuid4().hex[:6]
    agents.apply(gpu_pod(agents, name, "trainer"))
    bdf = None
    try:
        wait_for(lambda: agents.api.read_namespaced_pod(name, NS).status.phase == "Running", 180, "the GPU pod")
        held = wait_for(lambda: prom.query('metax_gpu_allocated{pod="%s"} == 1' % name), 60,
                        "the pod's device in Prometheus")
        assert len(held) == 1
        labels = held[0]["metric"]
        assert (labels["namespace"], labels["container"]) == (NS, "trainer")
        bdf = labels["bdf"]
        # the pod's workload: the simulator's mx-smi reports its device busy
        generator.set_load(agents.sim(), bdf, 0.8)

        def busy():
            found = prom.query('metax_gpu_utilization_ratio{pod="%s"}' % name)
            return found if found and float(found[0]["value"][1]) >= 0.5 else None

        result = wait_for(busy, 60, "the pod's utilisation in Prometheus")
        assert [r["metric"]["bdf"] for r in result] == [bdf]
        reported = [d for d in mxsmi_json.parse_json(subprocess.run(
            [agents.sim().join(generator.MX_SMI_PATH), "-j"], capture_output=True, text=True,
            check=True).stdout).devices if d.bdf == bdf][0].utilization_percent / 100
        # the load sways over minutes: what Prometheus holds is what mx-smi says now
        assert abs(float(result[0]["value"][1]) - reported) <= 0.05
        others = values(prom.query('metax_gpu_utilization_ratio{function="pf", bdf!="%s"}' % bdf))
        assert len(others) == 7 and max(others.values()) == 0.0
        assert values(prom.query('metax_gpu_processes{bdf="%s"}' % bdf)) == {bdf: 1.0}
        # the same pod found as dashboards made for MetaX's own exporter find it (exported_* labels, KB, %)
        vram = wait_for(lambda: prom.query('mx_memory_used{exported_pod="%s", type="vram"}' % name), 60,
                        "mx_memory_used of the pod")
        assert len(vram) == 1 and vram[0]["metric"]["exported_namespace"] == NS
        assert vram[0]["metric"]["exported_container"] == "trainer" and float(vram[0]["value"][1]) > 0
        usage = prom.query('mx_gpu_usage{exported_pod="%s"}' % name)
        assert len(usage) == 1 and float(usage[0]["value"][1]) >= 50
        assert usage[0]["metric"]["uuid"] == labels["uuid"] and usage[0]["metric"]["modelName"] == "MXC500"
    finally:
        if bdf is not None:
            generator.set_load(agents.sim(), bdf, 0.0)
        agents.api.delete_namespaced_pod(name, NS, grace_period_seconds=0)


def test_failed_gpu_in_health_and_alert(exporter):
    agents, prom = exporter
    bdf = generator.load_state(agents.sim())["gpus"][5]["bdf"]
    generator.fail_gpu(agents.sim(), 5, "smi")
    try:
        wait_for(lambda: values(prom.query('metax_gpu_healthy{bdf="%s"}' % bdf)) == {bdf: 0.0}, 60,
                 "GPU 5 unhealthy in Prometheus")
        alert = wait_for(lambda: prom.query('ALERTS{alertname="MetaxGpuUnhealthy"}'), 30, "the alert pending")
        assert [(a["metric"]["bdf"], a["metric"]["alertstate"]) for a in alert] == [(bdf, "pending")]
    finally:
        generator.recover_gpu(agents.sim(), 5)
    wait_for(lambda: values(prom.query('metax_gpu_healthy{bdf="%s"}' % bdf)) == {bdf: 1.0}, 60, "GPU 5 healthy again")


def test_every_dashboard_query_returns_data(exporter):
    agents, prom = exporter
    with open(DASHBOARD) as handle:
        dashboard = json.load(handle)
    name = "gpu-dash-%s" % uuid.uuid4().hex[:6]
    agents.apply(gpu_pod(agents, name, "c"))
    loaded = []
    try:
        held = wait_for(lambda: prom.query('metax_gpu_allocated{pod="%s"} == 1' % name), 180, "the pod's device")
        # the pod's device busy and a second GPU half as busy, for some seconds: a picture with something in it
        busy = held[0]["metric"]["bdf"]
        loaded = [busy] + [g["bdf"] for g in generator.load_state(agents.sim())["gpus"] if g["bdf"] != busy][:1]
        generator.set_load(agents.sim(), loaded[0], 0.7)
        generator.set_load(agents.sim(), loaded[1], 0.35)
        wait_for(lambda: prom.query("count_over_time((metax_gpu_utilization_ratio > 0.2)[30s:1s]) >= 15"), 90,
                 "15 s of load in Prometheus")
        empty = []
        for panel in dashboard["panels"]:
            for target in panel.get("targets", []):
                expr = target["expr"].replace("$node", agents.node)
                if not prom.query(expr):
                    empty.append((panel["title"], expr))
        assert not empty, empty
        # for a person to look at: the panels as Prometheus answers their queries
        os.makedirs(OUTPUT, exist_ok=True)
        path = os.path.join(OUTPUT, "gpu-exporter-dashboard.png")
        assert dashboard_png.render(prom.port, dashboard, path, agents.node, prom.age()) > 0
        assert os.path.getsize(path) > 10000
    finally:
        for bdf in loaded:
            generator.set_load(agents.sim(), bdf, 0.0)
        agents.api.delete_namespaced_pod(name, NS, grace_period_seconds=0)
