# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""A node's kube-proxy (iptables mode) in its network namespace.

Service ClusterIPs work from pods and hostNetwork pods on every node.
masqueradeAll: br_netfilter is not loaded on these VMs, so a reply between
two pods of one bridge would bypass the un-DNAT. Its config file is written
only when the content changes: kube-proxy exits when the file is written to.
"""

from __future__ import annotations

from dataclasses import dataclass

from .component import FileSpec, Host, ProcessSpec, Write
from .nodes import Node, NodePaths
from .settings import KUBE_PROXY_HEALTHZ_PORT, KUBE_PROXY_METRICS, POD_NET, Settings


def render(kubeconfig: str, node: str, ip: str) -> str:
    return ("apiVersion: kubeproxy.config.k8s.io/v1alpha1\n"
            "kind: KubeProxyConfiguration\n"
            "clientConnection:\n"
            "  kubeconfig: %s\n"
            "mode: iptables\n"
            "hostnameOverride: %s\n"
            "clusterCIDR: %s\n"
            "bindAddress: %s\n"
            "healthzBindAddress: %s:%d\n"
            "metricsBindAddress: %s\n"
            'nodePortAddresses: ["primary"]\n'
            "iptables:\n"
            "  masqueradeAll: true\n"
            "# conntrack sysctls are left as the kernel has them (per-namespace limits)\n"
            "conntrack:\n"
            "  maxPerCore: 0\n"
            "  min: 0\n"
            "  tcpEstablishedTimeout: 0s\n"
            "  tcpCloseWaitTimeout: 0s\n"
            "# root cannot lower oom_score_adj on these machines\n"
            "oomScoreAdj: 0\n") % (kubeconfig, node, POD_NET, ip, ip, KUBE_PROXY_HEALTHZ_PORT, KUBE_PROXY_METRICS)


def config_file(settings: Settings, node: Node) -> FileSpec:
    return FileSpec(NodePaths(settings, node).dir + "/kube-proxy.yaml",
                    render(settings.state_dir + "/kube-proxy.conf", node.name, node.ip), write=Write.IF_CHANGED)


def process(settings: Settings, node: Node, binary: str, holder_pid: int) -> ProcessSpec:
    path = NodePaths(settings, node).dir + "/kube-proxy.yaml"
    return ProcessSpec("kube-proxy-" + node.name, (binary, "--config=" + path, "--v=1"),
                       wrap=("nsenter", "-t", str(holder_pid), "-m", "-n", "--"), config_files=(path,))


def healthz_url(node: Node) -> str:
    return "http://%s:%d/healthz" % (node.ip, KUBE_PROXY_HEALTHZ_PORT)


@dataclass(frozen=True)
class KubeProxyComponent:
    """One node's kube-proxy, inside the node's namespaces."""

    settings: Settings
    node: Node
    kube_bin: str

    @property
    def name(self) -> str:
        return "kube-proxy-" + self.node.name

    def files(self) -> list[FileSpec]:
        return [config_file(self.settings, self.node)]

    def up(self, host: Host) -> None:
        for f in self.files():
            host.write(f)
        host.start(process(self.settings, self.node, self.kube_bin + "/kube-proxy",
                           host.pid("ns-" + self.node.name)))

    def ready(self, host: Host) -> bool:
        return host.http_status(healthz_url(self.node)) == 200

    def down(self, host: Host) -> None:
        host.stop(self.name)
