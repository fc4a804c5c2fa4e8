# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The PKI plan: which certificates the cluster has, their subjects, usages and SANs.

One CA (EC P-256, CN=kubernetes); every certificate EC P-256 signed by it,
valid 3650 days; the service-account key pair is RSA 2048. The commands are
openssl's, as argv lists (run at the edge); a certificate or key that exists
is never remade.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Sequence

from . import kubeconfig
from .component import FileSpec, Host, Inputs
from .nodes import Node
from .settings import HOST_IP, MARKER_NAME, SERVICE_IP, Settings

DAYS = 3650


class Usage(enum.Enum):
    SERVER = "serverAuth"
    CLIENT = "clientAuth"
    BOTH = "serverAuth,clientAuth"


@dataclass(frozen=True)
class CertSpec:
    name: str  # <pki>/<name>.crt and .key
    cn: str
    org: str
    usage: Usage
    sans: tuple[str, ...] = ()

    @property
    def subject(self) -> str:
        """openssl -subj (O before CN, as cluster.sh writes it)."""
        return ("/O=%s" % self.org if self.org else "") + "/CN=" + self.cn

    def extfile(self) -> str:
        """The x509 extension file `openssl x509 -req -extfile` gets."""
        lines = ["basicConstraints=critical,CA:FALSE",
                 "keyUsage=critical,digitalSignature,keyEncipherment",
                 "extendedKeyUsage=" + self.usage.value]
        if self.sans:
            lines.append("subjectAltName=" + ",".join(self.sans))
        return "\n".join(lines) + "\n"

    def commands(self, pki: str, extfile: str) -> list[list[str]]:
        """Key, CSR and signed certificate (the CSR and EXTFILE are removed afterwards)."""
        key, csr, crt = ("%s/%s.%s" % (pki, self.name, ext) for ext in ("key", "csr", "crt"))
        return [
            ["openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", key],
            ["openssl", "req", "-new", "-key", key, "-subj", self.subject, "-out", csr],
            ["openssl", "x509", "-req", "-in", csr, "-CA", pki + "/ca.crt", "-CAkey", pki + "/ca.key",
             "-CAcreateserial", "-days", str(DAYS), "-extfile", extfile, "-out", crt],
        ]


def apiserver_sans() -> tuple[str, ...]:
    """The apiserver's names: the service's DNS names, loopback, the service IP and the bridge address."""
    return ("DNS:kubernetes", "DNS:kubernetes.default", "DNS:kubernetes.default.svc",
            "DNS:kubernetes.default.svc.cluster.local", "DNS:localhost",
            "IP:127.0.0.1", "IP:" + SERVICE_IP, "IP:" + HOST_IP)


def kubelet_serving_sans(node: Node) -> tuple[str, ...]:
    """A kubelet's serving names: the apiserver reaches it at its InternalIP and checks this."""
    return ("DNS:" + node.name, "DNS:localhost", "IP:127.0.0.1", "IP:" + node.ip)


def plan(nodes: Sequence[Node]) -> list[CertSpec]:
    """Every leaf certificate, in the order cluster.sh makes them."""
    certs = [
        CertSpec("apiserver", "kube-apiserver", "", Usage.SERVER, apiserver_sans()),
        CertSpec("apiserver-kubelet-client", "kube-apiserver-kubelet-client", "system:masters", Usage.CLIENT),
        CertSpec("admin", "kubernetes-admin", "system:masters", Usage.CLIENT),
        CertSpec("controller-manager", "system:kube-controller-manager", "", Usage.CLIENT),
        CertSpec("scheduler", "system:kube-scheduler", "", Usage.CLIENT),
        # bound to system:node-proxier by the default RBAC policy
        CertSpec("kube-proxy", "system:kube-proxy", "", Usage.CLIENT),
    ]
    for node in nodes:
        certs.append(CertSpec("kubelet-client-" + node.name, "system:node:" + node.name, "system:nodes",
                              Usage.CLIENT))
        certs.append(CertSpec("kubelet-" + node.name, node.name, "", Usage.SERVER, kubelet_serving_sans(node)))
    return certs


