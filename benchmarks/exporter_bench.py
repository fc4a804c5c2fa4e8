# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""gpu-exporter: scrape latency, RSS and mx-smi runs per minute under ten scrapers.

    PYTHONPATH=.build/collections .venv/bin/python benchmarks/exporter_bench.py [--seconds 60] [--interval 15]

A simulated node of 16 GPUs (the 16xC500 layout, as SR-IOV capable C550s) with 4 VFs each (16 GPUs, 64 VFs, 80 series per
device metric), a load on every third VF. The real agent runs as its own
process (``python -m ...agents.gpu_exporter``); the node's ``mx-smi`` is
wrapped by a script that logs every run, so mx-smi runs are counted from
outside the exporter (discovery's included), not from its own counter.

* **Scrape latency**: ten scraper threads, each GETting ``/metrics`` every
  second for ``--seconds``; p50/p99/max at the client. Baselines in the same
  run: ``GET /healthz`` on the same server (HTTP without work), and one
  ``mx-smi`` table run (what every scrape would cost without the shared
  reading).
* **RSS** of the exporter after the run, against a bare ``python3`` that has
  imported nothing, measured in the same run.
* **mx-smi runs per minute** (wrapper log), against the ceiling of the
  design: 2 runs (``-j`` and the table) per interval.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from typing import List

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
COLLECTIONS = os.path.join(REPO, ".build", "collections")
if COLLECTIONS not in sys.path:
    sys.path.insert(0, COLLECTIONS)

from ansible_collections.metax.gpu.plugins.module_utils.host import HostRoot  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.sim.spec import preset  # noqa: E402

AGENT = "ansible_collections.metax.gpu.plugins.module_utils.agents.gpu_exporter"
SCRAPERS = 10
VFS = 4


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rss_kib(pid: int) -> int:
    with open("/proc/%d/status" % pid) as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS for %d" % pid)


def count_lines(path: str) -> int:
    with open(path) as handle:
        return sum(1 for _line in handle)


def percentile(values: List[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def make_node(root: str, log: str) -> HostRoot:
    # the 16xC500 layout, with SR-IOV capable boards (C550) so each GPU can have VFs
    base = preset("16xC500")
    spec = dataclasses.replace(base, name="16xC550-sriov", gpus=tuple(
        dataclasses.replace(g, product="C550", sriov_totalvfs=8) for g in base.gpus))
    host = generator.create(root, spec)
    for gpu in generator.load_state(host)["gpus"]:
        host.write_attribute("sys/bus/pci/devices/%s/sriov_numvfs" % gpu["bdf"], str(VFS))
    for i, bdf in enumerate(generator.device_bdfs(host)):
        if i % 3 == 1:
            generator.set_load(host, bdf, 0.7)
    # count every mx-smi run from outside the exporter
    real = host.join(generator.MX_SMI_PATH)
    os.rename(real, real + ".real")
    with open(real, "w") as handle:
        handle.write('#!/bin/sh\necho "$(date +%%s.%%N) $*" >> %s\nexec "$0.real" "$@"\n' % log)
    os.chmod(real, 0o755)
    return host


def timed_get(url: str) -> float:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as response:
        response.read()
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--interval", type=float, default=15.0)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="exporter-bench-")
    log = os.path.join(work, "mx-smi.log")
    open(log, "w").close()
    host = make_node(os.path.join(work, "node"), log)
    devices = len(generator.device_bdfs(host))
    port = free_port()
    env = dict(os.environ, PYTHONPATH=COLLECTIONS)
    proc = subprocess.Popen([sys.executable, "-m", AGENT, "--host-root", host.path, "--port", str(port),
                             "--address", "127.0.0.1", "--interval", str(args.interval), "--node-name", "bench",
                             "--pod-resources-socket", "", "--log-format", "text", "--log-level", "warning"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    bare = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    base = "http://127.0.0.1:%d" % port
    try:
        for _attempt in range(300):
            try:
                timed_get(base + "/healthz")
                break
            except OSError:
                time.sleep(0.1)
        cold = timed_get(base + "/metrics")        # waits for the first reading if it is still running
        with urllib.request.urlopen(base + "/metrics", timeout=60) as response:
            body = response.read().decode()
        series = body.count("\nmetax_gpu_healthy{")
        started_runs = count_lines(log)
        latencies: List[float] = []
        health: List[float] = []
        lock = threading.Lock()
        deadline = time.monotonic() + args.seconds
        t0 = time.monotonic()

        def scraper(index: int) -> None:
            next_at = time.monotonic() + index / SCRAPERS
            while time.monotonic() < deadline:
                time.sleep(max(0.0, next_at - time.monotonic()))
                took = timed_get(base + "/metrics")
                baseline = timed_get(base + "/healthz")
                with lock:
                    latencies.append(took)
                    health.append(baseline)
                next_at += 1.0

        threads = [threading.Thread(target=scraper, args=(i,)) for i in range(SCRAPERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.monotonic() - t0
        runs = count_lines(log) - started_runs
        rss, bare_rss = rss_kib(proc.pid), rss_kib(bare.pid)
        smi = []
        for _run in range(5):
            started = time.perf_counter()
            subprocess.run([host.join(generator.MX_SMI_PATH) + ".real"], stdout=subprocess.DEVNULL, check=True)
            smi.append(time.perf_counter() - started)
    finally:
        proc.terminate()
        bare.terminate()
        proc.wait(10)
        bare.wait(10)
    p50, p99 = statistics.median(latencies), percentile(latencies, 0.99)
    h50, h99 = statistics.median(health), percentile(health, 0.99)
    smi_ms = statistics.median(smi) * 1000
    per_minute = runs * 60.0 / elapsed
    ceiling = 2 * 60.0 / args.interval
    print("gpu-exporter benchmark: 16 GPUs x %d VFs = %d devices (%d healthy series), %d scrapers x 1/s, "
          "%.0fs, interval %.0fs" % (VFS, devices, series, SCRAPERS, elapsed, args.interval))
    print("%-44s %10s %10s %10s" % ("", "p50 ms", "p99 ms", "max ms"))
    print("%-44s %10.2f %10.2f %10.2f" % ("/metrics (shared reading)", p50 * 1000, p99 * 1000, max(latencies) * 1000))
    print("%-44s %10.2f %10.2f %10.2f" % ("/healthz (baseline: HTTP only)", h50 * 1000, h99 * 1000, max(health) * 1000))
    print("%-44s %10.2f" % ("one mx-smi table run (baseline)", smi_ms))
    print("%-44s %10.2f" % ("first /metrics (waits for the first reading)", cold * 1000))
    print("ratios: /metrics p50 / healthz p50 = %.2fx; /metrics p50 / one mx-smi run = %.3fx"
          % (p50 / h50, p50 * 1000 / smi_ms))
    print("RSS: exporter %.1f MiB, bare python3 %.1f MiB (%.2fx)" % (rss / 1024, bare_rss / 1024, rss / bare_rss))
    print("mx-smi runs: %d in %.0fs = %.1f/min with %d scrapes/min; ceiling 2 per interval = %.1f/min (%.2fx of it)"
          % (runs, elapsed, per_minute, len(latencies) * 60 / elapsed, ceiling, per_minute / ceiling))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
