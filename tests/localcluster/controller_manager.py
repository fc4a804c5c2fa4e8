# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""kube-controller-manager on loopback, signing with the cluster CA, no leader election."""

from __future__ import annotations

from dataclasses import dataclass

from .component import FileSpec, Host, ProcessSpec
from .settings import KCM_PORT, Settings


def process(settings: Settings, binary: str) -> ProcessSpec:
    pki, conf = settings.pki, settings.kube_etc + "/controller-manager.conf"
    return ProcessSpec("kube-controller-manager", (
        binary,
        "--kubeconfig=" + conf, "--authentication-kubeconfig=" + conf, "--authorization-kubeconfig=" + conf,
        "--bind-address=127.0.0.1", "--secure-port=%d" % KCM_PORT, "--cert-dir=%s/kcm-certs" % settings.state_dir,
        "--client-ca-file=%s/ca.crt" % pki, "--root-ca-file=%s/ca.crt" % pki,
        "--cluster-signing-cert-file=%s/ca.crt" % pki, "--cluster-signing-key-file=%s/ca.key" % pki,
        "--service-account-private-key-file=%s/sa.key" % pki, "--use-service-account-credentials=true",
        "--controllers=*,bootstrapsigner,tokencleaner", "--leader-elect=false",
        "--profiling=false", "--v=1"))


def healthz_url() -> str:
    return "https://127.0.0.1:%d/healthz" % KCM_PORT


@dataclass(frozen=True)
class ControllerManagerComponent:
    """kube-controller-manager; ready when /healthz answers (its serving certificate is self-signed)."""

    settings: Settings
    kube_bin: str
    name: str = "kube-controller-manager"

    def files(self) -> list[FileSpec]:
        return []

    def up(self, host: Host) -> None:
        host.mkdir(self.settings.state_dir + "/kcm-certs")
        host.start(process(self.settings, self.kube_bin + "/kube-controller-manager"))

    def ready(self, host: Host) -> bool:
        return host.http_status(healthz_url(), insecure=True) == 200

    def down(self, host: Host) -> None:
        host.stop(self.name)
