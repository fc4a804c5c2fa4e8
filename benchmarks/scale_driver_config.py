# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""A driver-config edit naming every one of N nodes (vfnum 0 -> 4), timed to each node's state label.

    flock -o /tmp/metax-heavy.lock env PYTHONPATH=.build/collections \\
        .venv/bin/python benchmarks/scale_driver_config.py [--sizes 500] [--parallel 10,50] \\
        [--baseline OTHER/.build/collections] [--timeout 900] [--named M] [--own-watches]

For each N and each ``vfnumPolicy.maxParallel`` P, a private control plane
(tests/integration/controlplane.py: etcd, kube-apiserver, garbage collector;
not the shared cluster) holds N Node objects of the 2xC550-sriov preset
(localcluster/fakenodes.py, what gpu-label and gpu-device publish there), the
metax-gpu-extensions chart's driver-manager RBAC and its ``driver-config``
ConfigMap naming every node with vfnum 0 -- the objects operator-controller
applies. benchmarks/vfnum_fleet.py runs N stand-in driver-managers in one
process: the real driver_manager code (its ``run_loop``, each stand-in's own
watch decisions fed from one shared watch per kind -- see its docstring for
what that leaves out -- the vfnum path and Leases), each over a simulated
root of its own, with the chart service account's token, so its RBAC is what
the API server checks.

Then one edit of ``node-vfnums`` sets every node to vfnum 4 (with
``--named M``, the first M; the others stay at 0, but the edit wakes them too
and each runs a round that changes nothing: the herd's requests are in the
count), and the benchmark measures

* the time until every named node's ``metax-tech.com/gpu.vfnum.state`` says
  ``success`` (a watch of the Nodes);
* the budget: the most slot Leases alive at once (a watch of the Leases)
  and the most stand-ins inside a slot at once (the fleet's own count), both
  against P;
* the pace against the ideal: ceil(N / P) x the median slot hold (take to
  release) measured in the same run;
* ``apiserver_request_total`` by verb and resource during the change.

With ``--baseline`` (another checkout's collections tree, e.g. main's before
the slot waiting), the same runs with the stand-ins imported from it, and the
ratios. A run not done within ``--timeout`` seconds is reported with the
nodes done by then.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Optional

import scale_common  # noqa: E402  (first: puts the collection and tests/ on sys.path)

import urllib3  # noqa: E402
import yaml  # noqa: E402
from controlplane import ControlPlane, lib_dir  # noqa: E402
from kubernetes import client as k8s_client, watch as k8s_watch  # noqa: E402
from localcluster import fakenodes  # noqa: E402
from scale.agent_output import preset_profiles  # noqa: E402

from ansible_collections.metax.gpu.plugins.module_utils import names as N  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.kube.client import api_client  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
EXTENSIONS = os.path.join(scale_common.REPO, "files", "charts", "metax-gpu-extensions")
NS = N.OPERATOR_NAMESPACE
PRESET = "2xC550-sriov"
DRIVER_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ConfigMap")
DRIVER_NAMES = ("driver-manager", "metax-gpu-driver-manager", N.DRIVER_CONFIGMAP)
SLOT_SELECTOR = "metax-tech.com/slot-pool=metax-vfnum-slot"


def driver_objects(cp: ControlPlane, names: List[str], max_parallel: int) -> List[Dict[str, Any]]:
    """The extensions chart's driver-manager RBAC and driver-config, every node at vfnum 0."""
    values = os.path.join(cp.dir, "values.yaml")
    with open(values, "w", encoding="utf-8") as out:
        yaml.safe_dump({"driverManager": {"enabled": True, "vfnumsConfig": {n: {"vfnum": 0} for n in names},
                                          "vfnumPolicy": {"maxParallel": max_parallel}}}, out)
    helm = os.path.join(lib_dir("helm_bin_dir"), "helm")
    text = subprocess.run([helm, "template", "metax-gpu-extensions", EXTENSIONS, "-n", NS, "-f", values],
                          capture_output=True, text=True, check=True, timeout=120).stdout
    found = [o for o in yaml.safe_load_all(text) if o and o["kind"] in DRIVER_KINDS
             and o["metadata"]["name"] in DRIVER_NAMES]
    if not any(o["kind"] == "ConfigMap" for o in found):
        raise RuntimeError("the chart rendered no driver-config")
    return found


def create_nodes(core: Any, names: List[str]) -> None:
    base = tempfile.mkdtemp(prefix="metax-vfnum-profile-")
    try:
        profile = preset_profiles(PRESET, base, taken=(0.0,))[0]
    finally:
        shutil.rmtree(base, ignore_errors=True)

    def one(name: str) -> None:
        core.create_node(fakenodes.node_manifest(fakenodes.FakeNode(name, profile)))
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, names))


