# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""DRA at scale: ResourceSlices of N fake 8xC500 nodes, and the kube-scheduler's latency for 1-, 4- and 8-GPU claims
beside the device-plugin path, in one run.

    make -C benchmarks dra-scale         # or:
    flock /tmp/metax-heavy.lock env PYTHONPATH=.build/collections .venv/bin/python benchmarks/dra_scale_bench.py \\
        [--nodes 2000] [--pods 100]

A private control plane (dra_common: etcd, kube-apiserver, our kube-scheduler,
default profile; never the shared cluster). N Node objects without kubelets
(kwok-like: capacity only), then two phases on the same nodes and scheduler:

1. **DRA**: one ResourceSlice per node as gpu-dra publishes it for the
   simulator's 8xC500 (discovery + ``dra/slices.py``; UUIDs and serials
   made unique per node), the chart's DeviceClasses. For each size, ``--pods``
   pods one after another, each with its own ResourceClaim as docs/dra.md's
   templates write it: 1 GPU plain, 4 GPUs with ``matchAttribute`` on the
   MetaXLink group, 8 GPUs plain (the whole node).
2. **Device plugin**: the slices deleted, ``metax-tech.com/gpu: 8`` in every
   node's capacity (what gpu-device advertises), the same number of pods
   asking ``metax-tech.com/gpu: N`` -- the same scheduler **without** the
   gpu-aware extender (its own figures: scale_gpu_aware.py).

Per size and path: the scheduler's ``scheduler_scheduling_attempt_duration_seconds``
(result=scheduled: filter, score, reserve, PreBind -- DRA writes the claim's
allocation there -- and the binding) p50/p99 interpolated inside its buckets,
its PreBind, and pod creation -> bound seen by a watch, p50/p99 of the
samples; DRA/device-plugin ratios. API objects per path, the slices' JSON
size, and the scheduler's and API server's memory.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Optional, Sequence

import dra_common as D

from ansible_collections.metax.gpu.plugins.module_utils.sim.spec import preset  # noqa: E402

ATTEMPT = "scheduler_scheduling_attempt_duration_seconds"
EXTENSION = "scheduler_framework_extension_point_duration_seconds"
SIZES = (1, 4, 8)


def parallel(func: Callable[[Any], Any], items: Sequence[Any], workers: int = 8) -> List[Any]:
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(func, items))


