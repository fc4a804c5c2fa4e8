# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""gpu-aware at scale: the real kube-scheduler choosing among N fake GPU nodes (kwok), cache mode.

    flock -o /tmp/metax-cluster.lock env PYTHONPATH=.build/collections:tests \\
        .venv/bin/python benchmarks/scale_gpu_aware.py [--sizes 500,1000,2000] [--pods 1000]

Needs the local cluster up and kwok built (scripts/deps.sh). For each N
(ascending; the fleet grows, the first nodes stay): the same GPU pods are
scheduled twice by a kube-scheduler of our own -- without the extender, then
with gpu-aware (nodeCacheCapable: true, its node cache filled by list+watch)
-- and the run prints

* filter and prioritize latency as the scheduler called them, from the
  extender's own histogram ``gpu_aware_request_duration_seconds`` (p50/p99
  interpolated inside its buckets; the share of calls <= 5 ms is exact, 5 ms
  being a bucket bound). Target at 2,000 nodes: p99 <= 5 ms;
* the extender's RSS (VmRSS, and VmHWM: the peak);
* scheduling throughput (pods bound per second, first binding to last) with
  and without the extender, and their ratio. Target: >= 50 %.

Every fake node and pod is deleted at the end, also on failure.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
for path in (os.path.join(REPO, ".build", "collections"), os.path.join(REPO, "tests")):
    if path not in sys.path:
        sys.path.insert(0, path)

from localcluster import fakenodes  # noqa: E402
from localcluster.settings import from_env  # noqa: E402
from scale import scheduling  # noqa: E402
from scale.profile import ScaleProfile  # noqa: E402

P99_TARGET_MS = 5.0
THROUGHPUT_TARGET = 0.5


def real_node_count(client: fakenodes.ApiClient) -> int:
    return sum(1 for n in client.list_pages("/api/v1/nodes")
               if (n["metadata"].get("labels") or {}).get(fakenodes.FAKE_LABEL[0]) != fakenodes.FAKE_LABEL[1])


def run(sizes, pods: int) -> list:
    settings = from_env(os.environ)
    bin_dir = scheduling.k8s_bin_dir(settings)
    results = []
    with ScaleProfile(settings) as prof:
        client = prof.client
        extender = None
        try:
            for size in sizes:
                prof.grow(size)
                print("N=%d: %d fake nodes Ready (create %.1f s, Ready %.1f s)" % (
                    size, size, prof.timings["create_s"], prof.timings["ready_s"]), flush=True)
                if extender is None:
                    extender = scheduling.GpuAware(settings)
                cache_s = extender.wait_cache(size + real_node_count(client))
                # Never more pods than the fleet takes (2 per node: ~1.6 GPUs per pod, ~4.7 GPUs per node).
                count = min(pods, 2 * size)
                plain = scheduling.schedule_pods(client, settings, bin_dir, count, None)
                scheduling.delete_pods(client)
                before = extender.metrics()
                with_ext = scheduling.schedule_pods(client, settings, bin_dir, count, extender.port)
                text = scheduling.diff_text(extender.metrics(), before)
                scheduling.delete_pods(client)
                filt = scheduling.histogram(text, "gpu_aware_request_duration_seconds", "filter")
                prio = scheduling.histogram(text, "gpu_aware_request_duration_seconds", "prioritize")
                mem = scheduling.rss_kib(extender.pid)
                row = {"nodes": size, "pods": count, "cache_sync_s": round(cache_s, 2),
                       "filter": filt.__dict__, "prioritize": prio.__dict__,
                       "rss_mib": round(mem["VmRSS"] / 1024, 1), "hwm_mib": round(mem["VmHWM"] / 1024, 1),
                       "plain": plain.__dict__, "extender": with_ext.__dict__,
                       "throughput_ratio": (with_ext.pods_per_s / plain.pods_per_s) if plain.pods_per_s else 0.0}
                results.append(row)
                print(json.dumps(row), flush=True)
        finally:
            if extender is not None:
                extender.stop()
            scheduling.delete_namespace(client)
    return results


def report(results: list) -> bool:
    print("\n%6s %6s | %9s %8s %8s %6s %6s | %9s %8s %8s %6s %6s | %7s %7s | %9s %9s %6s" % (
        "nodes", "pods", "filt mean", "p50", "p99", "<=1ms", "<=5ms", "prio mean", "p50", "p99", "<=1ms", "<=5ms",
        "RSS MiB", "peak", "plain p/s", "ext p/s", "ratio"))
    for r in results:
        f, p = r["filter"], r["prioritize"]
        print("%6d %6d | %9.2f %8.2f %8.2f %5.1f%% %5.1f%% | %9.2f %8.2f %8.2f %5.1f%% %5.1f%% | %7.1f %7.1f | "
              "%9.1f %9.1f %5.0f%%" % (
                  r["nodes"], r["pods"], f["mean_ms"], f["p50_ms"], f["p99_ms"], 100 * f["within_1ms"],
                  100 * f["within_5ms"], p["mean_ms"], p["p50_ms"], p["p99_ms"], 100 * p["within_1ms"],
                  100 * p["within_5ms"], r["rss_mib"], r["hwm_mib"], r["plain"]["pods_per_s"],
                  r["extender"]["pods_per_s"], 100 * r["throughput_ratio"]))
    first, last = results[0], results[-1]
    if len(results) > 1:
        grow = last["nodes"] / first["nodes"]
        print("\ngrowth %d -> %d nodes (x%.1f): filter mean x%.2f, prioritize mean x%.2f, RSS x%.2f, "
              "throughput with extender x%.2f" % (
                  first["nodes"], last["nodes"], grow, last["filter"]["mean_ms"] / first["filter"]["mean_ms"],
                  last["prioritize"]["mean_ms"] / first["prioritize"]["mean_ms"], last["rss_mib"] / first["rss_mib"],
                  last["extender"]["pods_per_s"] / first["extender"]["pods_per_s"]))
    ok = (last["filter"]["within_5ms"] >= 0.99 and last["prioritize"]["within_5ms"] >= 0.99
          and last["throughput_ratio"] >= THROUGHPUT_TARGET)
    print("targets at %d nodes (p99 <= %.0f ms, throughput >= %.0f%% of plain): %s" % (
        last["nodes"], P99_TARGET_MS, 100 * THROUGHPUT_TARGET, "met" if ok else "NOT met"))
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--sizes", default="500,1000,2000", help="fake node counts, ascending (default %(default)s)")
    parser.add_argument("--pods", type=int, default=1000, help="GPU pods scheduled per run (default %(default)s)")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(","))
    start = time.monotonic()
    results = run(sizes, args.pods)
    ok = report(results)
    print("total %.0f s" % (time.monotonic() - start))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(results, fh, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
