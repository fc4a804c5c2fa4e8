# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""`make demo`'s last step: Debian's Prometheus scrapes every gpu-exporter pod; one line per GPU.

    python scripts/demo_metrics.py [--port 9090] [--timeout 90]

Starts ``prometheus`` (requirements/system.txt) on 127.0.0.1, detached,
scraping every pod labelled ``app.kubernetes.io/name=metax-gpu-exporter`` (port
``metrics``) with the chart's alert rules, and leaves it running for the reader: its PID file is the local
cluster's (``<cluster dir>/pids/demo-prometheus.pid``), so ``make
cluster-down`` stops it, and a second demo replaces it. Then it waits until
every exporter pod is scraped and prints, from Prometheus, one line per GPU
of the cluster and where the metrics are.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHART_FILES = os.path.join(REPO, "files", "charts", "metax-gpu-extensions", "files")
RULES = os.path.join(CHART_FILES, "gpu-exporter-rules.yaml")
DASHBOARD = os.path.join(CHART_FILES, "gpu-exporter-dashboard.json")
NAME = "demo-prometheus"
SCRAPE = "2s"
GIB = 1024.0 ** 3


def cluster_dir():
    return os.environ.get("METAX_CLUSTER_DIR", "/var/lib/metax-gpu-cluster")


def metrics_port(pod):
    return next(p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports", [])
                if p.get("name") == "metrics")


def targets(pods):
    """Prometheus file_sd targets: every exporter pod, its node as ``instance``."""
    return [{"targets": ["%s:%d" % (p["status"]["podIP"], metrics_port(p))],
             "labels": {"instance": p["spec"].get("nodeName", "")}} for p in pods]


def config(targets_file):
    """Prometheus' configuration (YAML is a superset of JSON).

    Debian's prometheus is built without Kubernetes service discovery: the
    exporter pods, as the API lists them now, go to a file_sd file (rewrite
    it and Prometheus follows; a next demo does).
    """
    return {
        "global": {"scrape_interval": SCRAPE, "evaluation_interval": SCRAPE},
        "rule_files": [RULES],
        "scrape_configs": [{
            "job_name": "gpu-exporter",
            # namespace/pod/container on a series are the workload's holding the device
            "honor_labels": True,
            "file_sd_configs": [{"files": [targets_file], "refresh_interval": "10s"}],
        }],
    }


def _pid_files():
    pids = os.path.join(cluster_dir(), "pids")
    return pids, os.path.join(pids, NAME + ".pid"), os.path.join(pids, NAME + ".exe")


def alive(pid):
    """The process exists and is not a zombie (exited, not yet reaped)."""
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def stop_previous():
    """End the Prometheus a previous demo left, only if its PID file's process still runs that binary."""
    _pids, pid_file, exe_file = _pid_files()
    try:
        with open(pid_file) as handle:
            pid = int(handle.read().strip())
        with open(exe_file) as handle:
            exe = handle.read().strip()
        running = os.readlink("/proc/%d/exe" % pid).replace(" (deleted)", "") == exe
    except (OSError, ValueError):
        running = False
    if running:
        os.kill(pid, 15)
        deadline = time.monotonic() + 10
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
    for path in (pid_file, exe_file):
        if os.path.exists(path):
            os.unlink(path)


