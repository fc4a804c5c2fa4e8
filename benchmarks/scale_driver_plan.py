# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The rolling-upgrade planner at scale: ``metax.gpu.driver_upgrade --check`` against N kwok nodes.

    flock -o /tmp/metax-cluster.lock env PYTHONPATH=.build/collections:tests \\
        .venv/bin/python benchmarks/scale_driver_plan.py [--sizes 500,1000,2000] [--asked 10]

For each N, the scale profile (kwok + N fake GPU nodes, docs/scale.md) gets
one GPU pod on every second fake node (bound by ``nodeName``; kwok runs it),
and the real playbook runs with ``--check`` from this machine (the bastion)
over an inventory whose ``gpu_nodes`` are the N fake nodes:

1. ``driver_upgrade_check_nodes=false``: the bastion side alone -- map the
   inventory, read every node (metax.gpu.kube_list, 500 a page), plan the
   batches, list every pod once and split the evictions by node, print the
   plan. Target: <= 60 s at 2,000 nodes.
2. The node side on ``--asked`` nodes: the same play restricted to them
   (``driver_upgrade_nodes``), with ``driver_upgrade_check_nodes=true``, each
   node's root a simulated 8xC500 with the driver packages (fake nodes have
   no host: the root is shared, read only). Its per-node cost is the two
   node tasks' time over the nodes asked, projected to N: the role asks
   node after node (a loop on localhost).

3. operator-controller's node read, the part of its status round (every
   5 s) that grows with the cluster: ``Cluster.nodes()`` as it was (one
   unpaged ``list_node``, client models sanitized back to dicts) against as
   it is (pages of 500, raw JSON), CPU seconds and the Python heap's peak
   (tracemalloc) per read. Only the read: a status round of a real CR would
   also patch readiness labels on the shared cluster's real nodes.

A timeline callback (benchmarks/callback_plugins/metax_timeline.py) gives
each task's time. Also, once per N: one ``kubernetes.core.k8s_info`` of
every node (one response) against one ``metax.gpu.kube_list`` (pages), as
single module runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from typing import Any, Dict, List, Tuple

import scale_common  # noqa: E402  (first: puts the collection and tests/ on sys.path)
from scale_common import HERE, REPO  # noqa: E402

from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator.cluster import Cluster  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.kube.client import api_client  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator, pkgtool  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.sim.spec import preset  # noqa: E402
from localcluster import fakenodes  # noqa: E402
from localcluster.settings import from_env  # noqa: E402
from scale import scheduling  # noqa: E402
from scale.profile import ScaleProfile  # noqa: E402

TARGET_S = 60.0
UPGRADE_TO = "2.40.1"
BIN = os.path.dirname(sys.executable)
NODE_TASKS = ("Work out each node's driver change (no change made)",
              "Is each node's current driver package there to roll back to?")


def sim_root(base: str) -> str:
    """An 8xC500 root with the simulator's dpkg and packages of its driver and UPGRADE_TO."""
    host = generator.create(os.path.join(base, "root"), preset("8xC500"))
    pkgtool.install_tools(host.path, "deb")
    current = generator.load_state(host)["driver_version"]
    for version in (current, UPGRADE_TO):
        pkgtool.make_package(host.join("var/cache/metax-driver"), "deb", version)
    return host.path


def inventory(path: str, names: List[str], root: str) -> None:
    hosts = {name: {"metax_gpu_host_root": root} for name in names}
    data = {"all": {"vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
                    "children": {"gpu_nodes": {"hosts": hosts}}}}
    with open(path, "w", encoding="utf-8") as out:
        json.dump(data, out)


def bind_pods(client: fakenodes.ApiClient, names: List[str]) -> int:
    """One 1-GPU pod on every second fake node (existing ones kept); returns how many exist."""
    scheduling.ensure_namespace(client)
    wanted = list(enumerate(names[::2]))

    def one(item: Tuple[int, str]) -> int:
        index, node = item
        pod = scheduling.gpu_pod(index, 1)
        spec = pod["spec"]
        spec.pop("schedulerName")
        spec.pop("nodeSelector")
        spec["nodeName"] = node
        try:
            client.request("POST", "/api/v1/namespaces/%s/pods" % scheduling.NAMESPACE, pod)
        except fakenodes.ApiError as exc:
            if exc.status != 409:
                raise
        return 1
    return sum(fakenodes._parallel(one, wanted, 8))  # pylint: disable=protected-access


