# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The node plan: NODES presets -> index, name, preset, addresses, pod CIDR, paths.

Node i (1-based) is named ``vm`` (i == 1, or METAX_NODE_NAME) and
``vm-<i>`` after it, has the address 10.250.0.<10+i> on the cluster bridge and
the pod CIDR 10.244.<i-1>.0/24. The table is fixed at `up` in
``<state>/node-table`` ("INDEX NAME PRESET" lines).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Iterable, Sequence

from .settings import NETNS_PREFIX, VETH_PREFIX, Settings

# 10.250.0.0/24 holds the host (.1) and nodes .11 ... .254
MAX_NODES = 244
# 10.244.0.0/16 holds 256 /24 pod CIDRs; the address range is the tighter limit
POD_NET_BASE = ipaddress.IPv4Address("10.244.0.0")
NODE_NET_BASE = ipaddress.IPv4Address("10.250.0.10")


class PlanError(ValueError):
    """NODES cannot be planned (empty, or more nodes than addresses)."""


@dataclass(frozen=True)
class Node:
    index: int
    name: str
    preset: str

    @property
    def control_plane(self) -> bool:
        return self.index == 1

    @property
    def ip(self) -> str:
        return node_ip(self.index)

    @property
    def pod_cidr(self) -> str:
        return pod_cidr(self.index)

    @property
    def pod_gateway(self) -> str:
        return pod_gateway(self.index)

    @property
    def netns(self) -> str:
        return NETNS_PREFIX + self.name

    @property
    def veth(self) -> str:
        return VETH_PREFIX + str(self.index)


def node_ip(index: int) -> str:
    _check_index(index)
    return str(NODE_NET_BASE + index)


def pod_cidr(index: int) -> str:
    _check_index(index)
    return str(ipaddress.IPv4Network((int(POD_NET_BASE) + ((index - 1) << 8), 24)))


def pod_gateway(index: int) -> str:
    return str(ipaddress.IPv4Network(pod_cidr(index))[1])


def _check_index(index: int) -> None:
    if not 1 <= index <= MAX_NODES:
        raise PlanError("node index %d outside 1..%d (10.250.0.11 ... 10.250.0.254)" % (index, MAX_NODES))


def plan(presets: Sequence[str], first_name: str) -> list[Node]:
    """The node table NODES asks for: FIRST_NAME, then FIRST_NAME-2, ..."""
    if not presets:
        raise PlanError('NODES is empty: give one preset per node, e.g. NODES="8xC500 4xN100"')
    if len(presets) > MAX_NODES:
        raise PlanError("NODES names %d nodes; the cluster network has addresses for %d" % (len(presets), MAX_NODES))
    return [Node(i, first_name if i == 1 else "%s-%d" % (first_name, i), p)
            for i, p in enumerate(presets, start=1)]


def parse_nodes_var(nodes: str) -> list[str]:
    """NODES as bash splits it (any whitespace)."""
    return nodes.split()


def render_table(nodes: Iterable[Node]) -> str:
    """``cluster.sh plan`` output and the node-table file."""
    return "".join("%d %s %s\n" % (n.index, n.name, n.preset) for n in nodes)


def parse_table(text: str) -> list[Node]:
    nodes = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 3:
            nodes.append(Node(int(fields[0]), fields[1], fields[2]))
    return nodes


@dataclass(frozen=True)
class NodePaths:
    """Where a node's files live on the host (cluster.sh's node_dir, node_run, ...)."""

    settings: Settings
    node: Node

    @property
    def dir(self) -> str:
        return "%s/nodes/%s" % (self.settings.state_dir, self.node.name)

    @property
    def run(self) -> str:
        return "%s/nodes/%s" % (self.settings.run_dir, self.node.name)

    @property
    def sim_dir(self) -> str:
        return "%s/%s" % (self.settings.sim_parent, self.node.name)

    @property
    def socket(self) -> str:
        return self.run + "/containerd.sock"

    @property
    def kubelet_dir(self) -> str:
        return self.dir + "/kubelet"

    @property
    def cgroup_root(self) -> str:
        return "/" + self.settings.cgroup_prefix + self.node.name

    @property
    def cni_dir(self) -> str:
        return self.dir + "/cni"
