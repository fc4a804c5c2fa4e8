# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""A GPU node: network namespace, cgroups, mount namespace, containerd, kubelet, kube-proxy, simulated root.

Each node is a namespace pair (what kind's node containers solve): its own
network namespace on the cluster bridge, and a mount namespace where its own
directories are bind-mounted at the standard paths, so one DaemonSet spec
resolves hostPaths to each node's own device-plugin dir, pod-resources socket
and simulated root. ``NodeComponent.files()`` is everything it writes.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import containerd, kube_proxy, kubelet, network
from .component import FileSpec, Host, Inputs, ProcessSpec
from .nodes import Node, NodePaths
from .settings import CLUSTER_BRIDGE, HOST_IP, Settings


def bind_mounts(settings: Settings, node: Node) -> list[tuple[str, str]]:
    """(source on the host, target inside the node's mount namespace)."""
    p = NodePaths(settings, node)
    return [(p.kubelet_dir, settings.kubelet_dir), (p.sim_dir, settings.sim_root),
            (p.dir + "/cni-cache", "/var/lib/cni"), (p.run + "/containerd", "/run/containerd"),
            (p.dir + "/cdi-etc", "/etc/cdi"), (p.run + "/cdi", "/run/cdi")]


def host_bind_mounts(settings: Settings, first: Node) -> list[tuple[str, str]]:
    """The first node's kubelet dir and simulated root also at the standard paths on the host."""
    p = NodePaths(settings, first)
    return [(p.kubelet_dir, settings.kubelet_dir), (p.sim_dir, settings.sim_root)]


def holder_process(node: Node) -> ProcessSpec:
    """The namespace holder: a `sleep infinity` in the node's network namespace and a new mount namespace
    (slave: the host's later mounts show inside, the node's stay there); everything else of the node
    enters its namespaces through this process (nsenter -t PID)."""
    return ProcessSpec("ns-" + node.name, ("/usr/bin/sleep", "infinity"),
                       wrap=("nsenter", "--net=/run/netns/" + node.netns, "unshare", "--mount", "--propagation",
                             "slave", "--"))


def cgroup_dirs(settings: Settings, node: Node, hierarchies: list[str]) -> list[str]:
    """The node's cgroupRoot in every hierarchy (the kubelet wants it in each)."""
    return ["%s/%s%s" % (h.rstrip("/"), settings.cgroup_prefix, node.name) for h in hierarchies]


def sim_create_argv(python: str, preset: str, directory: str) -> list[str]:
    return [python, "-m", "ansible_collections.metax.gpu.plugins.module_utils.sim", "create", "--force",
            "--preset", preset, directory]


@dataclass(frozen=True)
class NodeComponent:
    settings: Settings
    node: Node
    inputs: Inputs
    containerd_config_version: int = 3

    @property
    def name(self) -> str:
        return "node " + self.node.name

    def files(self) -> list[FileSpec]:
        c = containerd.config_for(self.settings, self.node, self.inputs.runc, self.inputs.registry_password,
                                  self.containerd_config_version)
        return [network.cni_file(self.settings, self.node),
                containerd.config_file(self.settings, self.node, c),
                kubelet.config_file(self.settings, self.node),
                kube_proxy.config_file(self.settings, self.node),
                FileSpec(NodePaths(self.settings, self.node).dir + "/sim-preset", self.node.preset + "\n")]


@dataclass(frozen=True)
class NodeNetworkComponent:
    """A node's network: its namespace on the cluster bridge (veth, address, default route via the host),
    the pod CIDR routes (its own from the host, the others' from it) and its CNI config."""

    settings: Settings
    node: Node
    nodes: tuple[Node, ...]  # every node: the routes to the others' pod CIDRs

    @property
    def name(self) -> str:
        return "network of " + self.node.name

    def files(self) -> list[FileSpec]:
        return [network.cni_file(self.settings, self.node)]

    def routes(self) -> list[network.Route]:
        return [r for r in network.routes(self.nodes)
                if r.netns == self.node.netns or (not r.netns and r.dest == self.node.pod_cidr)]

    def up(self, host: Host) -> None:
        n, ns = self.node, self.node.netns
        host.mkdir(NodePaths(self.settings, n).cni_dir + "/ipam")
        for f in self.files():
            host.write(f)
        if not host.ok(["test", "-e", "/run/netns/" + ns]):
            host.run(["ip", "netns", "add", ns])
        if not host.ok(["ip", "link", "show", n.veth]):
            host.run(["ip", "link", "add", n.veth, "type", "veth", "peer", "name", "eth0", "netns", ns])
            host.run(["ip", "link", "set", n.veth, "master", CLUSTER_BRIDGE, "up"])
            host.run(["ip", "-n", ns, "addr", "add", n.ip + "/24", "dev", "eth0"])
            host.run(["ip", "-n", ns, "link", "set", "eth0", "up"])
            host.run(["ip", "-n", ns, "link", "set", "lo", "up"])
        host.run(["ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.ip_forward=1"])
        host.run(["ip", "-n", ns, "route", "replace", "default", "via", HOST_IP])
        for r in self.routes():
            host.run(r.argv())

    def ready(self, host: Host) -> bool:
        """The node's address, and each of its routes as planned."""
        ns = self.node.netns
        if not host.ok(["ip", "-n", ns, "addr", "show", "dev", "eth0"]):
            return False
        if " %s/24 " % self.node.ip not in host.run(["ip", "-n", ns, "-4", "-o", "addr", "show", "dev", "eth0"]):
            return False
        for r in self.routes():
            show = (["ip", "-n", r.netns] if r.netns else ["ip"]) + ["route", "show", r.dest]
            if host.run(show).split() != [r.dest, "via", r.via, "dev", r.dev]:
                return False
        return True

    def down(self, host: Host) -> None:
        """Deleting the namespace takes its end of the veth and with it ours; the host's route goes with it."""
        host.ok(["ip", "netns", "delete", self.node.netns])
        host.ok(["ip", "link", "delete", self.node.veth])
        host.ok(["ip", "route", "del", self.node.pod_cidr])
