# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The rolling driver upgrade on the local cluster: the operator's overhead per node against the playbook's.

    make -C benchmarks rollout-cluster        (or, from the repository root:)
    flock -o /tmp/metax-cluster.lock env PYTHONPATH=.build/collections \\
        .venv/bin/python benchmarks/driver_rollout_cluster.py [--json FILE] [--skip-playbook]

Needs the three-node local cluster up (this script never starts or stops it).
In one run, one scheme after the other on the same nodes, so that both see
the same machine load (the playbook's figure moved from 14 s to 32 s per node
between a quiet and a loaded machine: only a ratio from one run compares):

1. **playbook**: benchmarks/driver_upgrade.py (metax.gpu.driver_upgrade,
   serial 1 then 2, the GPU Extensions scheme): per node, cordon to the
   validated uncordon, less the driver step (unload, package install, load,
   verify);
2. **operator**: the rollout test of tests/integration/test_driver_manager_cluster.py
   (the metax-operator chart, driver component, deployPolicy Always; a payload
   version bump with maxParallel 2 / maxUnavailable 2, vm-2 cordoned by the
   administrator): per node, the controller's start (cordon and
   ``upgrade-required``) to its finish (uncordon and nothing left), less
   driver-manager's package install as it reports it in its DriverUpgraded
   Event (tests/output/driver-manager.json ``rollout``). The module's other
   tests (the failing payload among them) measure nothing and are not run.

Printed: both tables, each scheme's spread over the nodes, the ratios
operator / playbook (mean and slowest node; against serial 1, serial 2 and
both), slowest / the 30 s target of issue 25, the load average and how long
each half took (5.4-6 min in all, warm).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUTPUT = os.path.join(ROOT, "tests", "output", "driver-manager.json")
TEST = "tests/integration/test_driver_manager_cluster.py"
TESTS = ("test_a_payload_version_bump_rolls_every_node_within_max_unavailable_keeping_the_admins_cordon",)
TARGET_PER_NODE = 30.0


def env() -> Dict[str, str]:
    out = dict(os.environ)
    out.update({"METAX_CLUSTER_REUSE": "1", "METAX_KEEP_CLUSTER": "1",
                "PYTHONPATH": os.path.join(ROOT, ".build", "collections"),
                "PATH": os.path.join(ROOT, ".venv", "bin") + os.pathsep + out.get("PATH", "")})
    return out


def playbook(work: str) -> Any:
    path = os.path.join(work, "playbook.json")
    proc = subprocess.run([sys.executable, os.path.join(HERE, "driver_upgrade.py"), "--json", path], cwd=ROOT,
                          env=env(), capture_output=True, text=True, timeout=3600, check=False)
    print(proc.stdout)
    if proc.returncode != 0:
        raise SystemExit("benchmarks/driver_upgrade.py failed:\n%s" % proc.stderr[-4000:])
    with open(path) as handle:
        return json.load(handle)


def operator() -> Dict[str, Any]:
    if os.path.exists(OUTPUT):
        os.unlink(OUTPUT)
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-x", "-s", "-q"] + \
        ["%s::%s" % (TEST, name) for name in TESTS]
    proc = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=3600, check=False)
    if proc.returncode != 0:
        raise SystemExit("the operator's rollout tests failed:\n%s\n%s" % (proc.stdout[-6000:], proc.stderr[-2000:]))
    with open(OUTPUT) as handle:
        return json.load(handle)["rollout"]


def spread(values: List[float]) -> Dict[str, float]:
    return {"mean": sum(values) / len(values), "min": min(values), "max": max(values), "n": len(values)}


def report(playbook_runs: Any, rollout: Dict[str, Any]) -> Dict[str, Any]:
    print("operator (driver-manager), one version bump, maxParallel 2 / maxUnavailable 2:")
    print("%-5s %12s %9s %9s" % ("node", "cordon->end", "install", "overhead"))
    for node in sorted(rollout["node_seconds"]):
        print("%-5s %11.1fs %8.1fs %8.1fs" % (node, rollout["node_seconds"][node], rollout["install_seconds"][node],
                                              rollout["overhead_seconds"][node]))
    ours = spread(list(rollout["overhead_seconds"].values()))
    print("all three nodes in %.1f s; overhead per node mean %.1f s, spread %.1f-%.1f s (max / %.0f s target = %.2f)"
          % (rollout["all_seconds"], ours["mean"], ours["min"], ours["max"], TARGET_PER_NODE,
             ours["max"] / TARGET_PER_NODE))
    out: Dict[str, Any] = {"operator": ours, "operator_max_over_target": ours["max"] / TARGET_PER_NODE}
    if playbook_runs:
        groups = [("serial %d" % run["serial"], [row["net_s"] for row in run["nodes"].values()])
                  for run in playbook_runs]
        groups.append(("serial 1 and 2", [net for _name, nets in groups for net in nets]))
        print("%-15s %6s %6s %6s %6s   %s"
              % ("playbook", "mean", "min", "max", "nodes", "operator / playbook: mean, max"))
        for name, nets in groups:
            theirs = spread(nets)
            ratio = {"mean": ours["mean"] / theirs["mean"], "max": ours["max"] / theirs["max"]}
            print("%-15s %5.1fs %5.1fs %5.1fs %6d   %.2f, %.2f"
                  % (name, theirs["mean"], theirs["min"], theirs["max"], theirs["n"], ratio["mean"], ratio["max"]))
            out["playbook " + name] = dict(theirs, ratio_mean=ratio["mean"], ratio_max=ratio["max"])
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default="", help="also write the results here")
    parser.add_argument("--skip-playbook", action="store_true", help="the operator's figures only")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="rollout-bench.")
    load = [os.getloadavg()[0]]
    start = time.monotonic()
    playbook_runs = None if args.skip_playbook else playbook(work)
    middle = time.monotonic()
    rollout = operator()
    end = time.monotonic()
    load.append(os.getloadavg()[0])
    summary = report(playbook_runs, rollout)
    summary["run_seconds"] = {"playbook": middle - start, "operator": end - middle, "all": end - start}
    print("run time: playbook %.0f s (images, install, two upgrades, uninstall), operator %.0f s (payload build, "
          "chart install, the bump, uninstall), %.0f s in all; load average %.1f at the start, %.1f at the end"
          % (middle - start, end - middle, end - start, load[0], load[1]))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"playbook": playbook_runs, "operator": rollout, "summary": summary}, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
