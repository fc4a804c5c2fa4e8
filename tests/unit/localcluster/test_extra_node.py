# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The temporary node of a test (extra_node.py): where it goes, what it writes, what its removal deletes."""

from __future__ import annotations

import subprocess
import tomllib

import pytest

from localcluster import extra_node, nodes as nodes_mod
from localcluster.component import FileSpec
from localcluster.envfile import Tools
from localcluster.host import LocalHost
from localcluster.nodes import Node, NodePaths, PlanError
from localcluster.runtime import Runtime


def test_the_next_node_after_the_table(three):
    node = extra_node.plan_extra(three, "4xN100")
    assert (node.index, node.name, node.preset, node.ip, node.pod_cidr, node.netns, node.veth) == (
        4, "vm-4", "4xN100", "10.250.0.14", "10.244.3.0/24", "metax-gpu-vm-4", "metax-v4")
    assert not node.control_plane
    # after a gap in the table, and named after the control-plane node
    table = [Node(1, "gpu", "8xC500"), Node(5, "gpu-5", "4xN100")]
    assert extra_node.plan_extra(table, "2xC550").name == "gpu-6"


def test_no_table_no_name_clash_no_address_left():
    with pytest.raises(PlanError, match="not up"):
        extra_node.plan_extra([], "4xN100")
    with pytest.raises(PlanError, match="taken"):
        extra_node.plan_extra([Node(1, "vm", "8xC500"), Node(2, "vm-3", "4xN100")], "4xN100")
    with pytest.raises(PlanError):
        extra_node.plan_extra(nodes_mod.plan(["8xC500"] * 244, "vm"), "4xN100")


def test_removal_deletes_only_its_own_files(settings, three):
    node = extra_node.plan_extra(three, "4xN100")
    files = extra_node.own_files(settings, node)
    p = NodePaths(settings, node)
    assert files[:3] == [p.dir, p.run, p.sim_dir]
    assert sorted(f.rsplit("/", 1)[1] for f in files[3:]) == [
        "kubelet-client-vm-4.crt", "kubelet-client-vm-4.key", "kubelet-vm-4.crt", "kubelet-vm-4.key"]
    # none of the cluster's own: the CA, the shared certificates, the table's nodes' files
    for other in three:
        theirs = NodePaths(settings, other)
        assert not any(other.name + "." in f or f in (theirs.dir, theirs.run, theirs.sim_dir)
                       or f.startswith(theirs.dir + "/") for f in files)
    assert not any(f.endswith(("/ca.crt", "/ca.key", "/admin.crt", "/kube-proxy.key")) for f in files)


def test_the_node_runs_debians_containerd_with_the_version_2_config(settings, three, inputs, tmp_path):
    LocalHost(settings.pids, settings.logs).write(
        FileSpec(settings.state_dir + "/node-table", nodes_mod.render_table(three)))
    tools = Tools("/kube/bin", "/cache/containerd/v2.4.2/bin", "/helm", "/plugins", "/c.conf", "/r.conf")
    rt = Runtime(settings, tools, {})
    node = extra_node.plan_extra(three, "4xN100")
    inputs.certs.update({"kubelet-client-vm-4": (b"C", b"K"), "kubelet-vm-4": (b"C", b"K")})
    comp = extra_node.component(rt, node, inputs, extra_node.DEBIAN_CONTAINERD_BIN, 2)
    assert comp.parts().containerd.bin_dir == "/usr/bin"
    assert [n.name for n in comp.nodes] == ["vm", "vm-2", "vm-3", "vm-4"]
    # routes from it to every other node's pod CIDR, and the host's to its own
    routes = comp.parts().network.routes()
    assert {r.dest for r in routes} == {"10.244.0.0/24", "10.244.1.0/24", "10.244.2.0/24", "10.244.3.0/24"}
    config = next(f for f in comp.files() if f.path.endswith("/containerd/config.toml"))
    path = tmp_path / "config.toml"
    path.write_text(config.content)
    # Debian's containerd 1.6 itself reads it: the CRI plugin section of version 2, no CDI
    proc = subprocess.run(["/usr/bin/containerd", "--config", str(path), "config", "dump"], capture_output=True,
                          text=True, check=True)
    assert "level=warning" not in proc.stderr
    cri = tomllib.loads(proc.stdout)["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["containerd"]["default_runtime_name"] == "runc"
    assert not cri.get("enable_cdi")
