# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""gpu-aware's request latency while its node watch works (issue 29: the p99 tail at 2,000 nodes).

    PYTHONPATH=.build/collections .venv/bin/python benchmarks/extender_watch_load.py \\
        [--nodes 2000] [--window 20] [--baseline ../main/.build/collections] [--names 680]
        [--backgrounds idle,events,relists] [--rounds 1]

The real agent (cache mode) lists and watches a fake API server
(tests/unit/extender/extender_support.FakeApiServer) holding ``--nodes``
nodes, while a client in this process calls ``/filter`` then ``/prioritize``
with every node name (``--names``: a random sample of that many, as
kube-scheduler sends), one pod after the other at about the scheduler's pace
at 2,000 nodes (a pod every 15 ms). Three backgrounds, ``--window`` seconds
each:

* idle: the watch has nothing to do;
* events: the fake API server changes 50 nodes a second (their gpu-device
  annotations), so the watch decodes and applies 50 events a second;
* relists: ``--resync-seconds 4``, so the node cache lists every node again
  every 4 s during the window (the agent's default is 300 s: this puts the
  rare full list under the measurement on purpose).

Latency comes from the agent's own histogram
(``gpu_aware_request_duration_seconds``, as docs/scale.md reads it): p99 and
the share of calls within 5 ms. With ``--baseline``, the same runs are made
with the agent of another collections tree (main's, say), for before/after
figures from one run on one machine.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional, Sequence

import extender_bench  # noqa: E402  (puts the collection and tests/unit/extender on sys.path)
from extender_bench import COLLECTIONS, Agent, FakeApiServer, extender_args, gpu_pod, make_nodes  # noqa: E402

sys.path.insert(0, os.path.join(extender_bench.REPO, "tests"))
from extender_support import annotations  # noqa: E402
from scale import scheduling  # noqa: E402

PACE_S = 0.015
EVENTS_PER_S = 50.0
RESYNC_S = 4
BACKGROUNDS = ("idle", "events", "relists")


def churn(api: FakeApiServer, nodes: List[dict], rate: float, stop: threading.Event) -> None:
    """Change one node's gpu-device annotations ``rate`` times a second (other allocations)."""
    rng = random.Random(3)
    while not stop.wait(1.0 / rate):
        node = rng.choice(nodes)
        allocated = rng.sample(range(8), rng.randint(0, 4))
        changed = dict(node, metadata=dict(node["metadata"], annotations=dict(
            node["metadata"].get("annotations") or {}, **annotations(8, allocated))))
        api.set("nodes", changed)


def window(agent: Agent, names: List[str], seconds: float, sample: int = 0) -> Dict[str, object]:
    pod = gpu_pod(1)
    if sample:
        # kube-scheduler sends the nodes its own filters found, at most percentageOfNodesToScore of the
        # fleet (50 % - N/125 by default: 34 %, about 680 names, at 2,000 nodes), from a rotating start.
        rng = random.Random(5)
        bodies = [extender_args(pod, names=rng.sample(names, sample)) for _body in range(16)]
    else:
        bodies = [extender_args(pod, names=names)]
    _status, before = agent.request("GET", "/metrics")
    threads = scheduling.thread_times(agent.proc.pid)
    end = time.monotonic() + seconds
    calls = 0
    while time.monotonic() < end:
        body = bodies[calls % len(bodies)]
        agent.request("POST", "/filter", body)
        agent.request("POST", "/prioritize", body)
        calls += 1
        time.sleep(PACE_S)
    threads = scheduling.thread_diff(scheduling.thread_times(agent.proc.pid), threads)
    _status, after = agent.request("GET", "/metrics")
    text = scheduling.diff_text(after.decode(), before.decode())
    out: Dict[str, object] = {}
    # The client's connection thread is the agent's newest; the rest is the watch and the accept loop.
    conn = threads[max(threads)]
    calls = scheduling.metric_value(text, "gpu_aware_request_duration_seconds_count", '{verb="filter"}') or 0.0
    calls += scheduling.metric_value(text, "gpu_aware_request_duration_seconds_count", '{verb="prioritize"}') or 0.0
    wall = (scheduling.metric_value(text, "gpu_aware_request_duration_seconds_sum", '{verb="filter"}') or 0.0) + (
        scheduling.metric_value(text, "gpu_aware_request_duration_seconds_sum", '{verb="prioritize"}') or 0.0)
    out["per_call_ms"] = {"wall": round(wall / calls * 1e3, 2), "cpu": round(conn.cpu_s / calls * 1e3, 2),
                          "runqueue": round(conn.runqueue_s / calls * 1e3, 2)}
    out["other_threads_cpu_s"] = round(sum(t.cpu_s for tid, t in threads.items() if tid != max(threads)), 2)
    for verb in ("filter", "prioritize"):
        latency = scheduling.histogram(text, "gpu_aware_request_duration_seconds", verb)
        out[verb] = {"calls": latency.count, "mean_ms": round(latency.mean_ms, 2), "p50_ms": round(latency.p50_ms, 2),
                     "p99_ms": round(latency.p99_ms, 2), "within_5ms": round(latency.within_5ms, 4)}
    out["relists"] = scheduling.metric_value(text, "gpu_aware_relists_total", '{resource="nodes"}') or 0.0
    return out


def run(version: str, collections: str, nodes: List[dict], seconds: float, workdir: str,
        backgrounds: Sequence[str] = BACKGROUNDS, sample: int = 0) -> List[Dict[str, object]]:
    rows = []
    for background in backgrounds:
        api = FakeApiServer()
        for node in nodes:
            api.objects["nodes"][node["metadata"]["name"]] = node
        api.start()
        args = ["--kubeconfig", api.kubeconfig(os.path.join(workdir, "kubeconfig")), "--namespace", "bench"]
        if background == "relists":
            args += ["--resync-seconds", str(RESYNC_S)]
        agent = Agent(args, collections)
        stop = threading.Event()
        try:
            agent.wait_ready()
            if background == "events":
                threading.Thread(target=churn, args=(api, nodes, EVENTS_PER_S, stop), daemon=True).start()
            row = {"version": version, "background": background}
            row.update(window(agent, [n["metadata"]["name"] for n in nodes], seconds, sample))
            rows.append(row)
            print(row, flush=True)
        finally:
            stop.set()
            agent.stop()
            api.stop()
    return rows


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n", maxsplit=1)[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--window", type=float, default=20.0, help="seconds per background (default %(default)s)")
    parser.add_argument("--baseline", default=None, help="another collections tree to measure the same way")
    parser.add_argument("--names", type=int, default=0,
                        help="names per call, a random sample of the fleet as kube-scheduler sends (680 at 2,000 "
                             "nodes); default: every node")
    parser.add_argument("--backgrounds", default=",".join(BACKGROUNDS),
                        help="comma-separated, of %s (default: all)" % ", ".join(BACKGROUNDS))
    parser.add_argument("--rounds", type=int, default=1,
                        help="repeat the runs, alternating the versions, to see one machine's drift (default 1)")
    args = parser.parse_args(argv)
    backgrounds = [b for b in args.backgrounds.split(",") if b]
    unknown = set(backgrounds) - set(BACKGROUNDS)
    if unknown:
        parser.error("--backgrounds: unknown %s" % ", ".join(sorted(unknown)))
    nodes = make_nodes(args.nodes)
    workdir = tempfile.mkdtemp(prefix="gpu-aware-watch-load-")
    rows = []
    for _round in range(max(1, args.rounds)):
        if args.baseline:
            rows += run("baseline", args.baseline, nodes, args.window, workdir, backgrounds, args.names)
        rows += run("this", COLLECTIONS, nodes, args.window, workdir, backgrounds, args.names)
    print("\n| version | background | filter p50 / p99 ms | filter <= 5 ms | prioritize p50 / p99 ms "
          "| prioritize <= 5 ms | relists | per call: wall / CPU / run queue ms | watch CPU s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        f, p, c = row["filter"], row["prioritize"], row["per_call_ms"]
        print("| %s | %s | %.2f / %.2f | %.1f %% | %.2f / %.2f | %.1f %% | %.0f | %.2f / %.2f / %.2f | %.2f |" % (
            row["version"], row["background"], f["p50_ms"], f["p99_ms"], 100 * f["within_5ms"], p["p50_ms"],
            p["p99_ms"], 100 * p["within_5ms"], row["relists"], c["wall"], c["cpu"], c["runqueue"],
            row["other_threads_cpu_s"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