def free(port):
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pick_port(wanted):
    if free(wanted):
        return wanted
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(binary, port, pods):
    pids, pid_file, exe_file = _pid_files()
    home = os.path.join(cluster_dir(), NAME)
    shutil.rmtree(home, ignore_errors=True)
    os.makedirs(home)
    os.makedirs(pids, exist_ok=True)
    targets_file = os.path.join(home, "targets.json")
    with open(targets_file, "w") as handle:
        json.dump(targets(pods), handle, indent=1)
    path = os.path.join(home, "prometheus.yml")
    with open(path, "w") as handle:
        json.dump(config(targets_file), handle, indent=1)
    log = open(os.path.join(home, "prometheus.log"), "w")
    proc = subprocess.Popen(
        [binary, "--config.file=" + path, "--storage.tsdb.path=" + os.path.join(home, "data"),
         "--web.listen-address=127.0.0.1:%d" % port, "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    with open(pid_file, "w") as handle:
        handle.write("%d\n" % proc.pid)
    with open(exe_file, "w") as handle:
        handle.write(os.path.realpath(binary) + "\n")
    return proc, home


def query(port, promql):
    url = "http://127.0.0.1:%d/api/v1/query?%s" % (port, urllib.parse.urlencode({"query": promql}))
    body = json.loads(urllib.request.urlopen(url, timeout=10).read().decode())
    if body.get("status") != "success":
        raise RuntimeError("%s: %s" % (promql, body))
    return body["data"]["result"]


def exporter_pods(kubectl, kubeconfig):
    out = subprocess.run([kubectl, "--kubeconfig", kubeconfig, "get", "pods", "-A", "-o", "json",
                          "-l", "app.kubernetes.io/name=metax-gpu-exporter"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    return [p for p in json.loads(out)["items"] if p.get("status", {}).get("phase") == "Running"]


def wait_scraped(proc, port, pods, timeout):
    """Every exporter pod up in Prometheus, and its GPUs there."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError("prometheus exited %s" % proc.returncode)
        try:
            up = query(port, 'up{job="gpu-exporter"} == 1')
            nodes = {r["metric"].get("node") for r in query(port, 'metax_gpu_healthy{function="pf"}')}
            if len(up) >= len(pods) and len(nodes) >= len(pods):
                return
        except (OSError, urllib.error.URLError, ValueError):
            pass            # not ready yet
        if time.monotonic() > deadline:
            raise RuntimeError("after %ds Prometheus does not scrape the %d gpu-exporter pod(s)" % (timeout, len(pods)))
        time.sleep(1)


def by_device(port, metric):
    return {(r["metric"].get("node", ""), r["metric"].get("bdf", "")): (r["metric"], float(r["value"][1]))
            for r in query(port, '%s{function="pf"}' % metric)}


def gpu_lines(port):
    """One line per GPU of the cluster: Prometheus' latest values, joined by (node, bdf)."""
    health = by_device(port, "metax_gpu_healthy")
    metrics = ("metax_gpu_utilization_ratio", "metax_gpu_memory_used_bytes", "metax_gpu_memory_total_bytes",
               "metax_gpu_temperature_celsius", "metax_gpu_power_watts", "metax_gpu_processes")
    values = {m: by_device(port, m) for m in metrics}
    # a GPU's pods: those holding it or one of its VFs (same node and gpu index)
    owners = [r["metric"] for r in query(port, 'metax_gpu_allocated{pod!=""} == 1')]
    lines = []
    for key in sorted(health, key=lambda k: (k[0], int(health[k][0].get("gpu", "0")))):
        labels, healthy = health[key]

        def value(metric, scale=1.0, fmt="%.0f", key=key):
            found = values[metric].get(key)
            return fmt % (found[1] * scale) if found else "-"

        pods = sorted({"%s/%s" % (m.get("namespace", ""), m.get("pod", "")) for m in owners
                       if m.get("node") == key[0] and m.get("gpu") == labels.get("gpu")})
        memory = "%s/%s GiB" % (value("metax_gpu_memory_used_bytes", 1 / GIB, "%.1f"),
                                value("metax_gpu_memory_total_bytes", 1 / GIB, "%.0f"))
        lines.append("%-6s GPU %-2s %s  %-5s util %4s%%  mem %-12s  %4s C  %4s W  procs %s  %-9s %s" % (
            key[0], labels.get("gpu", "?"), key[1], labels.get("product", "?"),
            value("metax_gpu_utilization_ratio", 100.0), memory, value("metax_gpu_temperature_celsius"),
            value("metax_gpu_power_watts"), value("metax_gpu_processes"),
            "healthy" if healthy == 1 else "UNHEALTHY", ",".join(pods) or "-"))
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=9090)
    parser.add_argument("--timeout", type=int, default=90)
    args = parser.parse_args(argv)
    binary = shutil.which("prometheus")
    if not binary:
        sys.stderr.write("prometheus is missing: Debian's prometheus package (requirements/system.txt)\n")
        return 1
    kubeconfig = os.environ["KUBECONFIG"]
    kubectl = os.path.join(os.environ["METAX_KUBE_BIN"], "kubectl")
    pods = exporter_pods(kubectl, kubeconfig)
    if not pods:
        sys.stderr.write("no gpu-exporter pod runs (gpuExporter.enabled / gpu_extensions_gpu_exporter_enabled)\n")
        return 1
    stop_previous()
    port = pick_port(args.port)
    started = time.monotonic()
    proc, home = start(binary, port, pods)
    try:
        wait_scraped(proc, port, pods, args.timeout)
    except RuntimeError as exc:
        with open(os.path.join(home, "prometheus.log")) as handle:
            sys.stderr.write("%s\n%s\n" % (exc, handle.read()[-2000:]))
        return 1
    print("Prometheus scrapes %d gpu-exporter pod(s) (%.0fs after its start); per GPU, from Prometheus:"
          % (len(pods), time.monotonic() - started))
    for line in gpu_lines(port):
        print("  " + line)
    print("\nWhere the metrics are:")
    for pod in sorted(pods, key=lambda p: p["spec"].get("nodeName", "")):
        where = (pod["spec"].get("nodeName"), pod["status"]["podIP"], metrics_port(pod))
        print("  gpu-exporter on %-6s http://%s:%d/metrics" % where)
    namespace = pods[0]["metadata"]["namespace"]
    print("  Service        gpu-exporter.%s (port metrics); metric list: docs/metrics.md" % namespace)
    print("  Prometheus     http://127.0.0.1:%d (pid %d, %s; every %s; alert rules: the chart's)"
          % (port, proc.pid, home, SCRAPE))
    print("                 e.g. curl -s 'http://127.0.0.1:%d/api/v1/query?query=metax_gpu_utilization_ratio'" % port)
    print("  Grafana        ConfigMap %s/gpu-exporter-dashboard (label grafana_dashboard=1), or import %s"
          % (namespace, os.path.relpath(DASHBOARD, REPO)))
    print("  Prometheus keeps running for you; 'make cluster-down' (or a next 'make demo') stops it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