def env(timeline: str) -> Dict[str, str]:
    out = dict(os.environ)
    out.update({"ANSIBLE_COLLECTIONS_PATH": os.path.join(REPO, ".build", "collections"),
                "ANSIBLE_CALLBACK_PLUGINS": os.path.join(HERE, "callback_plugins"),
                "ANSIBLE_CALLBACKS_ENABLED": "metax_timeline", "METAX_TIMELINE": timeline,
                "ANSIBLE_HOST_KEY_CHECKING": "false", "ANSIBLE_PYTHON_INTERPRETER": sys.executable,
                "PATH": BIN + os.pathsep + out.get("PATH", "")})
    return out


def task_times(timeline: str) -> Dict[str, float]:
    """Seconds per task name (task start to the next task's start or the last event)."""
    with open(timeline, encoding="utf-8") as src:
        events = [json.loads(line) for line in src if line.strip()]
    starts = [(e["name"], e["t"]) for e in events if e["ev"] == "task"]
    end = events[-1]["t"] if events else 0.0
    out: Dict[str, float] = {}
    for i, (name, t) in enumerate(starts):
        nxt = starts[i + 1][1] if i + 1 < len(starts) else end
        short = name.split(" : ", 1)[-1]
        out[short] = out.get(short, 0.0) + (nxt - t)
    return out


def play(inv: str, kubeconfig: str, work: str, *extra: str) -> Tuple[subprocess.CompletedProcess, float, Dict[str, float]]:
    handle, timeline = tempfile.mkstemp(suffix=".jsonl", dir=work)
    os.close(handle)
    cmd = [os.path.join(BIN, "ansible-playbook"), "-i", inv, "metax.gpu.driver_upgrade", "--check",
           "-e", "driver_upgrade_version=" + UPGRADE_TO, "-e", "metax_gpu_kubeconfig=" + kubeconfig,
           "-e", "driver_upgrade_serial=20", "-e", "driver_upgrade_max_unavailable=10%"] + list(extra)
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env(timeline), timeout=3600, check=False)
    took = time.monotonic() - start
    if proc.returncode != 0:
        raise RuntimeError("driver_upgrade --check failed:\n%s\n%s" % (proc.stdout[-6000:], proc.stderr[-3000:]))
    return proc, took, task_times(timeline)


def one_list(module: str, kubeconfig: str, work: str) -> float:
    """Seconds for one ad-hoc module run listing every node."""
    cmd = [os.path.join(BIN, "ansible"), "localhost", "-m", module, "-a",
           json.dumps({"kind": "Node", "kubeconfig": kubeconfig}), "-o"]
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env(os.path.join(work, "adhoc.jsonl")),
                          timeout=600, check=False)
    took = time.monotonic() - start
    if proc.returncode != 0:
        raise RuntimeError("%s failed: %s %s" % (module, proc.stdout[-2000:], proc.stderr[-2000:]))
    return took