class Watcher:
    """A watch of the Nodes' vfnum state (when every one says success) and of the slot Leases
    (the most alive at once), in threads of this process."""

    def __init__(self, api: Any, size: int) -> None:
        # the harness's own watch, with the client's typed models (the agents' is kube/watch.py)
        self.core, self.coord = k8s_client.CoreV1Api(api), k8s_client.CoordinationV1Api(api)
        self.size = size
        self.stop = threading.Event()
        self.states: Dict[str, str] = {}
        self.leases: set = set()
        self.max_leases = 0
        self.done = threading.Event()
        self.done_at: Optional[float] = None
        self.lock = threading.Lock()
        self.ready = threading.Barrier(3)
        for target in (self._nodes, self._leases):
            threading.Thread(target=self._quiet, args=(target,), daemon=True).start()
        self.ready.wait(60)

    def _quiet(self, target: Any) -> None:
        """``target``; its watch broken by the control plane's stop after the measure is no error."""
        try:
            target()
        except Exception:  # pylint: disable=broad-except
            if not self.stop.is_set():
                raise

    def _nodes(self) -> None:
        listed = self.core.list_node(resource_version="0")
        for node in listed.items:
            self.states[node.metadata.name] = (node.metadata.labels or {}).get(N.LABEL_VFNUM_STATE, "")
        self.ready.wait(60)
        stream = k8s_watch.Watch()
        for event in stream.stream(self.core.list_node, resource_version=listed.metadata.resource_version,
                                   timeout_seconds=3600):
            node = event["object"]
            with self.lock:
                self.states[node.metadata.name] = (node.metadata.labels or {}).get(N.LABEL_VFNUM_STATE, "")
                if self.success() == self.size and not self.done.is_set():
                    self.done_at = time.monotonic()
                    self.done.set()
            if self.stop.is_set():
                break

    def _leases(self) -> None:
        listed = self.coord.list_namespaced_lease(NS, label_selector=SLOT_SELECTOR, resource_version="0")
        self.leases = {lease.metadata.name for lease in listed.items}
        self.ready.wait(60)
        stream = k8s_watch.Watch()
        for event in stream.stream(self.coord.list_namespaced_lease, NS, label_selector=SLOT_SELECTOR,
                                   resource_version=listed.metadata.resource_version, timeout_seconds=3600):
            with self.lock:
                name = event["object"].metadata.name
                if event["type"] == "DELETED":
                    self.leases.discard(name)
                else:
                    self.leases.add(name)
                self.max_leases = max(self.max_leases, len(self.leases))
            if self.stop.is_set():
                break

    def success(self) -> int:
        return sum(1 for state in self.states.values() if state == "success")


def requests(cp: ControlPlane) -> Dict[str, float]:
    return scale_common.apiserver_requests(cp.port, "admin-token", by_resource=True)


