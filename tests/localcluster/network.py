# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The network: the cluster bridge, per-node veth, routes and CNI config, the iptables chains.

The host holds the bridge metax-br0 (10.250.0.1); every node is a network
namespace joined to it by a veth pair, with its own pod bridge and pod CIDR;
the host and every node route each pod CIDR to its node. The apiserver and
registries listen on every address and the INPUT chain drops their ports on
every interface but lo and the bridge; nothing is forwarded between the
bridge and other interfaces; the host reaches the service IP by DNAT.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .component import FileSpec, Host
from .nodes import Node, NodePaths
from .settings import CHAIN, CHAIN_FWD, CHAIN_IN, CLUSTER_BRIDGE, CNI_NAME, HOST_IP, POD_BRIDGE, SERVICE_IP, Settings


def cni_conflist(ipam_dir: str, subnet: str, gateway: str) -> str:
    """The node's bridge CNI network (host-local IPAM on its pod CIDR, no masquerading)."""
    return ('{\n'
            '  "cniVersion": "0.4.0",\n'
            '  "name": "%s",\n'
            '  "plugins": [\n'
            '    {\n'
            '      "type": "bridge",\n'
            '      "bridge": "%s",\n'
            '      "isGateway": true,\n'
            '      "isDefaultGateway": true,\n'
            '      "ipMasq": false,\n'
            '      "hairpinMode": true,\n'
            '      "ipam": {\n'
            '        "type": "host-local",\n'
            '        "dataDir": "%s",\n'
            '        "ranges": [[{"subnet": "%s", "gateway": "%s"}]]\n'
            '      }\n'
            '    }\n'
            '  ]\n'
            '}\n') % (CNI_NAME, POD_BRIDGE, ipam_dir, subnet, gateway)


def cni_file(settings: Settings, node: Node) -> FileSpec:
    d = NodePaths(settings, node).cni_dir
    content = cni_conflist(d + "/ipam", node.pod_cidr, node.pod_gateway)
    return FileSpec("%s/net.d/10-%s.conflist" % (d, CNI_NAME), content)


@dataclass(frozen=True)
class Route:
    netns: str  # "" = the host
    dest: str
    via: str
    dev: str

    def argv(self) -> list[str]:
        prefix = ["ip", "-n", self.netns] if self.netns else ["ip"]
        return prefix + ["route", "replace", self.dest, "via", self.via, "dev", self.dev]


def routes(nodes: Sequence[Node]) -> list[Route]:
    """Each pod CIDR to its node: on the host (over the bridge) and in every other node (over its eth0)."""
    out = []
    for node in nodes:
        out.append(Route("", node.pod_cidr, node.ip, CLUSTER_BRIDGE))
        out.extend(Route(node.netns, other.pod_cidr, other.ip, "eth0") for other in nodes if other != node)
    return out


@dataclass(frozen=True)
class Chain:
    """One of our iptables chains: its table, the built-in chain that jumps to it, its rules."""

    table: str
    name: str
    hook: str
    rules: tuple[tuple[str, ...], ...]


def chains(settings: Settings) -> list[Chain]:
    """Our three chains. Rules in the canonical form `iptables -S` prints (the same rules `iptables -A` takes)."""
    ports = "%d,%d,%d" % (settings.apiserver_port, settings.registry_port, settings.registry_auth_port)
    return [
        Chain("nat", CHAIN, "OUTPUT", (
            ("-d", SERVICE_IP + "/32", "-p", "tcp", "-m", "tcp", "--dport", "443", "-j", "DNAT", "--to-destination",
             "127.0.0.1:%d" % settings.apiserver_port),)),
        Chain("filter", CHAIN_FWD, "FORWARD", (
            ("-i", CLUSTER_BRIDGE, "!", "-o", CLUSTER_BRIDGE, "-j", "DROP"),
            ("!", "-i", CLUSTER_BRIDGE, "-o", CLUSTER_BRIDGE, "-j", "DROP"))),
        Chain("filter", CHAIN_IN, "INPUT", (
            ("-i", "lo", "-j", "RETURN"),
            ("-i", CLUSTER_BRIDGE, "-j", "RETURN"),
            ("-p", "tcp", "-m", "multiport", "--dports", ports, "-j", "DROP"))),
    ]


def listed(chain: Chain) -> list[str]:
    """The chain as `iptables -t TABLE -S NAME` prints it."""
    return ["-N " + chain.name] + ["-A %s %s" % (chain.name, " ".join(rule)) for rule in chain.rules]


@dataclass(frozen=True)
class NetworkComponent:
    """The host's side: the cluster bridge, the service IP on lo, our three iptables chains and their jumps.
    Per-node namespaces, veths and routes are the node's."""

    settings: Settings
    name: str = "network"

    def files(self) -> list[FileSpec]:
        return []

    def up(self, host: Host) -> None:
        if not host.ok(["ip", "link", "show", CLUSTER_BRIDGE]):
            host.run(["ip", "link", "add", CLUSTER_BRIDGE, "type", "bridge"])
            host.run(["ip", "addr", "add", HOST_IP + "/24", "dev", CLUSTER_BRIDGE])
            host.run(["ip", "link", "set", CLUSTER_BRIDGE, "up"])
        # the host, as a client, also uses the service IP (DNAT to the apiserver)
        if " %s/32 " % SERVICE_IP not in host.run(["ip", "-4", "-o", "addr", "show", "dev", "lo"]):
            host.run(["ip", "addr", "add", SERVICE_IP + "/32", "dev", "lo"])
        for chain in chains(self.settings):
            t = ["iptables", "-t", chain.table]
            host.ok(t + ["-N", chain.name])  # exists already on a second up
            host.run(t + ["-F", chain.name])
            for rule in chain.rules:
                host.run(t + ["-A", chain.name, *rule])
            if not host.ok(t + ["-C", chain.hook, "-j", chain.name]):
                host.run(t + ["-I", chain.hook, "-j", chain.name])

    def ready(self, host: Host) -> bool:
        """The bridge, and each chain exactly as planned with its jump."""
        if not host.ok(["ip", "link", "show", CLUSTER_BRIDGE]):
            return False
        for c in chains(self.settings):
            t = ["iptables", "-t", c.table]
            if not host.ok(t + ["-S", c.name]) or host.run(t + ["-S", c.name]).splitlines() != listed(c):
                return False
            if not host.ok(t + ["-C", c.hook, "-j", c.name]):
                return False
        return True

    def down(self, host: Host) -> None:
        for chain in chains(self.settings):
            t = ["iptables", "-t", chain.table]
            while host.ok(t + ["-D", chain.hook, "-j", chain.name]):
                pass
            host.ok(t + ["-F", chain.name])
            host.ok(t + ["-X", chain.name])
        if host.ok(["ip", "link", "show", CLUSTER_BRIDGE]):
            host.run(["ip", "link", "delete", CLUSTER_BRIDGE])
        if " %s/32 " % SERVICE_IP in host.run(["ip", "-4", "-o", "addr", "show", "dev", "lo"]):
            host.run(["ip", "addr", "del", SERVICE_IP + "/32", "dev", "lo"])
