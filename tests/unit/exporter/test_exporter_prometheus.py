# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Debian's real Prometheus scrapes the gpu-exporter process over a simulated node (no cluster).

The kubelet's pod-resources API is the test peer of the device-plugin tests
(a real gRPC server on a Unix socket); the cluster version of this test is
tests/integration/test_gpu_exporter_cluster.py. Checked: a pod's devices
found by ``pod`` label with the utilisation the simulator reports, a failed
GPU's health and its alert, every dashboard query answered, the dashboard
drawn to tests/output/gpu-exporter-dashboard.png.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.gpu import mxsmi_json
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "deviceplugin"))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "agents"))
from agent_process import agent_env  # noqa: E402
from prometheus_server import DASHBOARD, OUTPUT, Prometheus, free_port, values, wait  # noqa: E402

NODE = "gpu-node-1"
RESOURCE = "metax-tech.com/gpu"


@pytest.fixture(scope="module")
def scraped(tmp_path_factory):
    from kubelet_peer import PodResourcesPeer
    from ansible_collections.metax.gpu.plugins.module_utils.sim.spec import preset

    base = tmp_path_factory.mktemp("exporter-prometheus")
    host = generator.create(str(base / "node"), preset("2xC550-sriov"))
    pfs = [g["bdf"] for g in generator.load_state(host)["gpus"]]
    host.write_attribute("sys/bus/pci/devices/%s/sriov_numvfs" % pfs[0], "4")
    vfs = [b for b in generator.device_bdfs(host) if b not in pfs]
    peer = PodResourcesPeer(str(base / "kubelet.sock"))
    peer.assignments = [("team-a", "train-0", "trainer", RESOURCE, [vfs[1]]),
                        ("team-b", "infer-1", "server", RESOURCE, [pfs[1]])]
    peer.start()
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ansible_collections.metax.gpu.plugins.module_utils.agents.gpu_exporter",
         "--host-root", host.path, "--address", "127.0.0.1", "--port", str(port), "--interval", "1",
         "--mx-smi-timeout", "10",
         "--node-name", NODE, "--pod-resources-socket", peer.socket, "--log-format", "text"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=agent_env())
    prometheus = None
    try:
        wait(lambda: _healthz(port), 120, "gpu-exporter /healthz")      # the process imports grpc: generous
        prometheus = Prometheus("127.0.0.1:%d" % port)
        wait(lambda: len(prometheus.query("metax_gpu_healthy")) == 6, 60, "6 devices in Prometheus")
        yield host, prometheus, {"pfs": pfs, "vfs": vfs}
    finally:
        if prometheus is not None:
            prometheus.stop()
        proc.terminate()
        proc.communicate(timeout=30)
        peer.stop()


def _healthz(port):
    try:
        return urllib.request.urlopen("http://127.0.0.1:%d/healthz" % port, timeout=30).status == 200
    except OSError:
        return False


def mx_smi_utilization(host, bdf):
    out = subprocess.run([host.join(generator.MX_SMI_PATH), "-j"], capture_output=True, text=True, check=True).stdout
    return [d for d in mxsmi_json.parse_json(out).devices if d.bdf == bdf][0].utilization_percent / 100


def test_every_device_and_its_labels(scraped):
    _host, prom, dev = scraped
    # the latest scrape may have timed out under load (stale series, up 0): wait for one that answered
    health = wait(lambda: prom.query("metax_gpu_healthy") if values(prom.query('up{job="gpu-exporter"}')) == {"": 1.0}
                  else None, 60, "a scrape of gpu-exporter that answered")
    assert values(health) == {b: 1.0 for b in dev["pfs"] + dev["vfs"]}
    assert {r["metric"]["node"] for r in health} == {NODE}
    assert {r["metric"]["job"] for r in health} == {"gpu-exporter"}


def test_a_pods_devices_by_pod_label_with_the_simulators_utilisation(scraped):
    host, prom, dev = scraped
    device = dev["vfs"][1]
    generator.set_load(host, device, 0.8)
    try:
        found = wait(lambda: [r for r in prom.query('metax_gpu_utilization_ratio{pod="train-0"}')
                              if float(r["value"][1]) >= 0.5], 60, "train-0 busy in Prometheus")
        assert [(r["metric"]["bdf"], r["metric"]["namespace"], r["metric"]["container"]) for r in found] == \
            [(device, "team-a", "trainer")]
        # the wave moves over minutes: Prometheus holds what mx-smi says now
        assert abs(float(found[0]["value"][1]) - mx_smi_utilization(host, device)) <= 0.05
        # a scrape that timed out under load leaves the series stale (empty) until the next one answers:
        # each query waits for an answer of its own (as the dashboard's below)
        idle = wait(lambda: values(prom.query('metax_gpu_utilization_ratio{pod="infer-1"}')), 60,
                    "infer-1's device in Prometheus")
        assert idle == {dev["pfs"][1]: 0.0}
        by_pod = wait(lambda: prom.query("sum by (namespace, pod) (metax_gpu_allocated{pod!=\"\"})"), 60,
                      "the devices allocated by pod in Prometheus")
        assert {(r["metric"]["namespace"], r["metric"]["pod"]) for r in by_pod} == \
            {("team-a", "train-0"), ("team-b", "infer-1")}
    finally:
        generator.set_load(host, device, 0.0)


def test_failed_gpu_shows_unhealthy_and_its_alert_pending(scraped):
    host, prom, dev = scraped
    generator.fail_gpu(host, 1, "smi")
    try:
        wait(lambda: values(prom.query('metax_gpu_healthy{gpu="1"}')) == {dev["pfs"][1]: 0.0}, 60,
             "GPU 1 unhealthy in Prometheus")
        alerts = wait(lambda: prom.query('ALERTS{alertname="MetaxGpuUnhealthy"}'), 30, "the alert")
        assert [(a["metric"]["bdf"], a["metric"]["alertstate"]) for a in alerts] == [(dev["pfs"][1], "pending")]
    finally:
        generator.recover_gpu(host, 1)
    wait(lambda: values(prom.query('metax_gpu_healthy{gpu="1"}')) == {dev["pfs"][1]: 1.0}, 60, "GPU 1 healthy")


def test_every_dashboard_query_answers_and_the_picture(scraped):
    import dashboard_png

    host, prom, dev = scraped
    generator.set_load(host, dev["vfs"][1], 0.6)
    generator.set_load(host, dev["pfs"][1], 0.3)
    try:
        # some seconds of load, so the picture shows it
        wait(lambda: prom.query("count_over_time((metax_gpu_utilization_ratio > 0.2)[30s:1s]) >= 15"), 90,
             "15 s of load in Prometheus")
        with open(DASHBOARD) as handle:
            dashboard = json.load(handle)

        queries = [(p["title"], t["expr"].replace("$node", NODE)) for p in dashboard["panels"]
                   for t in p.get("targets", [])]
        assert len(queries) >= 5, queries
        # Prometheus scrapes every second with a 1 s timeout: on a loaded machine a scrape can time out, and
        # the target's series read as stale (empty) until the next one answers. Each query waits for an
        # answer of its own: a pass over all of them without one stale moment never came in 60 s under CI
        for title, expr in queries:
            wait(lambda expr=expr: prom.query(expr), 60, "the dashboard's %r query (%s) to answer" % (title, expr))
        os.makedirs(OUTPUT, exist_ok=True)
        path = os.path.join(OUTPUT, "gpu-exporter-dashboard-sim.png")
        assert dashboard_png.render(prom.port, dashboard, path, NODE, prom.age()) >= 20
        assert os.path.getsize(path) > 10000
    finally:
        generator.clear_load(host)
