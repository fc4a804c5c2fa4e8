# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""gpu-aware's limits, measured: the largest scheduler request and the memory one costs.

    PYTHONPATH=.build/collections .venv/bin/python benchmarks/extender_limits.py [--nodes 5000] [--images 50]

Builds the ExtenderArgs kube-scheduler sends with ``nodeCacheCapable: false``
for ``--nodes`` full Node objects (tests/unit/extender/extender_support.make_node:
our labels and annotations with real allocator tables, Node Feature Discovery's
labels, conditions and ``--images`` images, the kubelet's nodeStatusMaxImages
being 50), prints its size, then sends it to the real agent (a separate
process, ``--no-node-cache``) as filter and prioritize and prints the agent's
VmRSS and VmHWM (peak) before and after. Sizes ``--max-body-bytes`` and the
chart's memory limit (docs/gpu-aware.md, "Hostile clients"); 2026-11-28:
5,000 nodes with 50 images, 77.9 MB (40 images: 68.4 MB); VmHWM 47 -> 310 MiB.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "unit", "extender"))
sys.path.insert(0, HERE)

from extender_bench import Agent  # noqa: E402
from extender_support import extender_args, gpu_pod, make_node  # noqa: E402


def memory(pid: int) -> Dict[str, int]:
    """VmRSS and VmHWM of ``pid`` in KiB."""
    out = {}
    with open("/proc/%d/status" % pid, encoding="ascii") as handle:
        for line in handle:
            key, _sep, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0])
    return out


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--images", type=int, default=50)
    args = parser.parse_args(argv)
    rng = random.Random(7)
    body = extender_args(gpu_pod(2), [make_node(i, rng, images=args.images) for i in range(args.nodes)])
    print("ExtenderArgs of %d nodes (%d images each): %d bytes (%.1f MB, %.1f KB a node)"
          % (args.nodes, args.images, len(body), len(body) / 1e6, len(body) / args.nodes / 1e3))
    agent = Agent(["--no-node-cache", "--max-body-bytes", str(max(len(body), 1 << 20))])
    try:
        agent.wait_ready()
        before = memory(agent.proc.pid)
        for verb in ("filter", "prioritize"):
            status, answer = agent.request("POST", "/" + verb, body)
            if status != 200:
                raise SystemExit("%s answered %d: %s" % (verb, status, answer[:300]))
            after = memory(agent.proc.pid)
            print("%-10s answer %d bytes; VmRSS %d MiB, VmHWM %d MiB (before: %d / %d MiB)"
                  % (verb, len(answer), after["VmRSS"] // 1024, after["VmHWM"] // 1024,
                     before["VmRSS"] // 1024, before["VmHWM"] // 1024))
    finally:
        agent.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
