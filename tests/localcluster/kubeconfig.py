# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""kubeadm-style kubeconfigs: one user, one cluster ``kubernetes``, certificates embedded."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Sequence

from .component import FileSpec, Inputs, Write
from .nodes import Node, NodePaths
from .settings import Settings


@dataclass(frozen=True)
class KubeconfigSpec:
    path: str
    user: str
    cert: str  # the PKI name of its client certificate
    server: str


def render(server: str, user: str, ca_crt: bytes, crt: bytes, key: bytes) -> str:
    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode("ascii")

    return ("apiVersion: v1\n"
            "kind: Config\n"
            "clusters:\n"
            "  - name: kubernetes\n"
            "    cluster:\n"
            "      server: %s\n"
            "      certificate-authority-data: %s\n"
            "users:\n"
            "  - name: %s\n"
            "    user:\n"
            "      client-certificate-data: %s\n"
            "      client-key-data: %s\n"
            "contexts:\n"
            "  - name: %s@kubernetes\n"
            "    context:\n"
            "      cluster: kubernetes\n"
            "      user: %s\n"
            "current-context: %s@kubernetes\n") % (server, b64(ca_crt), user, b64(crt), b64(key), user, user, user)


def plan(settings: Settings, nodes: Sequence[Node]) -> list[KubeconfigSpec]:
    """The host's components use 127.0.0.1; what runs in a node's namespace uses the bridge address."""
    etc = settings.kube_etc
    specs = [
        KubeconfigSpec(etc + "/admin.conf", "kubernetes-admin", "admin", settings.apiserver),
        KubeconfigSpec(etc + "/controller-manager.conf", "system:kube-controller-manager", "controller-manager",
                       settings.apiserver),
        # the scheduler runs in the first node's network namespace
        KubeconfigSpec(etc + "/scheduler.conf", "system:kube-scheduler", "scheduler", settings.apiserver_nodes),
        KubeconfigSpec(settings.state_dir + "/kube-proxy.conf", "system:kube-proxy", "kube-proxy",
                       settings.apiserver_nodes),
    ]
    for node in nodes:
        specs.append(KubeconfigSpec(NodePaths(settings, node).dir + "/kubelet.conf", "system:node:" + node.name,
                                    "kubelet-client-" + node.name, settings.apiserver_nodes))
    return specs


def files(settings: Settings, nodes: Sequence[Node], inputs: Inputs) -> list[FileSpec]:
    out = []
    for spec in plan(settings, nodes):
        crt, key = inputs.certs[spec.cert]
        out.append(FileSpec(spec.path, render(spec.server, spec.user, inputs.ca_crt, crt, key), 0o600,
                            Write.IF_ABSENT))
    if nodes:
        # kubeadm's path, a copy of the first (control-plane) node's
        first = out[4]
        out.append(FileSpec(settings.kube_etc + "/kubelet.conf", first.content, 0o600, Write.IF_ABSENT))
    return out
