# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Cost of the rolling driver upgrade planner at 500, 1000 and 2000 nodes (issue 25). Pure, in-process.

    PYTHONPATH=.build/collections .venv/bin/python benchmarks/driver_rollout_bench.py [--repeat N] [--json F]

Fleets of Node objects as the API server gives them (5 % cordoned by the
administrator, 2 % NotReady, 1 % labelled skip). Measured, best of N:

* **playbook plan**: the ``driver_upgrade_plan`` filter (the planner played
  forward into batches, module_utils/driver/rollout.py) at serial 1 and 10,
  max_unavailable 10 %; against **the YAML-era filter** in the same run (its
  code read from this checkout's git history: the last commit before the
  planner), the ratio new / old;
* **operator reconcile**: ``driver_rollout`` (scope, finish, one decision,
  patches, status) on a fleet mid-rollout (30 % done, 10 % in flight, 1 %
  failed); against a trivial baseline in the same run, one pass reading
  every node's labels and sorting by name (what any reconcile pays), the
  ratio reconcile / baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import types
from typing import Any, Callable, Dict, List, Optional

from ansible_collections.metax.gpu.plugins.filter.driver_upgrade import driver_upgrade_plan
from ansible_collections.metax.gpu.plugins.module_utils import names as N
from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator.driver_rollout import driver_rollout

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
SIZES = (500, 1000, 2000)
OLD, NEW = "2.14.6", "2.40.1"
MARK = "spent + cost > room"       # a line only the YAML-era filter has


def fleet(count: int, rollout: bool = False) -> List[Dict[str, Any]]:
    nodes = []
    for i in range(count):
        labels = {N.LABEL_GPU_INSTALLED: "true", N.LABEL_DRIVER_READY: "true", N.LABEL_DRIVER_MODE: "cloud"}
        # each node's driver-manager of the NEW payload has declared what it installs (the same number here)
        version, cordoned = OLD, i % 20 == 7
        annotations = {N.ANNOTATION_DRIVER_PAYLOAD_VERSION: NEW, N.ANNOTATION_DRIVER_PAYLOAD_DRIVER: NEW}
        if i % 100 == 3:
            labels[N.LABEL_DRIVER_UPGRADE_SKIP] = "true"
        if rollout and i % 10 < 3:
            version = NEW                                        # done
        elif rollout and i % 10 == 3 and i % 20 != 7:
            labels[N.LABEL_DRIVER_UPGRADE_STATE], cordoned = "paused", True   # in flight
        elif rollout and i % 100 == 4:
            labels[N.LABEL_DRIVER_UPGRADE_STATE], cordoned = "failed", True
        labels.update(zip((N.LABEL_DRIVER_MAJOR, N.LABEL_DRIVER_MINOR, N.LABEL_DRIVER_PATCH), version.split(".")))
        nodes.append({"metadata": {"name": "gpu-%05d" % i, "labels": labels, "annotations": annotations},
                      "spec": {"unschedulable": True} if cordoned else {},
                      "status": {"conditions": [{"type": "Ready", "status": "False" if i % 50 == 11 else "True"}]}})
    return nodes


def yaml_era_filter() -> Optional[Callable[..., Dict[str, Any]]]:
    """driver_upgrade_plan as it was before the planner, from git history (None outside a git checkout)."""
    try:
        revs = subprocess.run(["git", "-C", ROOT, "rev-list", "HEAD", "--", "plugins/filter/driver_upgrade.py"],
                              capture_output=True, text=True, check=True, timeout=30).stdout.split()
        for rev in revs[:20]:
            source = subprocess.run(["git", "-C", ROOT, "show", "%s:plugins/filter/driver_upgrade.py" % rev],
                                    capture_output=True, text=True, check=True, timeout=30).stdout
            if MARK in source:
                module = types.ModuleType("yaml_era_driver_upgrade")
                exec(compile(source, "driver_upgrade.py@" + rev[:10], "exec"), module.__dict__)
                return module.driver_upgrade_plan  # type: ignore[no-any-return]
    except (OSError, subprocess.SubprocessError):
        pass
    return None


def best(fn: Callable[[], Any], repeat: int) -> float:
    times = []
    for _round in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def baseline(nodes: List[Dict[str, Any]]) -> Any:
    seen = [(n["metadata"]["name"], n["metadata"]["labels"].get(N.LABEL_DRIVER_UPGRADE_STATE),
             n["spec"].get("unschedulable")) for n in nodes]
    return sorted(seen)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    old = yaml_era_filter()
    spec = {"driver": {"deployPolicy": "IfNotPresent", "payload": {"version": NEW},
                       "upgradePolicy": {"enableRollout": True, "maxParallel": "10%", "maxUnavailable": "15%",
                                         "maxFailureThreshold": 50, "upgradeSteps": []}}}
    results: List[Dict[str, Any]] = []
    print("%6s  %-28s %10s %10s %8s" % ("nodes", "what", "ms", "baseline", "ratio"))
    for size in SIZES:
        nodes = fleet(size)
        names = [n["metadata"]["name"] for n in nodes]
        for serial in (1, 10):
            plan = driver_upgrade_plan(nodes, names, serial, "10%")
            new_s = best(lambda: driver_upgrade_plan(nodes, names, serial, "10%"), args.repeat)
            row: Dict[str, Any] = {"nodes": size, "what": "playbook plan serial %d" % serial, "ms": new_s * 1e3,
                                   "batches": len(plan["batches"])}
            if old is not None:
                assert old(nodes, names, serial, "10%")["max_unavailable"] == plan["max_unavailable"]
                row["baseline"] = "yaml-era filter"
                row["baseline_ms"] = best(lambda: old(nodes, names, serial, "10%"), args.repeat) * 1e3
            results.append(row)
        mid = fleet(size, rollout=True)
        decision = driver_rollout(spec, mid, 0.0).decision
        assert decision is not None and decision.start
        results.append({"nodes": size, "what": "operator reconcile", "starts": len(decision.start),
                        "ms": best(lambda: driver_rollout(spec, mid, 0.0), args.repeat) * 1e3,
                        "baseline": "one pass over the nodes",
                        "baseline_ms": best(lambda: baseline(mid), args.repeat) * 1e3})
    for row in results:
        base = row.get("baseline_ms")
        row["ratio"] = row["ms"] / base if base else None
        print("%6d  %-28s %10.2f %10s %8s" % (row["nodes"], row["what"], row["ms"],
                                              "%.2f" % base if base else "-",
                                              "%.2f" % row["ratio"] if base else "-"))
    if old is None:
        print("(the YAML-era filter is not in this checkout's history: playbook plans have no baseline)")
    for size in SIZES:
        ops = [r for r in results if r["nodes"] == size and r["what"] == "operator reconcile"]
        print("%d nodes: one operator reconcile %.1f ms (%.1f x one pass over the nodes)" % (
            size, ops[0]["ms"], ops[0]["ratio"]))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
