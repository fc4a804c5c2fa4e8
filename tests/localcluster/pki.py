# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The PKI plan: which certificates the cluster has, their subjects, usages and SANs.

One CA (EC P-256, CN=kubernetes); every certificate EC P-256 signed by it,
valid 3650 days; the service-account key pair is RSA 2048. The commands are
openssl's, as argv lists (run at the edge); a certificate or key that exists
is never remade.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Sequence

from .nodes import Node
from .settings import HOST_IP, SERVICE_IP

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
