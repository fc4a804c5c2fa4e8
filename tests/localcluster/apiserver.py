# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""kube-apiserver: every address (the INPUT chain guards it), advertised on the bridge.

Node,RBAC with NodeRestriction, the lease endpoint reconciler (the
``kubernetes`` service points at 10.250.0.1), kubelets reached at their
InternalIP with their serving certificates checked.
"""

from __future__ import annotations

from dataclasses import dataclass

from .component import FileSpec, Host, ProcessSpec
from .settings import HOST_IP, SERVICE_CIDR, Settings


def process(settings: Settings, binary: str) -> ProcessSpec:
    pki = settings.pki
    return ProcessSpec("kube-apiserver", (
        binary,
        "--bind-address=0.0.0.0", "--advertise-address=" + HOST_IP, "--secure-port=%d" % settings.apiserver_port,
        "--etcd-servers=http://127.0.0.1:%d" % settings.etcd_port,
        "--endpoint-reconciler-type=lease",
        "--service-cluster-ip-range=" + SERVICE_CIDR,
        "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
        "--allow-privileged=true",
        "--client-ca-file=%s/ca.crt" % pki,
        "--tls-cert-file=%s/apiserver.crt" % pki, "--tls-private-key-file=%s/apiserver.key" % pki,
        "--kubelet-client-certificate=%s/apiserver-kubelet-client.crt" % pki,
        "--kubelet-client-key=%s/apiserver-kubelet-client.key" % pki,
        "--kubelet-certificate-authority=%s/ca.crt" % pki,
        "--kubelet-preferred-address-types=InternalIP,Hostname",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        "--service-account-key-file=%s/sa.pub" % pki, "--service-account-signing-key-file=%s/sa.key" % pki,
        # the API server runs on the host, outside every node's kube-proxy: it reaches a webhook's or an
        # aggregated API's Service at its endpoints (pod IPs, routed to the nodes), not its ClusterIP,
        # which the host does not route (a connection there left the machine: the eviction guard's calls)
        "--enable-aggregator-routing=true",
        "--profiling=false", "--v=1"))


def readyz_url(settings: Settings) -> str:
    return settings.apiserver + "/readyz"


@dataclass(frozen=True)
class ApiserverComponent:
    """kube-apiserver from the Kubernetes build in KUBE_BIN; ready when /readyz answers the admin certificate."""

    settings: Settings
    kube_bin: str
    name: str = "kube-apiserver"

    def files(self) -> list[FileSpec]:
        return []  # all on its command line; its certificates are the PKI's

    def up(self, host: Host) -> None:
        host.start(process(self.settings, self.kube_bin + "/kube-apiserver"))

    def ready(self, host: Host) -> bool:
        pki = self.settings.pki
        return host.http_status(readyz_url(self.settings), cafile=pki + "/ca.crt",
                                cert=(pki + "/admin.crt", pki + "/admin.key")) == 200

    def down(self, host: Host) -> None:
        host.stop(self.name)
