# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""A node's kubelet: its KubeletConfiguration and command line.

Listens on its node's IP (serving port and healthz), read-only port off,
webhook authn/authz, serving certificate from the cluster CA, cgroupfs with
its own cgroupRoot (two kubelets on one root remove each other's pod cgroups),
no swap or cgroup v1 failures (these VMs), pod logs under the cluster state;
the control-plane node runs the static pods of the manifests dir.
"""

from __future__ import annotations

from dataclasses import dataclass

from .component import FileSpec, Host, ProcessSpec
from .nodes import Node, NodePaths
from .settings import KUBELET_HEALTHZ_PORT, MARKER_NAME, Settings


@dataclass(frozen=True)
class KubeletConfig:
    node: str
    ip: str
    port: int
    healthz_port: int
    pki: str
    cgroup_root: str
    socket: str
    static_pod_path: str  # "" = none (only the control-plane node has one)
    pod_logs_dir: str
    pod_cidr: str
    kubeconfig: str
    root_dir: str


def config_for(settings: Settings, node: Node) -> KubeletConfig:
    p = NodePaths(settings, node)
    return KubeletConfig(
        node=node.name, ip=node.ip, port=settings.kubelet_port, healthz_port=KUBELET_HEALTHZ_PORT, pki=settings.pki,
        cgroup_root=p.cgroup_root, socket=p.socket,
        static_pod_path=settings.manifests if node.control_plane else "", pod_logs_dir=p.dir + "/pod-logs",
        pod_cidr=node.pod_cidr, kubeconfig=p.dir + "/kubelet.conf", root_dir=settings.kubelet_dir)


def render(c: KubeletConfig) -> str:
    # cluster.sh leaves an empty line where a node without static pods has none
    static = "staticPodPath: " + c.static_pod_path if c.static_pod_path else ""
    return ("apiVersion: kubelet.config.k8s.io/v1beta1\n"
            "kind: KubeletConfiguration\n"
            "address: %(ip)s\n"
            "port: %(port)d\n"
            "readOnlyPort: 0\n"
            "healthzBindAddress: %(ip)s\n"
            "healthzPort: %(healthz)d\n"
            "authentication:\n"
            "  anonymous:\n"
            "    enabled: false\n"
            "  webhook:\n"
            "    enabled: true\n"
            "  x509:\n"
            "    clientCAFile: %(pki)s/ca.crt\n"
            "authorization:\n"
            "  mode: Webhook\n"
            "tlsCertFile: %(pki)s/kubelet-%(node)s.crt\n"
            "tlsPrivateKeyFile: %(pki)s/kubelet-%(node)s.key\n"
            "rotateCertificates: false\n"
            "serverTLSBootstrap: false\n"
            "cgroupDriver: cgroupfs\n"
            "cgroupRoot: %(cgroup)s\n"
            "failCgroupV1: false\n"
            "failSwapOn: false\n"
            "containerRuntimeEndpoint: unix://%(sock)s\n"
            "imageServiceEndpoint: unix://%(sock)s\n"
            "%(static)s\n"
            "podLogsDir: %(logs)s\n"
            "podCIDR: %(cidr)s\n"
            "clusterDomain: cluster.local\n"
            "resolvConf: /etc/resolv.conf\n"
            "maxPods: 110\n"
            "evictionHard:\n"
            "  memory.available: 100Mi\n"
            "  nodefs.available: 1%%\n"
            "  nodefs.inodesFree: 1%%\n"
            "  imagefs.available: 1%%\n"
            "imageGCHighThresholdPercent: 99\n"
            "imageGCLowThresholdPercent: 98\n"
            "syncFrequency: 10s\n"
            "fileCheckFrequency: 5s\n"
            "nodeStatusReportFrequency: 10s\n"
            "# Allocatable changes (a GPU turning unhealthy) reach the Node object at the\n"
            "# next status update; 1s keeps that within gpu-device's healthyInterval + 2s.\n"
            "nodeStatusUpdateFrequency: 1s\n") % dict(
                ip=c.ip, port=c.port, healthz=c.healthz_port, pki=c.pki, node=c.node, cgroup=c.cgroup_root,
                sock=c.socket, static=static, logs=c.pod_logs_dir, cidr=c.pod_cidr)


def config_file(settings: Settings, node: Node) -> FileSpec:
    return FileSpec(NodePaths(settings, node).dir + "/kubelet-config.yaml", render(config_for(settings, node)))


def process(settings: Settings, node: Node, binary: str, holder_pid: int) -> ProcessSpec:
    c = config_for(settings, node)
    path = NodePaths(settings, node).dir + "/kubelet-config.yaml"
    return ProcessSpec("kubelet-" + node.name,
                       (binary, "--config=" + path, "--kubeconfig=" + c.kubeconfig, "--hostname-override=" + node.name,
                        "--node-ip=" + node.ip, "--root-dir=" + c.root_dir, "--v=1"),
                       wrap=("nsenter", "-t", str(holder_pid), "-m", "-n", "--"), config_files=(path,))


def healthz_url(node: Node) -> str:
    return "http://%s:%d/healthz" % (node.ip, KUBELET_HEALTHZ_PORT)


@dataclass(frozen=True)
class KubeletComponent:
    """One node's kubelet, inside the node's namespaces (entered through its holder, `ns-<node>`)."""

    settings: Settings
    node: Node
    kube_bin: str

    @property
    def name(self) -> str:
        return "kubelet-" + self.node.name

    def files(self) -> list[FileSpec]:
        d = NodePaths(self.settings, self.node).dir
        # the marker: `down` without a state removes /var/lib/kubelet only when it is the cluster's
        return [config_file(self.settings, self.node), FileSpec("%s/kubelet/%s" % (d, MARKER_NAME), "")]

    def up(self, host: Host) -> None:
        host.mkdir(NodePaths(self.settings, self.node).dir + "/pod-logs")
        for f in self.files():
            host.write(f)
        host.start(process(self.settings, self.node, self.kube_bin + "/kubelet", host.pid("ns-" + self.node.name)))

    def ready(self, host: Host) -> bool:
        return host.http_status(healthz_url(self.node)) == 200

    def down(self, host: Host) -> None:
        host.stop(self.name)
