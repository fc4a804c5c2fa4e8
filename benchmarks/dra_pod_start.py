# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""A pod's creation to Running on the local cluster: through DRA and through the device plugin with gpu-aware.

    make -C benchmarks dra-pod-start          (or, from the repository root:)
    flock -o /tmp/metax-cluster.lock env PYTHONPATH=.build/collections \\
        .venv/bin/python benchmarks/dra_pod_start.py [--pods 10] [--json FILE]
    .venv/bin/python benchmarks/dra_pod_start.py --report-only     # the table of the last run's JSON

Needs the three-node local cluster up (this script never starts or stops it;
run it after the cluster tests). It runs the opt-in cluster test
tests/integration/test_dra_pod_start_cluster.py (``METAX_BENCH_POD_START=1``;
without it the module is skipped, so the suite's time does not grow), which
reads tests/output/dra-pod-start.json back. One run, one node, one after the
other, so that both paths see the same machine:

* the 8xC500 node with gpu-device and gpu-dra as the mode-switch tests run
  them (test_dra_switch_cluster.py's ``switching`` fixture: both DaemonSets
  placed by the Extensions chart's affinity), switched with the project's
  switch (dra/switch_run.py, what metax.gpu.gpu_device_mode runs);
* **device plugin**: gpu-aware and a second kube-scheduler using it as its
  extender (test_gpu_aware_scheduler.py's ``Running``, nodeCacheCapable
  true); pods asking ``metax-tech.com/gpu: N``;
* **DRA**: the node switched to DRA; pods with a ResourceClaimTemplate (1 GPU
  plain, 4 GPUs with ``matchAttribute`` on the MetaXLink group, as
  docs/dra.md's templates), the default kube-scheduler alone;
* the device plugin's pods are split in two halves, before and after the
  DRA ones (plugin, DRA, plugin), so that a drift of the machine's load
  during the run weighs on both paths alike; each leg starts with one warm-up
  pod that is not counted (the first claim after a switch, the extender's
  first request).

Pods of 1 and 4 GPUs alternate, one at a time on an idle node: each is
deleted, and its GPUs are free again (no ResourceClaim left; gpu-device's
annotation all free, what gpu-aware reads) before the next is created. The
pods are the same but for what they ask: the agent image (on the node
already) running ``sleep``, pinned to the node.

Two clocks, both reported:

* **client**: this machine's monotonic clock, from the create call's return
  to the first poll (every 0.2 s) that reads ``status.phase: Running``; also
  the first poll that reads ``spec.nodeName`` (bound). Late by up to one
  poll interval plus a GET, the same for both paths;
* **server**: the pod's own timestamps, ``metadata.creationTimestamp`` to
  ``status.containerStatuses[0].state.running.startedAt`` (the container's
  start as the runtime reports it to the kubelet) and to the
  ``PodScheduled`` condition's ``lastTransitionTime``: whole seconds (the
  API's granularity), so a median of 1 s means 0.5-1.5 s.

Printed: p50/p99 (nearest rank: of 10 pods, p99 is the slowest) and the mean per path and size, the
ratios DRA / device plugin, and gpu-aware's own filter time inside the device plugin's figures (its
``gpu_aware_request_duration_seconds``); written to benchmarks/results/dra_pod_start.txt.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import dra_common as D  # noqa: E402

OPT_IN = "METAX_BENCH_POD_START"          # =1: the cluster test runs (it is skipped otherwise)
PODS_ENV = "METAX_BENCH_POD_START_PODS"   # pods per path and size (default DEFAULT_PODS)
DEFAULT_PODS = 10
OUTPUT = os.path.join(ROOT, "tests", "output", "dra-pod-start.json")
TEST = "tests/integration/test_dra_pod_start_cluster.py"
POLL_SECONDS = 0.2
DRA = "dra"
PLUGIN = "device-plugin"
PATHS = (DRA, PLUGIN)
SIZES = (1, 4)
# client: create returned -> first poll seeing it; server: creationTimestamp -> the pod's own timestamp
CLIENT_KEYS = ("bound_s", "running_s")
SERVER_KEYS = ("scheduled_s", "started_s")


def enabled(environ: Optional[Mapping[str, str]] = None) -> bool:
    """The opt-in: ``METAX_BENCH_POD_START`` set and not 0/false/no/off."""
    value = (os.environ if environ is None else environ).get(OPT_IN, "").strip().lower()
    return value not in ("", "0", "false", "no", "off")


def pods_per_size(environ: Optional[Mapping[str, str]] = None) -> int:
    value = (os.environ if environ is None else environ).get(PODS_ENV, "").strip()
    pods = int(value) if value else DEFAULT_PODS
    if pods < 2:
        raise ValueError("%s must be 2 or more (the device plugin's pods are split before and after DRA's)" % PODS_ENV)
    return pods


def halves(pods: int) -> Tuple[int, int]:
    """The device plugin's pods per size before and after the DRA leg."""
    return pods // 2, pods - pods // 2


def sequence(pods: int) -> List[int]:
    """The sizes of a leg's pods, 1 and 4 GPUs alternating (both see the same drift)."""
    return [size for _pod in range(pods) for size in SIZES]


def parse_time(text: str) -> float:
    """An RFC 3339 timestamp of the API (``2026-11-28T20:01:02Z``) as seconds since the epoch."""
    stamp = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=datetime.timezone.utc)
    return stamp.timestamp()


def server_times(pod: Mapping[str, Any]) -> Dict[str, Optional[float]]:
    """Seconds from the pod's ``creationTimestamp`` to its own later timestamps (None where absent):
    ``scheduled_s`` (the PodScheduled condition turned True), ``started_s`` (its first container's
    ``state.running.startedAt``), ``ready_s`` (the Ready condition turned True). Whole seconds."""
    created = parse_time(pod["metadata"]["creationTimestamp"])
    status = pod.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []}

    def since(stamp: Optional[str]) -> Optional[float]:
        return None if not stamp else parse_time(stamp) - created

    def turned_true(kind: str) -> Optional[float]:
        cond = conditions.get(kind) or {}
        return since(cond.get("lastTransitionTime")) if cond.get("status") == "True" else None

    containers = status.get("containerStatuses") or []
    running = ((containers[0].get("state") or {}).get("running") or {}) if containers else {}
    return {"scheduled_s": turned_true("PodScheduled"), "started_s": since(running.get("startedAt")),
            "ready_s": turned_true("Ready")}


def sample_value(text: str, series: str) -> float:
    """A sample's value in a Prometheus text exposition, by its exposed name and labels as written
    (``gpu_aware_filter_nodes_total{result="passed"}``); 0 when absent (a counter not incremented yet)."""
    for line in text.splitlines():
        name, _sep, value = line.rpartition(" ")
        if name == series:
            return float(value)
    return 0.0


def stats(values: Iterable[Optional[float]]) -> Dict[str, float]:
    got = [v for v in values if v is not None]
    if not got:
        return {"n": 0, "p50": float("nan"), "p99": float("nan"), "mean": float("nan"), "max": float("nan")}
    return {"n": len(got), "p50": D.percentile(got, 50), "p99": D.percentile(got, 99), "mean": sum(got) / len(got),
            "max": max(got)}


def ratio(top: float, bottom: float) -> float:
    return top / bottom if bottom else float("nan")


def summarise(samples: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    """Per path and size, the statistics of every clock's figure (warm-up pods left out), and per size the
    ratios DRA / device plugin of p50 and p99."""
    rows: Dict[str, Dict[str, Any]] = {}
    for path in PATHS:
        for size in SIZES:
            mine = [s for s in samples if s["path"] == path and s["gpus"] == size and not s.get("warmup")]
            rows["%s/%d" % (path, size)] = {key: stats(s.get(key) for s in mine)
                                            for key in CLIENT_KEYS + SERVER_KEYS + ("create_call_s",)}
    ratios = {}
    for size in SIZES:
        dra, plugin = rows["%s/%d" % (DRA, size)], rows["%s/%d" % (PLUGIN, size)]
        ratios[str(size)] = {"%s_%s" % (key, q): ratio(dra[key][q], plugin[key][q])
                             for key in ("running_s", "started_s", "bound_s") for q in ("p50", "p99")}
    return {"rows": rows, "ratios": ratios}


def report(result: Mapping[str, Any]) -> List[str]:
    # a run cut short wrote its legs so far but no summary: the table of what it has
    summary = result.get("summary") or summarise(result.get("samples") or [])
    rows, ratios = summary["rows"], summary["ratios"]
    lines = ["machine: %s; Kubernetes %s; node %s (%s); %d pods per path and size (the device plugin's %d before "
             "and %d after DRA's), one at a time, polled every %.1f s" % (
                 result.get("machine", "?"), result.get("kubernetes", "?"), result.get("node", "?"),
                 result.get("preset", "?"), result.get("pods", 0), result.get("plugin_halves", [0, 0])[0],
                 result.get("plugin_halves", [0, 0])[1], result.get("poll_seconds", POLL_SECONDS)),
             "",
             "%-14s %4s | %-24s | %-20s | %-20s | %-21s" % (
                 "path", "GPUs", "to Running, client (s)", "to bound, client (s)", "started, server (s)",
                 "scheduled, server (s)"),
             "%-14s %4s | %3s %6s %6s %6s | %6s %6s %6s | %6s %6s %6s | %10s %10s" % (
                 "", "", "n", "p50", "p99", "mean", "p50", "p99", "mean", "p50", "p99", "mean", "p50", "p99")]
    for size in SIZES:
        for path in PATHS:
            r = rows["%s/%d" % (path, size)]
            run, bound, started, sched = r["running_s"], r["bound_s"], r["started_s"], r["scheduled_s"]
            lines.append("%-14s %4d | %3d %6.2f %6.2f %6.2f | %6.2f %6.2f %6.2f | %6.0f %6.0f %6.2f | %10.0f %10.0f" % (
                path, size, run["n"], run["p50"], run["p99"], run["mean"], bound["p50"], bound["p99"], bound["mean"],
                started["p50"], started["p99"], started["mean"], sched["p50"], sched["p99"]))
    lines += ["", "DRA / device plugin:"]
    for size in SIZES:
        q = ratios[str(size)]
        lines.append("  %d GPU%s: created -> Running (client) p50 x%.2f, p99 x%.2f; -> started (server) p50 x%.2f, "
                     "p99 x%.2f; -> bound (client) p50 x%.2f, p99 x%.2f" % (
                         size, "" if size == 1 else "s", q["running_s_p50"], q["running_s_p99"],
                         q["started_s_p50"], q["started_s_p99"], q["bound_s_p50"], q["bound_s_p99"]))
    calls = [s["create_call_s"] for s in result.get("samples", []) if s.get("create_call_s") is not None]
    if calls:
        lines.append("the create call itself (not in the figures above): p50 %.3f s, p99 %.3f s"
                     % (D.percentile(calls, 50), D.percentile(calls, 99)))
    warm = [s for s in result.get("samples", []) if s.get("warmup")]
    if warm:
        lines.append("warm-up pods (not counted), created -> Running (client): %s" % ", ".join(
            "%s %.2f s" % (s["path"], s["running_s"]) for s in warm if s.get("running_s") is not None))
    legs = result.get("legs") or []
    filters = [leg for leg in legs if leg.get("filter_requests")]
    if filters:
        count = sum(leg["filter_requests"] for leg in filters)
        lines.append("gpu-aware's filter (inside the device plugin's figures): %d requests, mean %.1f ms" % (
            count, 1000.0 * sum(leg["filter_seconds"] for leg in filters) / count))
    if legs:
        lines.append("legs: %s" % "; ".join("%s %.0f s (load %.2f -> %.2f)" % (
            leg["path"], leg["seconds"], leg["load_start"], leg["load_end"]) for leg in legs))
    switches = result.get("switches") or []
    if switches:
        lines.append("switches: %s" % "; ".join("to %s %.0f s" % (s["to"], s["seconds"]) for s in switches))
    return lines


def environment(pods: int) -> Dict[str, str]:
    out = dict(os.environ)
    out.update({OPT_IN: "1", PODS_ENV: str(pods), "METAX_CLUSTER_REUSE": "1", "METAX_KEEP_CLUSTER": "1",
                "PYTHONPATH": os.path.join(ROOT, ".build", "collections"),
                "PATH": os.path.join(ROOT, ".venv", "bin") + os.pathsep + out.get("PATH", "")})
    return out


def run_test(pods: int) -> Dict[str, Any]:
    # the cluster tests' conftest would bring a stopped cluster up (a cold start builds Kubernetes): refuse instead
    status = subprocess.run(["bash", os.path.join(ROOT, "scripts", "cluster", "cluster.sh"), "status"], cwd=ROOT,
                            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120, check=False)
    if status.returncode != 0:
        raise SystemExit("the local cluster is not up (scripts/cluster/cluster.sh status): bring it up first "
                         "(make cluster-up), or run after the cluster tests with METAX_KEEP_CLUSTER=1")
    if os.path.exists(OUTPUT):
        os.unlink(OUTPUT)
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-x", "-s", "-q", "-m", "cluster", TEST]
    proc = subprocess.run(cmd, cwd=ROOT, env=environment(pods), capture_output=True, text=True, timeout=7200,
                          check=False)
    if proc.returncode != 0:
        raise SystemExit("%s failed:\n%s\n%s" % (TEST, proc.stdout[-6000:], proc.stderr[-2000:]))
    return load(OUTPUT)


def load(path: str) -> Dict[str, Any]:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n", maxsplit=1)[0])
    parser.add_argument("--pods", type=int, default=DEFAULT_PODS, help="pods per path and size (default %(default)s)")
    parser.add_argument("--report-only", action="store_true", help="print the table of %s, run nothing" % OUTPUT)
    parser.add_argument("--json", help="also copy the figures to this file")
    args = parser.parse_args(argv)
    started = time.monotonic()
    result = load(OUTPUT) if args.report_only else run_test(args.pods)
    lines = report(result)
    if not args.report_only:
        lines.append(D.closing_line(started))
    print("\n".join(lines))
    D.write_results("dra_pod_start.txt", lines, result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