def measure(size: int, max_parallel: int, collections: str, timeout: float, own_watches: bool = False,
            named: Optional[int] = None) -> Dict[str, Any]:
    cp = ControlPlane().start()
    named = size if named is None else min(named, size)
    row: Dict[str, Any] = {"nodes": size, "named": named, "max_parallel": max_parallel, "collections": collections,
                           "own_watches": own_watches}
    fleet: Optional[subprocess.Popen] = None
    roots = tempfile.mkdtemp(prefix="metax-vfnum-roots-")
    names = ["%s%05d" % (fakenodes.NAME_PREFIX, i) for i in range(size)]
    try:
        admin = api_client(cp.kubeconfig)
        core = k8s_client.CoreV1Api(admin)
        core.create_namespace({"metadata": {"name": NS}})
        create_nodes(core, names)
        objects = driver_objects(cp, names, max_parallel)
        out = cp.kubectl("apply", "-n", NS, "-f", "-", input=yaml.safe_dump_all(objects))
        if out.returncode != 0:
            raise RuntimeError(out.stderr)
        token = cp.kubectl("-n", NS, "create", "token", "driver-manager", "--duration=2h").stdout.strip()
        kubeconfig = cp.write_kubeconfig(os.path.join(cp.dir, "driver-manager.kubeconfig"), token)
        with open(os.path.join(cp.dir, "names"), "w", encoding="utf-8") as listing:
            listing.write("\n".join(names) + "\n")
        started = time.monotonic()
        log = open(os.path.join(cp.dir, "fleet.log"), "w")       # pylint: disable=consider-using-with
        fleet = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "vfnum_fleet.py"), "--collections", collections,
             "--kubeconfig", kubeconfig, "--names", os.path.join(cp.dir, "names"), "--roots", roots,
             "--max-parallel", str(max_parallel), "--namespace", NS,
             "--node-selector", "%s=%s" % fakenodes.FAKE_LABEL] + (["--own-watches"] if own_watches else []),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
            env=dict(os.environ, PYTHONPATH=collections, PYTHONWARNINGS="ignore"))
        assert fleet.stdout is not None and fleet.stdin is not None
        line = fleet.stdout.readline()
        if not line.startswith("ready"):
            raise RuntimeError("the fleet did not start: %r\n%s" % (line, cp.log("fleet", 40)))
        row["fleet_start_s"] = time.monotonic() - started
        time.sleep(5)               # past the first rounds' writes
        watcher = Watcher(admin, named)
        before = requests(cp)
        start = time.monotonic()
        # the first ``named`` nodes to vfnum 4, the others named at 0 still: every stand-in is woken
        # by the edit, and those not named run a round that changes nothing (the herd's cost)
        core.patch_namespaced_config_map(N.DRIVER_CONFIGMAP, NS, {"data": {
            "node-vfnums": yaml.safe_dump({"nodes": {name: {"vfnum": 4 if i < named else 0}
                                                     for i, name in enumerate(names)}})}})
        watcher.done.wait(timeout)
        took = (watcher.done_at or time.monotonic()) - start
        after = requests(cp)
        row.update(change_s=took, done=watcher.success(), finished=watcher.done.is_set(),
                   max_leases=watcher.max_leases,
                   requests={k: round(after[k] - before.get(k, 0.0)) for k in sorted(after)
                             if after[k] - before.get(k, 0.0) > 0})
        watcher.stop.set()
        fleet.stdin.write("stop\n")
        fleet.stdin.flush()
        stats = json.loads(fleet.stdout.readline())
        holds = stats["holds_s"]
        row.update(max_holding=stats["max_holding"], rounds=stats["rounds"], holds=len(holds),
                   events=stats.get("events", {}),
                   hold_median_s=holds[len(holds) // 2] if holds else None,
                   apply_median_s=stats["applies_s"][len(stats["applies_s"]) // 2] if stats["applies_s"] else None)
        if holds:
            row["ideal_s"] = math.ceil(named / max_parallel) * row["hold_median_s"]
    finally:
        if fleet is not None and fleet.poll() is None:
            fleet.kill()
        cp.stop()
        shutil.rmtree(roots, ignore_errors=True)
    return row


def report(rows: List[Dict[str, Any]]) -> None:
    print("\n| nodes | named | maxParallel | code | every named node success (s) | ideal (s) | pace / ideal | most Leases / "
          "in a slot at once | slot hold median (s) | POST leases | GET configmaps | LIST pods | PATCH nodes | "
          "all requests |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        req = row["requests"]
        print("| %d | %d | %d | %s | %s%.1f | %.1f | %.1fx | %d / %d | %.2f | %d | %d | %d | %d | %d |" % (
            row["nodes"], row["named"], row["max_parallel"], row["code"] + (" (own watches)" if row["own_watches"] else ""),
            "" if row["finished"] else ">",
            row["change_s"], row.get("ideal_s") or 0, row["change_s"] / (row.get("ideal_s") or 1),
            row["max_leases"], row["max_holding"], row.get("hold_median_s") or 0,
            req.get("POST leases", 0), req.get("GET configmaps", 0), req.get("LIST pods", 0),
            req.get("PATCH nodes", 0), sum(req.values())))
        if not row["finished"]:
            print("|  |  |  |  | (%d of %d nodes done at the timeout) |  |  |  |  |  |  |  |  |  |"
                  % (row["done"], row["named"]))
    by = {(r["nodes"], r["max_parallel"], r["code"]): r for r in rows}
    for (size, parallel, code), row in sorted(by.items()):
        base = by.get((size, parallel, "baseline"))
        if code == "this" and base is not None:
            print("N=%d maxParallel=%d: baseline / this = %s%.1fx in time, %.1fx in requests" % (
                size, parallel, "" if base["finished"] else ">", base["change_s"] / row["change_s"],
                sum(base["requests"].values()) / max(1, sum(row["requests"].values()))))


def main() -> int:
    parser = scale_common.arguments(__doc__)
    parser.set_defaults(sizes=[500])
    parser.add_argument("--parallel", default="10,50", type=scale_common.size_list,
                        help="vfnumPolicy.maxParallel values (default %(default)s)")
    parser.add_argument("--baseline", default=None,
                        help="also run the stand-ins from this collections tree (another checkout's "
                             ".build/collections), for before/after figures")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds a change may take (default %(default)s)")
    parser.add_argument("--named", type=int, default=None,
                        help="nodes the edit names (vfnum 0 -> 4; default every one): the others run a round "
                             "that changes nothing")
    parser.add_argument("--own-watches", action="store_true",
                        help="three watches per stand-in, as each pod has, not one shared per kind "
                             "(the fleet before the shared watches)")
    args = parser.parse_args()
    urllib3.disable_warnings()          # the private control plane's self-signed certificate
    this = os.path.join(scale_common.REPO, ".build", "collections")
    rows = []
    for size in args.sizes:
        for parallel in args.parallel:
            for code, tree in (("this", this), ("baseline", args.baseline)):
                if tree is None:
                    continue
                row = measure(size, parallel, os.path.abspath(tree), args.timeout, args.own_watches, args.named)
                row["code"] = code
                rows.append(row)
                print(json.dumps(row), flush=True)
    report(rows)
    scale_common.write_json(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
