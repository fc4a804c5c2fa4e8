# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""GPU Operator scheme on the local cluster: install time, controller RSS, API requests per minute.

    flock -o /tmp/metax-cluster.lock env PYTHONPATH=.build/collections \\
        .venv/bin/python benchmarks/operator_bench.py [--idle-seconds 60] [--rounds 1]

Needs the local three-node cluster up (docs/local-cluster.md), the agent
images built (files/images/agent/build.sh, run here; a no-op when current) and
no GPU scheme installed (it refuses otherwise). Warm: the images are in the
registry and, after the first round, on the nodes; run it after the cluster
tests or with ``--rounds 2`` and read the last round.

* **helm install -> every GPU node allocatable = its devices**, for the
  operator chart (controller, then gpu-label, gpu.installed, gpu-device) and,
  as the baseline in the same run, for the GPU Extensions chart (gpu-label
  and gpu-device straight from helm), same values.
* **RSS** of each operator-controller replica (host /proc: the containers are
  host processes), against a gpu-label agent of the same image.
* **API requests per minute** of the controller's service account, idle and
  during a reconcile (a `kubectl patch` of devicePlugin.healthyInterval until
  the CR is Ready again), counted by the API server itself: FlowSchemas
  matching that service account (reads; kopf peering heartbeats; other
  writes) and the agents' service accounts (the baseline: what the
  components make in either scheme), read from
  ``apiserver_flowcontrol_dispatched_requests_total``. The FlowSchemas are
  removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
OPERATOR_CHART = os.path.join(REPO, "files", "charts", "metax-operator")
EXTENSIONS_CHART = os.path.join(REPO, "files", "charts", "metax-gpu-extensions")
BUILD = os.path.join(REPO, "files", "images", "agent", "build.sh")
NS = "metax-operator"
BASELINE_NS = "metax-bench-extensions"
RESOURCE = "metax-tech.com/gpu"
CONTROLLER_SA = "operator-controller"
AGENT_SAS = ("gpu-label", "gpu-device")
WRITE_VERBS = ["create", "update", "patch", "delete", "deletecollection"]
READ_VERBS = ["get", "list", "watch"]
# (name, precedence, service accounts, verbs, resources); the first match wins
# (lowest precedence), so peering heartbeats are split from the other writes.
FLOW_SCHEMAS = (
    ("metax-bench-peering", 480, (CONTROLLER_SA,), ["patch"], ("kopf.dev", "kopfpeerings")),
    ("metax-bench-writes", 481, (CONTROLLER_SA,), WRITE_VERBS, ("*", "*")),
    ("metax-bench-reads", 482, (CONTROLLER_SA,), READ_VERBS, ("*", "*")),
    ("metax-bench-agents", 483, AGENT_SAS, WRITE_VERBS + READ_VERBS, ("*", "*")),
)


class Kube:
    def __init__(self, env: Dict[str, str]) -> None:
        self.env = env

    def run(self, *args: str, check: bool = True, input_text: Optional[str] = None,
            timeout: float = 600) -> subprocess.CompletedProcess:
        res = subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=timeout,
                             input=input_text, stdin=None if input_text is not None else subprocess.DEVNULL,
                             check=False)
        if check and res.returncode != 0:
            raise RuntimeError("%s failed: %s" % (" ".join(args[:4]), res.stderr.strip()[-2000:]))
        return res

    def kubectl(self, *args: str, **kwargs) -> subprocess.CompletedProcess:
        return self.run("kubectl", *args, **kwargs)

    def json(self, *args: str) -> Optional[dict]:
        res = self.kubectl("get", "-o", "json", *args, check=False)
        return json.loads(res.stdout) if res.returncode == 0 else None


def cluster_env() -> Dict[str, str]:
    out = subprocess.run(["bash", os.path.join(REPO, "scripts", "cluster", "cluster.sh"), "json"],
                         capture_output=True, text=True, check=True, timeout=120, stdin=subprocess.DEVNULL)
    info = json.loads(out.stdout)
    env = dict(os.environ)
    env.update({k: v for k, v in info.items() if isinstance(v, str) and v})
    tools = [info["METAX_KUBE_BIN"]] + ([os.path.dirname(info["METAX_HELM"])] if info.get("METAX_HELM") else [])
    env["PATH"] = os.pathsep.join(tools + [env.get("PATH", "")])
    return env


def wait(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.5) -> float:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise RuntimeError("timed out after %ss waiting for %s" % (timeout, what))
        time.sleep(interval)
    return time.monotonic() - start


def all_allocatable(kube: Kube) -> bool:
    nodes = kube.json("nodes")["items"]
    for node in nodes:
        labels = node["metadata"].get("labels") or {}
        if labels.get("metax-tech.com/gpu.installed") != "true":
            return False
        count = int(labels.get("metax-tech.com/gpu.count", "0"))
        vfnum = int(labels.get("metax-tech.com/gpu.vfnum", "0"))
        want = count * vfnum if vfnum else count
        if want == 0 or int(node["status"].get("allocatable", {}).get(RESOURCE, "0")) != want:
            return False
    return bool(nodes)


