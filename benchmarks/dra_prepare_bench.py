# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""gpu-dra's NodePrepareResources / NodeUnprepareResources latency (p50/p99) and its RSS, as the kubelet calls it.

    make -C benchmarks dra-prepare       # or:
    flock /tmp/metax-heavy.lock env PYTHONPATH=.build/collections .venv/bin/python benchmarks/dra_prepare_bench.py \\
        [--claims 500]

The real agent (``agents/gpu_dra.py``: server.py + prepare.py) in a process
of its own on a simulated 8xC500 host root with MXMACA installed, against a
private control plane (dra_common: etcd and kube-apiserver, no scheduler, no
kubelet; never the shared cluster). The node is labelled for DRA, so the
agent registers and publishes its ResourceSlice as on a real node. Then, as
the kubelet would, over the agent's unix socket with gRPC:

* ``--claims`` ResourceClaims of 2 GPUs (the allocation written as the
  scheduler writes it; at most four prepared at once, on distinct GPUs, as
  on a busy 8-GPU node), each prepared (the agent reads the claim from the
  API server, writes its CDI spec and its checkpoint), prepared again (the
  kubelet's retry: answered from the checkpoint), and unprepared later;
* the baseline in the same run: the plugin watcher's GetInfo on the agent's
  registration socket, a gRPC round trip to the same process that does no
  work, so the ratios say what Prepare costs beyond the transport.

The agent's VmRSS and VmHWM (peak) are read from /proc at idle (after its
first publication) and after the calls; beside them, the RSS of a bare
interpreter that imported what the agent imports (grpcio, the kubernetes
client, the agent's module), the floor of any Python agent of ours.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

import dra_common as D

from ansible_collections.metax.gpu.plugins.module_utils.deviceplugin.api import (  # noqa: E402
    dra_v1_pb2 as dra, dra_v1_pb2_grpc as dra_grpc, pluginregistration_v1_pb2 as reg,
    pluginregistration_v1_pb2_grpc as reg_grpc)
from ansible_collections.metax.gpu.plugins.module_utils.dra.server import plugin_socket, registration_socket  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.names import DEVICE_MODE_DRA, LABEL_DEVICE_MODE  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.sim.spec import preset  # noqa: E402

try:
    import grpc
except ImportError:  # pragma: no cover
    raise SystemExit("error: grpcio is needed (requirements: the agents' images have it)")

AGENT = "ansible_collections.metax.gpu.plugins.module_utils.agents.gpu_dra"
NODE = "dra-bench-node"
WINDOW = 4          # claims prepared at once (2 GPUs each: the whole 8-GPU node)


def timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return (time.perf_counter() - start) * 1000.0


def wait_for(what: str, check, timeout: float, agent: subprocess.Popen, log: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if agent.poll() is not None or time.monotonic() > deadline:
            with open(log, encoding="utf-8", errors="replace") as fh:
                raise RuntimeError("gpu-dra: no %s (exit %s):\n%s" % (what, agent.poll(), fh.read()[-3000:]))
        time.sleep(0.2)


def imports_floor(env: Dict[str, str]) -> Dict[str, float]:
    """VmRSS/VmHWM of a Python process that imported the agent's module (and with it grpcio and the
    kubernetes client) and does nothing."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys, %s, grpc, kubernetes; sys.stdout.write('ok\\n'); "
                             "sys.stdout.flush(); sys.stdin.read()" % AGENT], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env=env)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ok"
        return D.proc_memory(proc.pid)
    finally:
        proc.kill()
        proc.wait(10)


def stats(samples: Sequence[float]) -> Dict[str, float]:
    return {"n": len(samples), "p50_ms": D.percentile(samples, 50), "p99_ms": D.percentile(samples, 99),
            "mean_ms": sum(samples) / len(samples) if samples else float("nan")}


def run(claims: int) -> Dict[str, Any]:
    out: Dict[str, Any] = {"machine": D.machine(), "claims": claims}
    with D.Cluster(scheduler=False) as cluster:
        api = cluster.api
        out["kubernetes"] = cluster.version()
        base = cluster.plane.dir
        root = os.path.join(base, "host")
        D.simulated_inventory(root, preset("8xC500"))
        D.create_node(api, D.node_manifest(NODE, labels={LABEL_DEVICE_MODE: DEVICE_MODE_DRA}))
        plugins, registry, cdi = (os.path.join(base, d) for d in ("plugins", "registry", "cdi"))
        log = os.path.join(base, "gpu-dra.log")
        env = dict(os.environ, PYTHONPATH=os.path.join(D.scale_common.REPO, ".build", "collections"))
        for key in ("KUBERNETES_SERVICE_HOST", "NODE_NAME"):
            env.pop(key, None)
        with open(log, "w", encoding="utf-8") as log_fh:
            agent = subprocess.Popen([sys.executable, "-m", AGENT, "--host-root", root, "--node-name", NODE,
                                      "--kubeconfig", cluster.plane.kubeconfig, "--plugins-dir", plugins,
                                      "--plugins-registry-dir", registry, "--cdi-spec-dir", cdi,
                                      "--log-level", "warning", "--log-format", "text"],
                                     stdout=log_fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        try:
            started = time.monotonic()
            slices_path = "/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName%3D" + NODE
            wait_for("ResourceSlice", lambda: api.request("GET", slices_path).get("items"), 60, agent, log)
            wait_for("DRA socket", lambda: os.path.exists(plugin_socket(plugins)), 30, agent, log)
            out["ready_s"] = round(time.monotonic() - started, 2)
            devices = [d["name"] for s in api.request("GET", slices_path)["items"] for d in s["spec"].get("devices") or []]
            time.sleep(2)
            out["idle"] = D.proc_memory(agent.pid)
            names = ["prep-%04d" % k for k in range(claims)]
            uids = {}
            for k, name in enumerate(names):
                pair = devices[2 * (k % WINDOW):2 * (k % WINDOW) + 2]
                D.hold_devices(api, name, NODE, pair)
                uids[name] = api.request("GET", "%s/%s" % (D.claims_path(), name))["metadata"]["uid"]
            prepare: List[float] = []
            retry: List[float] = []
            unprepare: List[float] = []
            floor: List[float] = []
            errors: List[str] = []

            def claim(name: str) -> Any:
                return dra.Claim(namespace=D.NAMESPACE, uid=uids[name], name=name)

            with grpc.insecure_channel("unix://" + plugin_socket(plugins)) as channel, \
                    grpc.insecure_channel("unix://" + registration_socket(registry)) as reg_channel:
                kubelet = dra_grpc.DRAPluginStub(channel)
                watcher = reg_grpc.RegistrationStub(reg_channel)
                watcher.GetInfo(reg.InfoRequest(), timeout=10)

                def do_prepare(name: str) -> None:
                    answer = kubelet.NodePrepareResources(dra.NodePrepareResourcesRequest(claims=[claim(name)]),
                                                          timeout=30).claims[uids[name]]
                    if answer.error or len(answer.devices) != 2:
                        errors.append("%s: %s" % (name, answer.error or "%d devices" % len(answer.devices)))

                def do_unprepare(name: str) -> None:
                    answer = kubelet.NodeUnprepareResources(dra.NodeUnprepareResourcesRequest(claims=[claim(name)]),
                                                            timeout=30).claims[uids[name]]
                    if answer.error:
                        errors.append("%s: %s" % (name, answer.error))

                for k, name in enumerate(names):
                    floor.append(timed(lambda: watcher.GetInfo(reg.InfoRequest(), timeout=10)))
                    prepare.append(timed(do_prepare, name))
                    retry.append(timed(do_prepare, name))
                    if k >= WINDOW - 1:
                        unprepare.append(timed(do_unprepare, names[k - WINDOW + 1]))
                for name in names[max(0, claims - WINDOW + 1):]:
                    unprepare.append(timed(do_unprepare, name))
            out["after"] = D.proc_memory(agent.pid)
            out["imports"] = imports_floor(env)
            out["cdi_specs_left"] = len(os.listdir(cdi)) if os.path.isdir(cdi) else 0
            out["errors"] = errors[:10]
            out["error_count"] = len(errors)
            out["prepare"], out["retry"], out["unprepare"], out["getinfo"] = (
                stats(prepare), stats(retry), stats(unprepare), stats(floor))
        finally:
            agent.terminate()
            try:
                agent.wait(15)
            except subprocess.TimeoutExpired:
                agent.kill()
    return out


def report(r: Dict[str, Any]) -> List[str]:
    floor = r["getinfo"]
    lines = ["machine: %s; Kubernetes %s (private API server); gpu-dra on a simulated 8xC500, %d claims of 2 GPUs"
             % (r["machine"], r["kubernetes"], r["claims"]), "",
             "%-34s %6s %9s %9s %9s   %s" % ("call (ms, client side over gRPC)", "n", "mean", "p50", "p99",
                                             "p50, p99 / GetInfo's")]
    for key, label in (("prepare", "NodePrepareResources (new claim)"), ("retry", "NodePrepareResources (retry)"),
                       ("unprepare", "NodeUnprepareResources"), ("getinfo", "GetInfo (baseline: no work)")):
        s = r[key]
        lines.append("%-34s %6d %9.2f %9.2f %9.2f   x%.1f, x%.1f" % (
            label, s["n"], s["mean_ms"], s["p50_ms"], s["p99_ms"], s["p50_ms"] / floor["p50_ms"],
            s["p99_ms"] / floor["p99_ms"]))
    lines += ["", "gpu-dra memory (MiB): idle VmRSS %.1f (VmHWM %.1f); after the calls VmRSS %.1f, VmHWM %.1f" % (
        r["idle"]["VmRSS"], r["idle"]["VmHWM"], r["after"]["VmRSS"], r["after"]["VmHWM"]),
        "a Python process that only imported gpu-dra's module, grpcio and the kubernetes client: VmRSS %.1f MiB "
        "(gpu-dra idle / that: x%.2f)" % (r["imports"]["VmRSS"], r["idle"]["VmRSS"] / r["imports"]["VmRSS"]),
        "started to first ResourceSlice and socket: %.2f s; errors: %d%s; CDI specs left after the last "
        "Unprepare: %d" % (r["ready_s"], r["error_count"], (" " + "; ".join(r["errors"])) if r["errors"] else "",
                           r["cdi_specs_left"])]
    return lines


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--claims", type=int, default=500, help="claims prepared and unprepared (default %(default)s)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    started = time.monotonic()
    result = run(args.claims)
    lines = report(result) + [D.closing_line(started)]
    print("\n".join(lines))
    D.write_results("dra_prepare.txt", lines, result, args.json)
    return 1 if result["error_count"] or result["cdi_specs_left"] else 0


if __name__ == "__main__":
    sys.exit(main())
