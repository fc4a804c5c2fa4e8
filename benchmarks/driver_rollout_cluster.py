# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The rolling driver upgrade on the local cluster: the operator's overhead per node against the playbook's.

    flock -o /tmp/metax-cluster.lock env PYTHONPATH=.build/collections \\
        .venv/bin/python benchmarks/driver_rollout_cluster.py [--json FILE] [--skip-playbook]

Needs the three-node local cluster up (this script never starts or stops it).
In one run, one scheme after the other on the same nodes:

1. **playbook**: benchmarks/driver_upgrade.py (metax.gpu.driver_upgrade,
   serial 1 then 2, the GPU Extensions scheme): per node, cordon to the
   validated uncordon, less the driver step (unload, package install, load,
   verify);
2. **operator**: the two rollout tests of
   tests/integration/test_driver_manager_cluster.py (the metax-operator chart,
   driver component, deployPolicy Always; a payload version bump with
   maxParallel 2 / maxUnavailable 2, vm-2 cordoned by the administrator; then
   a failing payload): per node, the controller's start (cordon and
   ``upgrade-required``) to its finish (uncordon and nothing left), less
   driver-manager's package install as it reports it in its DriverUpgraded
   Event (tests/output/driver-manager.json ``rollout``).

Printed: both tables, the ratios operator / playbook (mean and slowest node)
and slowest / the 30 s target of issue 25.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import Any, Dict

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUTPUT = os.path.join(ROOT, "tests", "output", "driver-manager.json")
TEST = "tests/integration/test_driver_manager_cluster.py"
TESTS = ("test_a_payload_version_bump_rolls_every_node_within_max_unavailable_keeping_the_admins_cordon",
         "test_a_node_whose_new_driver_fails_validation_is_rolled_back_left_cordoned_failed_and_the_rollout_pauses")
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


def report(playbook_runs: Any, rollout: Dict[str, Any]) -> Dict[str, float]:
    print("operator (driver-manager), one version bump, maxParallel 2 / maxUnavailable 2:")
    print("%-5s %12s %9s %9s" % ("node", "cordon->end", "install", "overhead"))
    for node in sorted(rollout["node_seconds"]):
        print("%-5s %11.1fs %8.1fs %8.1fs" % (node, rollout["node_seconds"][node], rollout["install_seconds"][node],
                                              rollout["overhead_seconds"][node]))
    overheads = list(rollout["overhead_seconds"].values())
    ours = {"mean": sum(overheads) / len(overheads), "max": max(overheads)}
    print("all three nodes in %.1f s; overhead per node mean %.1f s, max %.1f s (max / %.0f s target = %.2f)"
          % (rollout["all_seconds"], ours["mean"], ours["max"], TARGET_PER_NODE, ours["max"] / TARGET_PER_NODE))
    out = {"operator_mean_s": ours["mean"], "operator_max_s": ours["max"],
           "operator_max_over_target": ours["max"] / TARGET_PER_NODE}
    if playbook_runs:
        nets = [row["net_s"] for run in playbook_runs for row in run["nodes"].values()]
        theirs = {"mean": sum(nets) / len(nets), "max": max(nets)}
        print("playbook (serial 1 and 2): net per node mean %.1f s, max %.1f s" % (theirs["mean"], theirs["max"]))
        print("operator / playbook: mean %.2f, max %.2f" % (ours["mean"] / theirs["mean"], ours["max"] / theirs["max"]))
        out.update({"playbook_mean_s": theirs["mean"], "playbook_max_s": theirs["max"],
                    "ratio_mean": ours["mean"] / theirs["mean"], "ratio_max": ours["max"] / theirs["max"]})
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default="", help="also write the results here")
    parser.add_argument("--skip-playbook", action="store_true", help="the operator's figures only")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="rollout-bench.")
    playbook_runs = None if args.skip_playbook else playbook(work)
    rollout = operator()
    summary = report(playbook_runs, rollout)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"playbook": playbook_runs, "operator": rollout, "summary": summary}, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
