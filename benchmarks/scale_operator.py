# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""operator-controller at N GPU nodes: a CR change across every node, RSS, API requests per minute.

    flock -o /tmp/metax-heavy.lock env PYTHONPATH=.build/collections \\
        .venv/bin/python benchmarks/scale_operator.py [--sizes 500,1000,2000] [--idle 60]

For each N, a private control plane (tests/integration/controlplane.py:
etcd, kube-apiserver, garbage collector; not the shared cluster) holds N GPU
Node objects carrying gpu-label's labels and gpu-device's annotation, the
metax-operator chart's CRDs, RBAC and ClusterOperator, and one real
operator-controller process with the chart service account's token, as in
tests/integration/test_operator_controller_apiserver.py. No kubelet runs,
so no pod ever starts: what is measured is the controller's side.

* sync: from the controller's start to the CR's status counting N nodes;
  settled: to the first 10 s without a controller write (the first
  reconcile strips from every node the labels of components not deployed);
* idle (``--idle`` s after a status round): the apiserver's
  ``apiserver_request_total`` by verb, per minute, the kopf peering
  heartbeats apart; the controller's RSS;
* a CR change that touches every node: ``labelgen.deploy: false`` (gpu-label
  goes, and its labels are stripped from every node), time until no node
  carries ``gpu.product``; the requests during it; then back to
  ``deploy: true``.

Targets (issue 29): idle 0 writes/min; RSS <= 150 MiB at 2,000 nodes.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict

import scale_common  # noqa: E402  (first: puts the collection and tests/ on sys.path)

import yaml  # noqa: E402
from controlplane import ControlPlane  # noqa: E402
from polling import wait_until  # noqa: E402
from test_operator_controller_apiserver import CHAIN_OFF, CHART, GPU_LABELS, NS, Env  # noqa: E402

from ansible_collections.metax.gpu.plugins.module_utils import names as N  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.kube.client import api_client  # noqa: E402

WRITES = scale_common.WRITES
RSS_TARGET_MIB = 150
# writes that are not the controller's reconcile or status: the apiserver renews its identity lease,
# kopf renews its peering record (both by design, counted apart)
NOT_OURS = ("PUT leases", "PATCH kopfpeerings")


def requests(cp: ControlPlane) -> Dict[str, float]:
    """apiserver_request_total summed by verb; writes by verb and resource ("PATCH nodes"), so that
    the apiserver's own identity lease ("PUT leases") and kopf's peering heartbeats stand apart."""
    return scale_common.apiserver_requests(cp.port, "admin-token")


def delta(after: Dict[str, float], before: Dict[str, float], minutes: float) -> Dict[str, float]:
    return {k: round((v - before.get(k, 0.0)) / minutes, 1) for k, v in sorted(after.items())
            if v - before.get(k, 0.0) > 0}


def controller_writes(per_verb: Dict[str, float]) -> float:
    """Writes other than the apiserver's identity lease and kopf's peering heartbeat."""
    return sum(v for k, v in per_verb.items() if k.split(" ")[0] in WRITES and k not in NOT_OURS)


def rss_mib(pid: int) -> Dict[str, float]:
    with open("/proc/%d/status" % pid, encoding="ascii") as src:
        text = src.read()
    return {key: int(re.search(key + r":\s+(\d+)", text).group(1)) / 1024 for key in ("VmRSS", "VmHWM")}


def create_nodes(cp: ControlPlane, count: int) -> None:
    from kubernetes import client as k8s_client  # the harness creates nodes with the typed API
    core = k8s_client.CoreV1Api(api_client(cp.kubeconfig))

    def one(index: int) -> None:
        core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": "gpu-%05d" % index, "labels": dict(GPU_LABELS, **{"kubernetes.io/os": "linux"}),
            "annotations": {N.ANNOTATION_DEVICES: "[]"}}})
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(count)))


def products(env: Env) -> int:
    return sum(N.LABEL_GPU_PRODUCT in m for m in env.node_metax().values())


