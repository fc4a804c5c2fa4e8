# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The node plan: names, addresses, pod CIDRs; the same table `cluster.sh plan` prints."""

from __future__ import annotations

import ipaddress
import os
import subprocess

import pytest
from hypothesis import given, strategies as st

from localcluster import nodes
from localcluster.nodes import NodePaths, PlanError
from localcluster.settings import CLUSTER_NET, HOST_IP, POD_NET, Settings

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def test_three_nodes(three):
    assert [(n.index, n.name, n.preset, n.ip, n.pod_cidr, n.pod_gateway, n.netns, n.veth) for n in three] == [
        (1, "vm", "8xC500", "10.250.0.11", "10.244.0.0/24", "10.244.0.1", "metax-gpu-vm", "metax-v1"),
        (2, "vm-2", "4xN100", "10.250.0.12", "10.244.1.0/24", "10.244.1.1", "metax-gpu-vm-2", "metax-v2"),
        (3, "vm-3", "2xC550-sriov", "10.250.0.13", "10.244.2.0/24", "10.244.2.1", "metax-gpu-vm-3", "metax-v3")]
    assert [n.control_plane for n in three] == [True, False, False]


def test_first_name_renames_the_others():
    assert [n.name for n in nodes.plan(["a", "b"], "gpu")] == ["gpu", "gpu-2"]


def test_empty_and_too_many():
    with pytest.raises(PlanError, match="NODES is empty"):
        nodes.plan([], "vm")
    with pytest.raises(PlanError, match="addresses for 244"):
        nodes.plan(["8xC500"] * 245, "vm")
    assert nodes.plan(["8xC500"] * 244, "vm")[-1].ip == "10.250.0.254"
    with pytest.raises(PlanError):
        nodes.node_ip(0)


@given(st.integers(min_value=1, max_value=nodes.MAX_NODES))
def test_addresses_inside_their_networks(index):
    ip = ipaddress.IPv4Address(nodes.node_ip(index))
    cidr = ipaddress.IPv4Network(nodes.pod_cidr(index))
    assert ip in ipaddress.IPv4Network(CLUSTER_NET) and str(ip) != HOST_IP
    assert cidr.subnet_of(ipaddress.IPv4Network(POD_NET)) and cidr.prefixlen == 24
    assert ipaddress.IPv4Address(nodes.pod_gateway(index)) == cidr[1]


def test_addresses_and_cidrs_unique():
    plan = nodes.plan(["p"] * nodes.MAX_NODES, "vm")
    assert len({n.ip for n in plan}) == len({n.pod_cidr for n in plan}) == len({n.name for n in plan}) == len(plan)


def test_table_round_trip(three):
    text = nodes.render_table(three)
    assert text == "1 vm 8xC500\n2 vm-2 4xN100\n3 vm-3 2xC550-sriov\n"
    assert nodes.parse_table(text) == three
    assert nodes.parse_nodes_var("  8xC500\t4xN100 \n") == ["8xC500", "4xN100"]


def test_node_paths(three):
    p = NodePaths(Settings(), three[1])
    assert p.dir == "/var/lib/metax-gpu-cluster/nodes/vm-2"
    assert p.socket == "/run/metax-gpu-cluster/nodes/vm-2/containerd.sock"
    assert p.sim_dir == "/var/lib/metax-sim/vm-2"
    assert p.cgroup_root == "/metax-gpu-vm-2"
    assert p.kubelet_dir == "/var/lib/metax-gpu-cluster/nodes/vm-2/kubelet"


@pytest.mark.parametrize("presets, node_name", [("8xC500 4xN100 2xC550-sriov", ""), ("8xC500", ""),
                                                ("4xN100 4xN100 8xC500 2xC550-sriov", "gpu")])
def test_same_table_as_cluster_sh_plan(tmp_path, presets, node_name):
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "NODES": presets, "GO": "/bin/false",
           "METAX_CLUSTER_DIR": str(tmp_path / "state"), "METAX_CACHE_DIR": str(tmp_path / "cache")}
    if node_name:
        env["METAX_NODE_NAME"] = node_name
    bash = subprocess.run([os.path.join(REPO, "scripts", "cluster", "cluster.sh"), "plan"], env=env,
                          capture_output=True, text=True, timeout=60, check=True).stdout
    py = subprocess.run(["python3", "-m", "localcluster", "plan"], env=dict(env, PYTHONPATH=os.path.join(REPO, "tests")),
                        capture_output=True, text=True, timeout=60, check=True).stdout
    assert py == bash
    assert py.splitlines()[0].split()[1] == (node_name or "vm")


def test_plan_without_nodes_uses_the_recorded_table(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    (state / "node-table").write_text("1 gpu 4xN100\n2 gpu-2 8xC500\n")
    (state / "node-name").write_text("gpu\n")
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "METAX_CLUSTER_DIR": str(state),
           "PYTHONPATH": os.path.join(REPO, "tests")}
    out = subprocess.run(["python3", "-m", "localcluster", "plan"], env=env, capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out == "1 gpu 4xN100\n2 gpu-2 8xC500\n"
