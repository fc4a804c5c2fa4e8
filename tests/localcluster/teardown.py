# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""`down`, and the baseline `up` records first: the edge that carries out baseline.py's decisions.

`down` stops what `up` started (PID files only), lets the kubelets tear the
pods down, then removes what the teardown plan lists -- computed from the
recorded baseline and the machine as it is now (``edge.observe``), so it
works after a full, a half-started or an already-stopped cluster alike and
never removes what existed before `up`. Without a recorded state it removes
only what carries the cluster's names or marker.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import sys
import subprocess
import time

from . import baseline, edge
from .containerd import ContainerdComponent
from .node import NodeComponent
from .nodes import Node
from .output import Phases, log, warn
from .runtime import Runtime
from .settings import SERVICE_IP, Settings


# ---------------------------------------------------------------- baseline
def record_baseline(settings: Settings) -> bool:
    """Record what the machine has before `up` changes anything; a complete record is never rewritten.
    True when recorded now."""
    d = settings.baseline_dir
    if baseline.keep_existing(read_baseline(settings)):
        return False
    os.makedirs(d, exist_ok=True)
    for name, content in baseline.render(baseline.record(settings, edge.observe(settings)), settings).items():
        with open(os.path.join(d, name), "w", encoding="utf-8") as fh:
            fh.write(content)
    with open(os.path.join(d, "complete"), "w", encoding="utf-8"):
        pass
    return True


def read_baseline(settings: Settings) -> baseline.Baseline | None:
    files = {}
    for name in baseline.FILES + ("complete",):
        text = edge.read_text(os.path.join(settings.baseline_dir, name))
        if text is not None:
            files[name] = text
    return baseline.parse(files) if files else None


# ---------------------------------------------------------------- carrying out a plan
def _quiet(argv: list[str]) -> bool:
    return subprocess.run(argv, capture_output=True, check=False).returncode == 0


def _lines(argv: list[str]) -> list[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False).stdout.splitlines()


def remove_chain(chain: baseline.Chain, loud: bool) -> None:
    """Remove the jumps to CHAIN, flush it, delete it."""
    t = [chain.tool, "-t", chain.table]
    jump = re.compile(r"^-A \S+ .*-j %s( |$)" % re.escape(chain.name))
    for line in _lines(t + ["-S"]):
        if jump.match(line):
            _quiet(t + ["-D"] + line.split()[1:])
    _quiet(t + ["-F", chain.name])
    if not _quiet(t + ["-X", chain.name]) and loud:
        warn("cannot delete %s %s chain %s" % (chain.tool, chain.table, chain.name))


def delete_netns(name: str, kill: bool) -> None:
    if kill:
        for pid in _lines(["ip", "netns", "pids", name]):
            _kill(pid)
    if not _quiet(["ip", "netns", "delete", name]):
        if not _quiet(["umount", "/run/netns/" + name]):
            _quiet(["umount", "-l", "/run/netns/" + name])
        _rm("/run/netns/" + name)


def unmount(paths: tuple[str, ...], roots: tuple[str, ...]) -> None:
    """Unmount PATHS (deepest first); what stays mounted below ROOTS gets two more tries."""
    for _attempt in range(3):
        for m in paths:
            if not _quiet(["umount", m]) and not _quiet(["umount", "-l", m]):
                warn("cannot unmount %s" % m)
        left = [m for m in edge.observe_mounts() if any(m == r or m.startswith(r + "/") for r in roots)]
        if not left:
            return
        paths = tuple(sorted(left, reverse=True))


def remove_cgroup(path: str) -> None:
    for dirpath, _dirs, _files in sorted(os.walk(path), key=lambda w: -w[0].count("/")):
        try:
            os.rmdir(dirpath)
        except OSError:
            pass
    if os.path.isdir(path):
        warn("cgroup %s could not be removed (processes left in it?)" % path)


def _kill(pid: str) -> bool:
    try:
        os.kill(int(pid), 9)
        return True
    except (OSError, ValueError):
        return False


def _rm(path: str) -> None:
    for p in glob.glob(path) if "*" in path else [path]:
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p, ignore_errors=True)
        else:
            try:
                os.unlink(p)
            except OSError:
                pass


def execute(settings: Settings, plan: baseline.TeardownPlan, sweep: bool) -> None:
    """The plan, in cluster.sh's order: namespaces, mounts, cgroups, links, chains, ip_forward, paths."""
    for w in plan.warnings:
        warn(w)
    for n in plan.netns:
        delete_netns(n, kill=sweep)
    unmount(plan.unmount, (settings.kubelet_dir,) if sweep else
            (settings.kubelet_dir, settings.state_dir, settings.run_dir, settings.sim_root))
    for c in plan.cgroups:
        remove_cgroup(c)
    for link in plan.links:
        _quiet(["ip", "link", "delete", link])
    if not sweep and " %s/32 " % SERVICE_IP in " ".join(_lines(["ip", "-4", "-o", "addr", "show", "dev", "lo"])):
        _quiet(["ip", "addr", "del", SERVICE_IP + "/32", "dev", "lo"])
    for chain in plan.chains:
        remove_chain(chain, loud=not sweep)
    if plan.ip_forward:
        with open("/proc/sys/net/ipv4/ip_forward", "w", encoding="ascii") as fh:
            fh.write(plan.ip_forward + "\n")
    for p in plan.paths:
        if p == settings.state_dir:
            continue
        if p == "/run/netns":
            # ip-netns makes /run/netns a shared bind mount of itself
            _quiet(["umount", p])
        _rm(p)