def none_allocatable(kube: Kube) -> bool:
    return all(int(n["status"].get("allocatable", {}).get(RESOURCE, "0")) == 0 for n in kube.json("nodes")["items"])


def images(kube: Kube) -> Tuple[str, str]:
    out = kube.run(BUILD, timeout=1800).stdout
    refs = dict(line.split("=", 1) for line in out.split() if "=" in line)
    prefix, tag = refs["operator-controller"].rsplit(":", 1)
    return prefix.rsplit("/", 1)[0], tag


def values(registry: str, tag: str) -> List[str]:
    sets = ["registry=" + registry, "imageTag=" + tag, "hostRoot.path=/var/lib/metax-sim",
            "hostRoot.subPathExpr=$(NODE_NAME)", "log.dir="]
    # --set-string: a content tag can be all digits, which --set makes a number
    return [arg for pair in sets for arg in ("--set-string", pair)]


def releases(kube: Kube) -> List[dict]:
    return json.loads(kube.run("helm", "list", "-A", "-o", "json").stdout or "[]")


def install_extensions(kube: Kube, registry: str, tag: str) -> Dict[str, float]:
    start = time.monotonic()
    kube.run("helm", "install", "metax-bench", EXTENSIONS_CHART, "-n", BASELINE_NS, "--create-namespace", "--wait",
             *values(registry, tag))
    helm_done = time.monotonic() - start
    wait(lambda: all_allocatable(kube), 300, "allocatable (Extensions)")
    result = {"helm": helm_done, "allocatable": time.monotonic() - start}
    kube.run("helm", "uninstall", "metax-bench", "-n", BASELINE_NS, "--wait")
    kube.kubectl("delete", "namespace", BASELINE_NS, "--wait=true")
    wait(lambda: none_allocatable(kube), 300, "allocatable back to 0")
    return result


