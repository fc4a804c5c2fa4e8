# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""metax.gpu.driver_upgrade on the running local cluster: time per node, serial 1 and 2.

    flock -o /tmp/metax-cluster.lock env PYTHONPATH=.build/collections \\
        .venv/bin/python benchmarks/driver_upgrade.py [--json FILE]

Needs the three-node local cluster up (scripts/cluster/cluster.sh up; this
script never starts or stops it). Prepares the simulated GPU nodes as the
cluster test does (tests/integration/driver_fleet.py: this checkout's agents,
package tools, driver packages), then upgrades every GPU node with
``driver_upgrade_serial=1`` and goes back with ``serial=2`` (budget = serial),
and restores the cluster.

A timeline callback (benchmarks/callback_plugins/metax_timeline.py) records
when each task started and each loop item finished. Per node: the window from
the start of its batch's Cordon task to the end of its clean-up after the
validated uncordon, less the driver step (metax.gpu.driver: unload, package
install, load, verify) of every node of the batch (that step runs node after
node inside the window). Also the phases: cordon -> driver step (pause, agents
gone, evict), driver step -> validated (agents back, labels, allocatable),
validated -> uncordoned. Ratios: total serial 2 / serial 1, and the slowest
node / the 30 s target of issue 16.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, ".build", "collections"))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
sys.path.append(os.path.join(ROOT, "tests"))    # polling.py; after tests/integration, whose conftest is the one meant

import driver_fleet  # noqa: E402
from conftest import Cluster  # noqa: E402
from polling import wait_until  # noqa: E402

TARGET_PER_NODE = 30.0
UPGRADE_TO = "2.40.1"


def _task(name: str, suffix: str) -> bool:
    return name == suffix or name.endswith(" : " + suffix)


def per_node(events: List[dict]) -> Dict[str, Dict[str, float]]:
    """Per-node timings from one playbook run's timeline."""
    rows: Dict[str, Dict[str, float]] = {}
    batches: List[dict] = []
    current_task, last_item = "", 0.0
    for ev in events:
        if ev["ev"] == "task":
            current_task, last_item = ev["name"], ev["t"]
            if _task(current_task, "Cordon"):
                batches.append({"start": ev["t"], "nodes": [], "driver": 0.0})
        elif ev["ev"] == "item" and batches:
            batch, node = batches[-1], ev["item"]
            took, last_item = ev["t"] - last_item, ev["t"]
            if _task(current_task, "Cordon"):
                batch["nodes"].append(node)
                rows[node] = {"batch": len(batches), "start": batch["start"]}
            elif _task(current_task, "Install and load the driver"):
                rows[node]["driver"] = took
                rows[node]["driver_start"] = ev["t"] - took
                batch["driver"] += took
            elif _task(current_task, "Validate - labels back, allocatable = healthy devices, the driver version asked"):
                rows[node]["validated"] = ev["t"]
        elif ev["ev"] == "ok" and ev["name"].rsplit(" on ", 1)[0].endswith("Leave nothing behind"):
            node = ev["name"].rsplit(" on ", 1)[1]
            rows[node]["end"] = ev["t"]
    out = {}
    for node, row in rows.items():
        batch = batches[int(row["batch"]) - 1]
        window = row["end"] - row["start"]
        out[node] = {
            "batch": row["batch"], "batch_size": len(batch["nodes"]),
            "window_s": window, "driver_step_s": row["driver"],
            "batch_driver_steps_s": batch["driver"], "net_s": window - batch["driver"],
            "to_driver_s": row["driver_start"] - row["start"],
            "driver_to_validated_s": row["validated"] - (row["driver_start"] + row["driver"]),
            "validated_to_uncordoned_s": row["end"] - row["validated"],
        }
    return out


