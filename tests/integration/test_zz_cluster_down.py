# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""``cluster.sh down`` leaves nothing behind; then ``up`` brings the same nodes back.

Runs last in tests/integration (file name): it takes the cluster down and up
again (about 35 s warm), so the session ends with the cluster as it found it.
Skipped only while another test session on this machine uses the cluster.
"""

from __future__ import annotations

import glob
import os
import subprocess

import pytest

pytestmark = pytest.mark.cluster

from conftest import _other_live_leases  # noqa: E402

STATE = os.environ.get("METAX_CLUSTER_DIR", "/var/lib/metax-gpu-cluster")
RUN = os.environ.get("METAX_RUN_DIR", "/run/metax-gpu-cluster")
WATCHED_MOUNTS = ("/var/lib/kubelet", "/var/lib/metax-sim", STATE, RUN, "/run/containerd", "/etc/cdi", "/run/cdi")


def _cluster_pids(cluster):
    """Every process of the cluster: PID files plus everything in the nodes' network namespaces."""
    pids = set()
    for path in glob.glob(os.path.join(STATE, "pids", "*.pid")):
        with open(path) as handle:
            pids.add(int(handle.read().strip()))
    for node in cluster.nodes:
        out = subprocess.run(["ip", "netns", "pids", node["netns"]], capture_output=True, text=True, check=False)
        pids.update(int(p) for p in out.stdout.split())
    return pids


def _mounts():
    with open("/proc/self/mountinfo") as handle:
        points = [line.split()[4] for line in handle]
    return [m for m in points if any(m == w or m.startswith(w + "/") for w in WATCHED_MOUNTS)]


def _links():
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    names = [line.split(": ")[1].split("@")[0] for line in out.splitlines()]
    return [n for n in names if n.startswith(("metax-v", "metax-br", "metax-cni"))]


def _netns():
    return sorted(n for n in os.listdir("/run/netns") if n.startswith(("metax-gpu-", "cni-"))) \
        if os.path.isdir("/run/netns") else []


def _chains():
    found = []
    for table in ("filter", "nat"):
        out = subprocess.run(["iptables", "-t", table, "-S"], capture_output=True, text=True, check=False).stdout
        found += [line for line in out.splitlines() if "METAX-GPU-CLUSTER" in line]
    return found


def test_down_leaves_nothing_behind_and_up_restores(cluster):
    others = _other_live_leases()
    if others:
        pytest.skip("test sessions %s use the cluster: not taking it down under them" % others)
    assert len(cluster.nodes) >= 1
    nodes = " ".join(n["preset"] for n in cluster.nodes)
    pids = _cluster_pids(cluster)
    assert len(pids) >= 5 + 3 * len(cluster.nodes), pids
    res = cluster.cluster_sh("down")
    assert res.returncode == 0, res.stdout + res.stderr
    try:
        alive = sorted(p for p in pids if os.path.exists("/proc/%d" % p)
                       and open("/proc/%d/stat" % p).read().split()[2] != "Z")
        assert alive == [], "processes left: %s" % alive
        assert _mounts() == []
        assert _links() == []
        assert _netns() == []
        assert _chains() == []
        assert glob.glob("/sys/fs/cgroup/*/metax-gpu-*") == []
        assert not os.path.exists(STATE)
    finally:
        res = cluster.cluster_sh("up", env=dict(os.environ, NODES=nodes), timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
