# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Time from a device change to the rewritten CDI spec (issue 26).

A simulated 2 x C550 node with MXMACA; the spec watcher
(``python -m ...cdi watch``) runs as its own process. Each round makes one
change - a VF count change (0 -> 4 -> 0 on GPU 0), a GPU that mx-smi
reports unavailable, its recovery - and times the moment the spec names the
new device set. The baseline, measured in the same run, is one
``refresh`` of an unchanged node (discovery + render + compare, no write):
a watcher cannot beat it by more than its polling interval.

    python benchmarks/cdi_rewrite_bench.py [--rounds N] [--interval S]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from ansible_collections.metax.gpu.plugins.module_utils.cdi import writer
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator
from ansible_collections.metax.gpu.plugins.module_utils.sim.maca import install_maca
from ansible_collections.metax.gpu.plugins.module_utils.sim.spec import preset


def names(path):
    try:
        with open(path) as handle:
            return [d["name"] for d in json.load(handle)["devices"]]
    except (OSError, ValueError, KeyError):
        return None


def wait_for(path, predicate, deadline=60.0):
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline:
        if predicate(names(path)):
            return time.monotonic() - t0
        time.sleep(0.005)
    raise SystemExit("the spec did not change within %.0f s" % deadline)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--interval", type=float, default=0.5, help="the watcher's polling interval (s)")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="cdi-bench.")
    host = generator.create(os.path.join(work, "node"), preset("2xC550-sriov"))
    install_maca(host, "3.0.0.8")
    spec_dir = os.path.join(work, "cdi")
    path = writer.refresh(host, spec_dir).path
    baseline = []
    for _round in range(args.rounds):
        t0 = time.monotonic()
        assert not writer.refresh(host, spec_dir).changed
        baseline.append(time.monotonic() - t0)
    watcher = subprocess.Popen([sys.executable, "-m", "ansible_collections.metax.gpu.plugins.module_utils.cdi",
                                "watch", "--host-root", host.path, "--spec-dir", spec_dir,
                                "--interval", str(args.interval)], stdout=subprocess.DEVNULL)
    pf0 = generator.load_state(host)["gpus"][0]["sysfs"]
    times = {"vf 0->4": [], "vf 4->0": [], "gpu fails": [], "gpu recovers": []}
    try:
        for _round in range(args.rounds):
            host.write_attribute(pf0 + "/sriov_numvfs", "4")
            times["vf 0->4"].append(wait_for(path, lambda n: n is not None and n[:4] == ["0", "1", "2", "3"]))
            host.write_attribute(pf0 + "/sriov_numvfs", "0")
            times["vf 4->0"].append(wait_for(path, lambda n: n is not None and len(n) == 7))
            generator.fail_gpu(host, 1, mode="smi")
            times["gpu fails"].append(wait_for(path, lambda n: n is not None and len(n) == 4))
            generator.recover_gpu(host, 1)
            times["gpu recovers"].append(wait_for(path, lambda n: n is not None and len(n) == 7))
    finally:
        watcher.terminate()
        watcher.wait()
    base = statistics.median(baseline)
    print("CDI spec rewrite, 2 x C550 simulated, watcher interval %.2f s, %d rounds" % (args.interval, args.rounds))
    print("baseline: one refresh of an unchanged node  %.3f s (median)" % base)
    print("%-14s %10s %10s %16s" % ("change", "median s", "max s", "median/baseline"))
    for what, values in times.items():
        print("%-14s %10.3f %10.3f %16.2f" % (what, statistics.median(values), max(values),
                                              statistics.median(values) / base))
    return 0


if __name__ == "__main__":
    sys.exit(main())