def operator_node_reads(kubeconfig: str, rounds: int = 3) -> Dict[str, Any]:
    """CPU seconds (median of ``rounds``) and heap peak (MiB) of one read of every node, both ways."""
    api = api_client(kubeconfig)
    cluster = Cluster(api, "metax-gpu-operator")

    def models() -> List[Dict[str, Any]]:
        from kubernetes import client as k8s_client  # the typed API, for this comparison alone
        return [api.sanitize_for_serialization(n) for n in k8s_client.CoreV1Api(api).list_node().items]

    out: Dict[str, Any] = {}
    for name, read in (("models", models), ("pages", cluster.nodes)):
        cpu = []
        for _round in range(rounds):
            start = time.process_time()
            items = read()
            cpu.append(time.process_time() - start)
        tracemalloc.start()
        items = read()
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        out[name] = {"count": len(items), "cpu_s": sorted(cpu)[len(cpu) // 2], "peak_mib": peak / 2 ** 20,
                     "names": sorted(n["metadata"]["name"] for n in items)}
    if out["models"]["names"] != out["pages"]["names"]:
        raise RuntimeError("the two reads disagree on the nodes")
    for value in out.values():
        del value["names"]
    return out


def measure(prof: ScaleProfile, size: int, asked: int, root: str, work: str) -> Dict[str, Any]:
    prof.grow(size)
    names = [n.name for n in prof.nodes]
    pods = bind_pods(prof.client, names)
    kubeconfig = prof.settings.admin_conf
    inv = os.path.join(work, "inventory-%d.json" % size)
    inventory(inv, names, root)
    row: Dict[str, Any] = {"nodes": size, "pods": pods}
    proc, took, tasks = play(inv, kubeconfig, work, "-e", "driver_upgrade_check_nodes=false")
    # every planned node's pod is in the printed plan
    row["evictions_printed"] = proc.stdout.count(scheduling.NAMESPACE + "/gpu-")
    row["bastion_s"] = took
    row["bastion_tasks"] = {k: round(v, 2) for k, v in sorted(tasks.items(), key=lambda kv: -kv[1])[:6]}
    subset = json.dumps(names[:asked])
    _proc, took_asked, tasks_asked = play(inv, kubeconfig, work, "-e", "driver_upgrade_check_nodes=true",
                                          "-e", "{\"driver_upgrade_nodes\": %s}" % subset)
    per_node = sum(tasks_asked.get(t, 0.0) for t in NODE_TASKS) / asked
    row["asked"] = asked
    row["asked_run_s"] = took_asked
    row["node_side_per_node_s"] = per_node
    row["node_side_projected_s"] = per_node * size
    row["k8s_info_all_nodes_s"] = one_list("kubernetes.core.k8s_info", kubeconfig, work)
    row["kube_list_all_nodes_s"] = one_list("metax.gpu.kube_list", kubeconfig, work)
    row["operator_node_read"] = operator_node_reads(kubeconfig)
    return row


def main() -> int:
    parser = scale_common.arguments(__doc__)
    parser.add_argument("--asked", type=int, default=10, help="nodes asked in the node-side run (default %(default)s)")
    args = parser.parse_args()
    sizes = args.sizes
    work = tempfile.mkdtemp(prefix="metax-scale-plan-")
    root = sim_root(work)
    rows = []
    settings = from_env(os.environ)
    with ScaleProfile(settings) as prof:
        try:
            for size in sizes:
                row = measure(prof, size, args.asked, root, work)
                rows.append(row)
                print(json.dumps(row), flush=True)
        finally:
            scheduling.delete_pods(prof.client)
            scheduling.delete_namespace(prof.client)
    print("\n| nodes | pods | --check, bastion side (s) | target 60 s | node side per node (s) | node side at N, "
          "projected (s) | k8s_info all nodes (s) | kube_list all nodes (s) |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        print("| %d | %d | %.1f | %s | %.2f | %.0f | %.1f | %.1f |" % (
            row["nodes"], row["pods"], row["bastion_s"], "met" if row["bastion_s"] <= TARGET_S else "NOT met",
            row["node_side_per_node_s"], row["node_side_projected_s"], row["k8s_info_all_nodes_s"],
            row["kube_list_all_nodes_s"]))
    print("\n| nodes | operator node read, models: CPU s / heap peak MiB | pages + raw JSON: CPU s / heap peak MiB "
          "| CPU ratio |")
    print("|---|---|---|---|")
    for row in rows:
        old, new = row["operator_node_read"]["models"], row["operator_node_read"]["pages"]
        print("| %d | %.2f / %.1f | %.2f / %.1f | %.1fx |" % (
            row["nodes"], old["cpu_s"], old["peak_mib"], new["cpu_s"], new["peak_mib"],
            old["cpu_s"] / max(new["cpu_s"], 1e-6)))
    if len(rows) > 1:
        first, last = rows[0], rows[-1]
        print("\ngrowth %d -> %d nodes (x%.1f): bastion side x%.2f" % (
            first["nodes"], last["nodes"], last["nodes"] / first["nodes"], last["bastion_s"] / first["bastion_s"]))
    scale_common.write_json(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