def ca_commands(pki: str) -> list[list[str]]:
    return [
        ["openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", pki + "/ca.key"],
        ["openssl", "req", "-x509", "-new", "-key", pki + "/ca.key", "-subj", "/CN=kubernetes", "-days", str(DAYS),
         "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature", "-out", pki + "/ca.crt"],
    ]


def service_account_commands(pki: str) -> list[list[str]]:
    return [["openssl", "genrsa", "-out", pki + "/sa.key", "2048"],
            ["openssl", "rsa", "-in", pki + "/sa.key", "-pubout", "-out", pki + "/sa.pub"]]


@dataclass(frozen=True)
class PkiComponent:
    """The CA, every certificate of the plan, the service-account keys and the kubeconfigs (with the marker
    that tells `down` without a state, and preflight, that /etc/kubernetes is the cluster's own)."""

    settings: Settings
    nodes: tuple[Node, ...]
    inputs: Inputs
    name: str = "pki + kubeconfigs"

    def files_marker(self) -> FileSpec:
        return FileSpec("%s/%s" % (self.settings.kube_etc, MARKER_NAME), self.settings.state_dir + "\n")

    def files(self) -> list[FileSpec]:
        return [self.files_marker()] + kubeconfig.files(self.settings, self.nodes, self.inputs)

    def _made(self, host: Host, name: str) -> bool:
        return bool(host.read("%s/%s.crt" % (self.settings.pki, name))) and bool(
            host.read("%s/%s.key" % (self.settings.pki, name)))

    def up(self, host: Host) -> None:
        """Make what is missing (an existing certificate or key is never remade), then the kubeconfigs."""
        d = self.settings.pki
        host.mkdir(d)
        host.mkdir(self.settings.manifests)
        # the marker first: a `down` after an interrupted `up` (and without a state) knows the files are ours
        host.write(self.files_marker())
        if not host.read(d + "/ca.crt"):
            for argv in ca_commands(d):
                host.run(argv)
            host.write(FileSpec(d + "/ca.key", host.read(d + "/ca.key"), 0o600))
        for spec in plan(self.nodes):
            if self._made(host, spec.name):
                continue
            ext = "%s/%s.ext" % (d, spec.name)
            host.write(FileSpec(ext, spec.extfile(), 0o600))
            for argv in spec.commands(d, ext):
                host.run(argv)
            host.remove(ext)
            host.remove("%s/%s.csr" % (d, spec.name))
            host.write(FileSpec("%s/%s.key" % (d, spec.name), host.read("%s/%s.key" % (d, spec.name)), 0o600))
        if not host.read(d + "/sa.key"):
            for argv in service_account_commands(d):
                host.run(argv)
            host.write(FileSpec(d + "/sa.key", host.read(d + "/sa.key"), 0o600))
        certs = {c.name: (host.read("%s/%s.crt" % (d, c.name)).encode(), host.read("%s/%s.key" % (d, c.name)).encode())
                 for c in plan(self.nodes)}
        inputs = dataclasses.replace(self.inputs, ca_crt=host.read(d + "/ca.crt").encode(), certs=certs)
        made = dataclasses.replace(self, inputs=inputs)
        for f in made.files():
            host.write(f)

    def ready(self, host: Host) -> bool:
        """Every certificate of the plan verifies against the CA."""
        d = self.settings.pki
        try:
            for spec in plan(self.nodes):
                host.run(["openssl", "verify", "-CAfile", d + "/ca.crt", "%s/%s.crt" % (d, spec.name)])
        except RuntimeError:
            return False
        return True

    def down(self, host: Host) -> None:
        """Nothing to stop: the files go with the teardown plan (baseline.plan_down), which spares what a
        machine had before."""