def measure(size: int, idle: float) -> Dict[str, Any]:
    cp = ControlPlane().start()
    env = Env(cp)
    row: Dict[str, Any] = {"nodes": size}
    try:
        env.ok("apply", "--server-side", "-f", os.path.join(CHART, "crds"))
        env.ok("create", "namespace", NS)
        create_nodes(cp, size)
        wait_until(lambda: env.cp.kubectl("get", "crd", "clusteroperators.gpu.metax-tech.com").returncode == 0,
                   30, "CRD")
        objects = env.chart_objects("registry=127.0.0.1:5000/metax-gpu", "imageTag=test", *CHAIN_OFF)
        env.ok("apply", "-n", NS, "-f", "-", input=yaml.safe_dump_all(objects))
        start = time.monotonic()
        proc = env.start_controller("a")

        def status_nodes() -> int:
            cr = env.get("clusteroperator", N.OPERATOR_CR_NAME, "-n", NS) or {}
            return ((cr.get("status") or {}).get("nodes") or {}).get("total", 0)
        wait_until(lambda: status_nodes() == size, 300, "the status counting every node", diagnose=[env.logs])
        row["sync_s"] = time.monotonic() - start
        # the first reconcile (apply, prune, node cleanup of what undeployed components own) may still
        # run after the status counted the nodes: idle starts once 10 s pass without a controller write
        last = requests(cp)

        def settled() -> bool:
            nonlocal last
            time.sleep(10)
            now = requests(cp)
            quiet = controller_writes(delta(now, last, 1.0)) == 0
            last = now
            return quiet
        wait_until(settled, 600, "the controller to stop writing", interval=0.0, diagnose=[env.logs])
        row["settled_s"] = time.monotonic() - start
        row["node_keys_settled"] = sorted(env.node_metax().get("gpu-00000", {}))
        before = requests(cp)
        time.sleep(idle)
        row["idle_per_min"] = delta(requests(cp), before, idle / 60)
        row["idle_writes_per_min"] = controller_writes(row["idle_per_min"])
        row["rss_idle_mib"] = rss_mib(proc.pid)
        before = requests(cp)
        start = time.monotonic()
        env.ok("-n", NS, "patch", "clusteroperator", N.OPERATOR_CR_NAME, "--type=merge",
               "-p", json.dumps({"spec": {"labelgen": {"deploy": False}}}))
        wait_until(lambda: products(env) == 0, 600, "gpu-label's labels stripped from every node",
                   interval=1.0, diagnose=[env.logs])
        took = time.monotonic() - start
        row["change_s"] = took
        row["change_requests"] = delta(requests(cp), before, 1.0)
        row["rss_after_change_mib"] = rss_mib(proc.pid)
        if proc.poll() is not None:
            raise RuntimeError("the controller died:\n" + env.logs())
    finally:
        for proc in env.controllers.values():
            if proc.poll() is None:
                proc.kill()
        cp.stop()
    return row


def main() -> int:
    parser = scale_common.arguments(__doc__)
    parser.add_argument("--idle", type=float, default=60.0, help="idle seconds measured (default %(default)s)")
    args = parser.parse_args()
    rows = []
    for size in args.sizes:
        row = measure(size, args.idle)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("\n| nodes | sync / settled (s) | idle writes/min (target 0) | idle reads/min (GET+LIST+WATCH) | peering writes/min "
          "| RSS idle MiB (peak) | labelgen off: every node stripped (s) | node PATCHes in it |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        idle_reads = sum(v for k, v in row["idle_per_min"].items() if k in ("GET", "LIST", "WATCH"))
        print("| %d | %.1f / %.1f | %.1f | %.1f | %.1f | %.0f (%.0f) | %.1f | %.0f |" % (
            row["nodes"], row["sync_s"], row["settled_s"], row["idle_writes_per_min"], idle_reads,
            row["idle_per_min"].get("PATCH kopfpeerings", 0.0), row["rss_idle_mib"]["VmRSS"],
            row["rss_after_change_mib"]["VmHWM"], row["change_s"], row["change_requests"].get("PATCH nodes", 0.0)))
    scale_common.write_json(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