def per_node_devices(template: List[Dict[str, Any]], node: str) -> List[Dict[str, Any]]:
    """The 8xC500's slice for ``node``: the identifiers a real node's GPUs have, unique per node."""
    out = json.loads(json.dumps(template))
    for item in out:
        item["metadata"]["name"] = D.S.slice_name(node, 0)
        item["spec"]["nodeName"] = item["spec"]["pool"]["name"] = node
        for dev in item["spec"].get("devices") or []:
            attrs = dev["attributes"]
            if "uuid" in attrs:
                attrs["uuid"] = {"string": "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, node + dev["name"]))}
            if "serial" in attrs:
                attrs["serial"] = {"string": uuid.uuid5(uuid.NAMESPACE_OID, node + dev["name"]).hex[:16].upper()}
    return out


def counts(api: D.TokenClient) -> Dict[str, int]:
    paths = {"nodes": "/api/v1/nodes", "resourceslices": "/apis/resource.k8s.io/v1/resourceslices",
             "deviceclasses": "/apis/resource.k8s.io/v1/deviceclasses", "resourceclaims": D.claims_path(),
             "pods": D.pods_path()}
    return {kind: sum(1 for _item in api.list_pages(path)) for kind, path in paths.items()}


def schedule(cluster: D.Cluster, watch: D.PodWatch, path_name: str, size: int, pods: int) -> Dict[str, Any]:
    """``pods`` pods of ``size`` GPUs, one after another; the scheduler's histograms and the bind times."""
    api = cluster.api
    assert cluster.scheduler is not None
    before = cluster.scheduler.metrics()
    waits: List[float] = []
    for k in range(pods):
        name = "%s-%d-%03d" % (path_name, size, k)
        if path_name == "dra":
            requests = [D.device_request("gpus", size)]
            api.create(D.claims_path(), D.claim_manifest(name, requests, D.ATTR_GROUP if size == 4 else None))
            manifest = D.pod_manifest(name, claim=name)
        else:
            manifest = D.pod_manifest(name, gpus=size)
        start = time.monotonic()
        api.create(D.pods_path(), manifest)
        state, detail = watch.wait(name, timeout=120)
        if state != "bound":
            raise RuntimeError("pod %s not scheduled: %s" % (name, detail))
        waits.append((detail[0] - start) * 1000)
    after = cluster.scheduler.metrics()
    attempt = D.histogram(after, before, ATTEMPT, {"result": "scheduled"})
    prebind = D.histogram(after, before, EXTENSION, {"extension_point": "PreBind"})
    return {"path": path_name, "size": size, "pods": pods, "attempt": attempt.__dict__, "prebind": prebind.__dict__,
            "bind_p50_ms": D.percentile(waits, 50), "bind_p99_ms": D.percentile(waits, 99),
            "bind_mean_ms": sum(waits) / len(waits)}


def drop_claims(api: D.TokenClient) -> None:
    """Every benchmark claim gone (allocated ones carry the scheduler's finalizer; no controller drops it here)."""
    names = [c["metadata"]["name"] for c in api.list_pages(D.claims_path())]
    parallel(lambda n: D.delete_now(api, "%s/%s" % (D.claims_path(), n)), names)


def run(nodes: int, pods: int, workers: int) -> Dict[str, Any]:
    out: Dict[str, Any] = {"nodes": nodes, "pods_per_size": pods, "machine": D.machine(), "rows": []}
    with D.Cluster() as cluster:
        api = cluster.api
        out["kubernetes"] = cluster.version()
        inventory = D.simulated_inventory(os.path.join(cluster.plane.dir, "sim"), preset("8xC500"))
        template = D.node_slices("template", inventory)
        names = ["fake-gpu-%05d" % i for i in range(nodes)]
        started = time.monotonic()
        parallel(lambda n: D.create_node(api, D.node_manifest(n)), names, workers)
        out["create_nodes_s"] = round(time.monotonic() - started, 1)
        started = time.monotonic()
        parallel(lambda n: [api.create("/apis/resource.k8s.io/v1/resourceslices", s)
                            for s in per_node_devices(template, n)], names, workers)
        out["create_slices_s"] = round(time.monotonic() - started, 1)
        out["slices_json_mib"] = round(api.list_bytes("/apis/resource.k8s.io/v1/resourceslices") / 2 ** 20, 2)
        out["slice_json_kib"] = round(len(json.dumps(per_node_devices(template, names[0])[0],
                                                     separators=(",", ":"))) / 1024, 2)
        print("%d nodes created in %.1f s, their ResourceSlices in %.1f s (%.2f MiB of JSON, %.2f KiB each)" % (
            nodes, out["create_nodes_s"], out["create_slices_s"], out["slices_json_mib"], out["slice_json_kib"]),
            flush=True)
        time.sleep(5)      # the scheduler's informers catch up with the burst
        watch = D.PodWatch(api)
        try:
            for size in SIZES:
                out["rows"].append(schedule(cluster, watch, "dra", size, pods))
                print(json.dumps(out["rows"][-1]), flush=True)
            out["objects_dra"] = counts(api)
            assert cluster.scheduler is not None
            out["memory_dra"] = {"scheduler": D.proc_memory(cluster.scheduler.pid),
                                 "apiserver": D.proc_memory(cluster.apiserver_pid)}
            # the device plugin's path on the same nodes and scheduler
            D.fakenodes.delete_collection(api, D.pods_path())
            drop_claims(api)
            D.fakenodes.delete_collection(api, "/apis/resource.k8s.io/v1/resourceslices")
            capacity = {"capacity": {D.RESOURCE: "8"}, "allocatable": {D.RESOURCE: "8"}}
            started = time.monotonic()
            parallel(lambda n: api.request("PATCH", "/api/v1/nodes/%s/status" % n, {"status": capacity},
                                           "application/merge-patch+json"), names, workers)
            out["patch_capacity_s"] = round(time.monotonic() - started, 1)
            time.sleep(5)
            for size in SIZES:
                out["rows"].append(schedule(cluster, watch, "device-plugin", size, pods))
                print(json.dumps(out["rows"][-1]), flush=True)
            out["objects_device_plugin"] = counts(api)
            out["memory_device_plugin"] = {"scheduler": D.proc_memory(cluster.scheduler.pid),
                                           "apiserver": D.proc_memory(cluster.apiserver_pid)}
        finally:
            watch.stop()
    return out


def report(result: Dict[str, Any]) -> List[str]:
    rows = {(r["path"], r["size"]): r for r in result["rows"]}
    lines = ["machine: %s; Kubernetes %s; %d nodes, %d pods per size and path, created one after another" % (
        result["machine"], result["kubernetes"], result["nodes"], result["pods_per_size"]),
        "",
        "%-14s %4s | %27s | %20s | %22s | %s" % ("path", "GPUs", "scheduling attempt (ms)", "PreBind (ms)",
                                                 "created -> bound (ms)", "DRA / device plugin"),
        "%-14s %4s | %5s %6s %6s %6s | %6s %6s %6s | %7s %7s %6s | %s" % (
            "", "", "n", "mean", "p50", "p99", "mean", "p50", "p99", "p50", "p99", "mean", "attempt p50, p99; bound p50, p99")]
    for (path, size), r in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0] != "dra")):
        a, b = r["attempt"], r["prebind"]
        ratio = ""
        base = rows.get(("device-plugin", size))
        if path == "dra" and base:
            ba = base["attempt"]
            ratio = "x%.2f, x%.2f; x%.2f, x%.2f" % (a["p50_ms"] / ba["p50_ms"], a["p99_ms"] / ba["p99_ms"],
                                                    r["bind_p50_ms"] / base["bind_p50_ms"],
                                                    r["bind_p99_ms"] / base["bind_p99_ms"])
        lines.append("%-14s %4d | %5d %6.1f %6.1f %6.1f | %6.2f %6.2f %6.2f | %7.1f %7.1f %6.1f | %s" % (
            path, size, a["count"], a["mean_ms"], a["p50_ms"], a["p99_ms"], b["mean_ms"], b["p50_ms"], b["p99_ms"],
            r["bind_p50_ms"], r["bind_p99_ms"], r["bind_mean_ms"], ratio))
    lines += ["",
              "API objects after the DRA phase: %s" % ", ".join("%s %d" % kv for kv in result["objects_dra"].items()),
              "API objects after the device-plugin phase: %s" % ", ".join(
                  "%s %d" % kv for kv in result["objects_device_plugin"].items()),
              "ResourceSlices: %.2f MiB of JSON for %d nodes (%.2f KiB each); created in %.1f s, the nodes in %.1f s, "
              "the device plugin's capacity patched in %.1f s" % (
                  result["slices_json_mib"], result["nodes"], result["slice_json_kib"], result["create_slices_s"],
                  result["create_nodes_s"], result["patch_capacity_s"]),
              "memory (MiB, VmRSS / VmHWM) after the DRA phase: scheduler %(s1)s, apiserver %(a1)s; "
              "after the device-plugin phase: scheduler %(s2)s, apiserver %(a2)s" % {
                  "s1": "%(VmRSS)s / %(VmHWM)s" % result["memory_dra"]["scheduler"],
                  "a1": "%(VmRSS)s / %(VmHWM)s" % result["memory_dra"]["apiserver"],
                  "s2": "%(VmRSS)s / %(VmHWM)s" % result["memory_device_plugin"]["scheduler"],
                  "a2": "%(VmRSS)s / %(VmHWM)s" % result["memory_device_plugin"]["apiserver"]},
              "the device-plugin path ran without the gpu-aware extender (see scale_gpu_aware.py for it)"]
    return lines


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--nodes", type=int, default=2000, help="fake nodes (default %(default)s)")
    parser.add_argument("--pods", type=int, default=100, help="pods per size and path (default %(default)s)")
    parser.add_argument("--workers", type=int, default=8, help="parallel writers creating the fleet")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    started = time.monotonic()
    result = run(args.nodes, args.pods, args.workers)
    result["seconds"] = round(time.monotonic() - started)
    result["load_end"] = os.getloadavg()[0]
    lines = report(result) + ["total %d s; 1-minute load average at the end %.2f" % (result["seconds"], result["load_end"])]
    print("\n".join(lines))
    D.write_results("dra_scale.txt", lines, result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