def run(cluster, serial: int, version: str, work: str) -> dict:
    timeline = os.path.join(work, "timeline-serial%d.jsonl" % serial)
    env = dict(cluster.env)
    env.update({"METAX_TIMELINE": timeline, "ANSIBLE_CALLBACK_PLUGINS": os.path.join(HERE, "callback_plugins"),
                "ANSIBLE_CALLBACKS_ENABLED": "metax_timeline"})
    proc, secs = driver_fleet.ansible(
        cluster, "driver_upgrade", "-e", "driver_upgrade_version=" + version, "-e", "driver_upgrade_poll_delay=1",
        "-e", "driver_upgrade_serial=%d" % serial, "-e", "driver_upgrade_max_unavailable=%d" % serial, env=env)
    if proc.returncode != 0:
        raise SystemExit("driver_upgrade serial %d failed:\n%s\n%s" % (serial, proc.stdout[-6000:], proc.stderr[-2000:]))
    with open(timeline) as handle:
        events = [json.loads(line) for line in handle if line.strip()]
    nodes = per_node(events)
    missing = sorted(set(driver_fleet.KINDS) - set(nodes))
    if missing:
        raise SystemExit("serial %d: no timeline for %s" % (serial, missing))
    wrong = {n: driver_fleet.loaded(n) for n in driver_fleet.KINDS if driver_fleet.loaded(n) != version}
    if wrong:
        raise SystemExit("serial %d: nodes not at %s after the run: %s" % (serial, version, wrong))
    return {"serial": serial, "to": version, "total_s": secs, "nodes": nodes}


def report(results: List[dict]) -> None:
    print("%-7s %-5s %-5s %9s %9s %9s %9s %11s %11s" % (
        "serial", "node", "batch", "window", "driver", "net", "->driver", "->validated", "->uncordon"))
    for res in results:
        for node in sorted(res["nodes"]):
            row = res["nodes"][node]
            print("%-7d %-5s %-5s %8.1fs %8.1fs %8.1fs %8.1fs %10.1fs %10.1fs" % (
                res["serial"], node, "%d/%d" % (row["batch"], row["batch_size"]), row["window_s"],
                row["driver_step_s"], row["net_s"], row["to_driver_s"], row["driver_to_validated_s"],
                row["validated_to_uncordoned_s"]))
    print()
    for res in results:
        nets = [r["net_s"] for r in res["nodes"].values()]
        res["max_net_s"] = max(nets)
        res["mean_net_s"] = sum(nets) / len(nets)
        print("serial %d: total %.1fs for %d nodes; net per node mean %.1fs, max %.1fs (max / %.0fs target = %.2f)"
              % (res["serial"], res["total_s"], len(nets), res["mean_net_s"], res["max_net_s"], TARGET_PER_NODE,
                 res["max_net_s"] / TARGET_PER_NODE))
    if len(results) == 2:
        print("total serial 2 / serial 1 = %.2f" % (results[1]["total_s"] / results[0]["total_s"]))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default="", help="also write the results here")
    args = parser.parse_args()
    try:
        info = json.loads(subprocess.run(["bash", os.path.join(ROOT, "scripts", "cluster", "cluster.sh"), "json"],
                                         capture_output=True, text=True, timeout=60, check=True,
                                         stdin=subprocess.DEVNULL).stdout)
    except (subprocess.SubprocessError, ValueError) as exc:
        print("the local cluster is not up (scripts/cluster/cluster.sh json: %s)" % exc, file=sys.stderr)
        return 2
    cluster = Cluster(info)
    work = tempfile.mkdtemp(prefix="upgrade-bench.")
    fleet = driver_fleet.prepare(cluster, (UPGRADE_TO,))
    try:
        wait_until(lambda: driver_fleet.settled(cluster), 180, "the GPU nodes to validate before the benchmark")
        originals = set(fleet.original.values())
        if len(originals) != 1:
            raise SystemExit("the nodes start on different drivers: %s" % fleet.original)
        results = [run(cluster, 1, UPGRADE_TO, work), run(cluster, 2, originals.pop(), work)]
    finally:
        driver_fleet.restore(cluster, fleet)
    report(results)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
