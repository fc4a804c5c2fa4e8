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
from .component import FileSpec, Inputs, ProcessSpec
from .nodes import Node, NodePaths
from .settings import Settings


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