def cr_ready(kube: Kube) -> bool:
    body = kube.json("clusteroperator", "cluster-operator", "-n", NS) or {}
    status = body.get("status") or {}
    return status.get("observedGeneration") == body.get("metadata", {}).get("generation") and any(
        c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions") or [])


def install_operator(kube: Kube, registry: str, tag: str) -> Dict[str, float]:
    start = time.monotonic()
    # the same agents as the Extensions baseline: the chain components (on by default since issue 38) off
    kube.run("helm", "install", OPERATOR_CHART, "-n", NS, "--create-namespace", "--generate-name", "--wait",
             *values(registry, tag), "--set", "driver.deploy=false", "--set", "maca.deploy=false",
             "--set", "runtime.deploy=false")
    helm_done = time.monotonic() - start
    wait(lambda: all_allocatable(kube), 300, "allocatable (operator)")
    allocatable = time.monotonic() - start
    wait(lambda: cr_ready(kube), 120, "ClusterOperator Ready")
    return {"helm": helm_done, "allocatable": allocatable, "ready": time.monotonic() - start}


def uninstall_operator(kube: Kube) -> None:
    for release in releases(kube):
        if release["chart"].startswith("metax-operator"):
            kube.run("helm", "uninstall", release["name"], "-n", release["namespace"], "--wait")


def flow_schemas(kube: Kube, create: bool) -> None:
    for name, precedence, accounts, verbs, (group, resource) in FLOW_SCHEMAS:
        if not create:
            kube.kubectl("delete", "flowschema", name, "--ignore-not-found", check=False)
            continue
        body = {"apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema",
                "metadata": {"name": name},
                "spec": {"matchingPrecedence": precedence, "priorityLevelConfiguration": {"name": "workload-low"},
                         "distinguisherMethod": {"type": "ByUser"},
                         "rules": [{"subjects": [{"kind": "ServiceAccount",
                                                  "serviceAccount": {"name": sa, "namespace": NS}}
                                                 for sa in accounts],
                                    "resourceRules": [{"verbs": verbs, "apiGroups": [group], "resources": [resource],
                                                       "clusterScope": True, "namespaces": ["*"]}]}]}}
        kube.kubectl("apply", "-f", "-", input_text=json.dumps(body))


def request_counts(kube: Kube) -> Dict[str, float]:
    text = kube.kubectl("get", "--raw", "/metrics").stdout
    counts = {name: 0.0 for name, *_rest in FLOW_SCHEMAS}
    for line in text.splitlines():
        if line.startswith("apiserver_flowcontrol_dispatched_requests_total{"):
            match = re.search(r'flow_schema="([^"]+)"', line)
            if match and match.group(1) in counts:
                counts[match.group(1)] += float(line.rsplit(" ", 1)[1])
    return counts


def per_minute(before: Dict[str, float], after: Dict[str, float], seconds: float) -> Dict[str, float]:
    return {k: (after[k] - before[k]) * 60.0 / seconds for k in before}


def rss_mib(env_match: str, cmd_match: bytes) -> List[float]:
    """VmRSS of host processes whose cmdline has ``cmd_match`` and whose environment has ``env_match``."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % entry, "rb") as fh:
                if cmd_match not in fh.read():
                    continue
            with open("/proc/%s/environ" % entry, "rb") as fh:
                if not any(v.startswith(env_match.encode()) for v in fh.read().split(b"\0")):
                    continue
            with open("/proc/%s/status" % entry) as fh:
                found = re.search(r"VmRSS:\s+(\d+)", fh.read())
            if found:
                out.append(int(found.group(1)) / 1024.0)
        except OSError:
            continue
    return sorted(out)


def measure(kube: Kube, registry: str, tag: str, idle_seconds: float) -> Dict[str, object]:
    result: Dict[str, object] = {"extensions": install_extensions(kube, registry, tag)}
    flow_schemas(kube, create=True)
    try:
        result["operator"] = install_operator(kube, registry, tag)
        time.sleep(10)   # the rollout's last status writes
        result["rss_controller"] = rss_mib("POD_NAME=operator-controller-", b"agents.operator_controller")
        result["rss_gpu_label"] = rss_mib("NODE_NAME=", b"agents.gpu_label")
        before = request_counts(kube)
        time.sleep(idle_seconds)
        result["idle"] = per_minute(before, request_counts(kube), idle_seconds)
        before = request_counts(kube)
        start = time.monotonic()
        kube.kubectl("patch", "clusteroperator", "cluster-operator", "-n", NS, "--type=merge",
                     "-p", json.dumps({"spec": {"devicePlugin": {"healthyInterval": 7}}}))
        time.sleep(1)
        wait(lambda: cr_ready(kube) and all_allocatable(kube), 180, "Ready after the patch")
        seconds = time.monotonic() - start
        after = request_counts(kube)
        result["reconcile"] = per_minute(before, after, seconds)
        result["reconcile_requests"] = {k: after[k] - before[k] for k in before}
        result["reconcile_seconds"] = seconds
    finally:
        uninstall_operator(kube)
        flow_schemas(kube, create=False)
    return result


def table(rounds: List[Dict[str, object]]) -> str:
    lines = ["| round | what | operator | baseline | ratio |", "|---|---|---|---|---|"]
    for i, r in enumerate(rounds, 1):
        ext, op = r["extensions"], r["operator"]
        lines.append("| %d | helm install -> every GPU node allocatable (s) | %.1f | %.1f (Extensions chart) | %.2f |"
                     % (i, op["allocatable"], ext["allocatable"], op["allocatable"] / ext["allocatable"]))
        lines.append("| %d | helm install --wait returns (s) | %.1f | %.1f | |" % (i, op["helm"], ext["helm"]))
        ctl, agent = r["rss_controller"], r["rss_gpu_label"]
        if ctl:
            lines.append("| %d | RSS per controller replica (MiB) | %s | %s (gpu-label agents) | %s |"
                         % (i, ", ".join("%.0f" % v for v in ctl), ", ".join("%.0f" % v for v in agent) or "-",
                            "%.2f" % (max(ctl) / max(agent)) if agent else "-"))
        for phase in ("idle", "reconcile"):
            rate = r[phase]
            agents = rate["metax-bench-agents"]
            ours = rate["metax-bench-writes"] + rate["metax-bench-reads"] + rate["metax-bench-peering"]
            label = phase if phase == "idle" else "during a reconcile (%.1f s, %d requests)" % (
                r["reconcile_seconds"], sum(v for k, v in r["reconcile_requests"].items() if k != "metax-bench-agents"))
            lines.append("| %d | controller API requests/min, %s: reads %.1f, writes %.1f, peering %.1f | %.1f | "
                         "%.1f (gpu-label + gpu-device agents) | %s |"
                         % (i, label, rate["metax-bench-reads"], rate["metax-bench-writes"],
                            rate["metax-bench-peering"], ours, agents, "%.2f" % (ours / agents) if agents else "-"))
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args(argv)
    kube = Kube(cluster_env())
    installed = [r["name"] for r in releases(kube) if r["chart"].startswith(("metax-operator", "metax-gpu-extensions"))]
    if installed:
        print("a GPU scheme is installed (%s): uninstall it first" % ", ".join(installed), file=sys.stderr)
        return 2
    registry, tag = images(kube)
    rounds = []
    for _round in range(args.rounds):
        rounds.append(measure(kube, registry, tag, args.idle_seconds))
    print(json.dumps(rounds, indent=1, default=str), file=sys.stderr)
    print(table(rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