# ---------------------------------------------------------------- down
def drain(rt: Runtime, nodes: list[Node], comps: list[NodeComponent], b: baseline.Baseline | None) -> None:
    """Let the kubelets tear the pods down properly (CNI DEL, volume unmounts) while they and the apiserver
    still run: static pods by moving away the manifests `up` put there, the others by force deletion."""
    host, s = rt.host, rt.settings
    if not (any(host.running("kubelet-" + n.name) for n in nodes) and host.running("kube-apiserver")
            and os.path.isfile(s.admin_conf)):
        return
    log("removing pods (the kubelets tear down sandboxes, networks and volumes)")
    moved = s.state_dir + "/manifests-removed"
    os.makedirs(moved, exist_ok=True)
    before = b.etc_files if b else frozenset()
    if os.path.isdir(s.manifests):
        for name in sorted(os.listdir(s.manifests)):
            path = os.path.join(s.manifests, name)
            if os.path.isfile(path) and "./manifests/" + name not in before:
                shutil.move(path, os.path.join(moved, name))
    host.ok([*rt.kubectl(), "delete", "pods", "--all", "--all-namespaces", "--grace-period=0", "--force",
             "--wait=false"])
    deadline = time.monotonic() + 45
    ctrds = [c.parts().containerd for c in comps]
    while time.monotonic() < deadline and any(host.running(c.name) and c.containers(host) for c in ctrds):
        time.sleep(1)
    # the kubelet removes stopped sandboxes lazily; stopping them is enough


def node_components(rt: Runtime, nodes: list[Node]) -> list[NodeComponent]:
    from .component import Inputs  # pylint: disable=import-outside-toplevel

    return [NodeComponent(rt.settings, n, Inputs(), tools=rt.tools, nodes=tuple(nodes)) for n in nodes]


def down(rt: Runtime) -> None:
    s, host = rt.settings, rt.host
    if not os.path.isdir(s.state_dir):
        seen = edge.observe(s)
        if seen.etc_marker:
            warn("no %s but %s/.metax-gpu-cluster exists: removing the cluster's files there" % (s.state_dir, s.kube_etc))
        plan = baseline.plan_sweep(s, seen)
        execute(s, plan, sweep=True)
        if plan.netns or plan.links or plan.chains:
            warn("removed leftovers of a cluster that was not taken down (namespaces, links, chains named ours)")
        log("cluster is down (nothing recorded in %s)" % s.state_dir)
        return
    nodes = edge.recorded_nodes(s)
    comps = node_components(rt, nodes)
    b = read_baseline(s)
    phases = Phases()
    # make demo's Prometheus (scripts/demo_metrics.py) records itself here
    host.stop("demo-prometheus")
    phases.start("drain pods")
    host.stop("kube-controller-manager")  # no controller may recreate what is drained
    drain(rt, nodes, comps, b)
    phases.start("stop kubelets")
    for c in comps:
        c.stop_kubernetes(host)
    host.stop("kubelet")  # a cluster of the single-node generation
    phases.start("stop containers + containerd")
    for c in comps:
        ctrd: ContainerdComponent = c.parts().containerd
        if host.running(ctrd.name):
            ctrd.kill_containers(host)
    for name in ("kube-controller-manager", "kube-apiserver", "etcd"):
        host.stop(name)
    for c in comps:
        c.stop_runtime(host)
    for name in ("containerd", "registry", "registry-auth"):
        host.stop(name)
    phases.start("unmount + remove")
    plan = baseline.plan_down(s, b, edge.observe(s))
    execute(s, plan, sweep=False)
    # containerd 1.6 puts shim sockets under /run/containerd/s whatever its state dir
    if os.path.isdir("/run/containerd") and not (b and "/run/containerd" in b.existed):
        for dirpath, _dirs, _files in sorted(os.walk("/run/containerd"), key=lambda w: -w[0].count("/")):
            try:
                os.rmdir(dirpath)
            except OSError:
                pass
    # keep the last run's logs in the cache (not on the machine's paths)
    last = s.cache_dir + "/last-cluster-logs"
    if os.path.isdir(s.logs):
        shutil.rmtree(last, ignore_errors=True)
        os.makedirs(s.cache_dir, exist_ok=True)
        shutil.copytree(s.logs, last, symlinks=True, dirs_exist_ok=True)
    unmount(tuple(sorted((m for m in edge.observe_mounts() if m == s.state_dir or m.startswith(s.state_dir + "/")),
                         reverse=True)), (s.state_dir,))
    shutil.rmtree(s.state_dir, ignore_errors=True)
    report = phases.report("cluster down")
    if report:
        sys.stderr.write(report)
    log("cluster is down; logs of this run: %s" % last)
