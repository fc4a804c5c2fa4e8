# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""What `up` tells its users: cluster.env, nodes.json and the Ansible inventory."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Sequence

from .nodes import Node, NodePaths
from .settings import Settings


@dataclass(frozen=True)
class Tools:
    """Where the binaries and the podman configuration are (resolved at the edge)."""

    kube_bin: str
    containerd_bin: str
    helm_bin: str
    helm_plugins: str
    containers_conf: str
    containers_registries_conf: str


def node_record(settings: Settings, node: Node) -> dict[str, object]:
    p = NodePaths(settings, node)
    return {"index": node.index, "name": node.name, "preset": node.preset, "sim_root": p.sim_dir, "ip": node.ip,
            "pod_cidr": node.pod_cidr, "containerd_address": p.socket, "kubelet_dir": p.kubelet_dir,
            "netns": node.netns, "control_plane": node.control_plane}


def nodes_json(settings: Settings, nodes: Sequence[Node]) -> str:
    return json.dumps([node_record(settings, n) for n in nodes], indent=2) + "\n"


def cluster_env(settings: Settings, nodes: Sequence[Node], tools: Tools) -> str:
    first = nodes[0]
    s = settings
    a = s.state_dir + "/registry-auth"
    pairs = [
        ("KUBECONFIG", s.admin_conf),
        ("METAX_KUBE_BIN", tools.kube_bin),
        ("METAX_NODE_NAME", first.name),
        ("METAX_NODES", '"%s"' % " ".join(n.name for n in nodes)),
        ("METAX_NODES_FILE", s.state_dir + "/nodes.json"),
        ("METAX_APISERVER", s.apiserver),
        ("METAX_APISERVER_NODES", s.apiserver_nodes),
        ("METAX_REGISTRY", s.registry),
        ("METAX_REGISTRY_AUTH", s.registry_auth),
        ("METAX_REGISTRY_AUTH_USER", s.registry_user),
        ("METAX_REGISTRY_AUTH_PASSWORD_FILE", a + "/password"),
        ("METAX_REGISTRY_AUTH_CA", a + "/tls.crt"),
        ("METAX_REGISTRY_AUTH_CERT_DIR", "%s/certs.d/%s" % (a, s.registry_auth)),
        ("METAX_SIM_ROOT", s.sim_root),
        ("METAX_SIM_PRESET", first.preset),
        ("METAX_CONTAINERD_ADDRESS", NodePaths(s, first).socket),
        ("METAX_CONTAINERD_BIN", tools.containerd_bin),
        ("METAX_PAUSE_IMAGE", s.pause_image),
        ("METAX_SCHEDULER_IMAGE", s.scheduler_image),
        ("METAX_BASE_IMAGE", s.base_image),
        ("METAX_REGISTRY_BASE_IMAGE", "%s/metax-gpu/base:%s" % (s.registry, s.base_suite)),
        ("METAX_HELM", tools.helm_bin + "/helm"),
        ("HELM_PLUGINS", tools.helm_plugins),
        ("CONTAINERS_CONF", tools.containers_conf),
        ("CONTAINERS_REGISTRIES_CONF", tools.containers_registries_conf),
        ("PATH", "%s:%s:%s:${PATH}" % (tools.kube_bin, tools.helm_bin, tools.containerd_bin)),
    ]
    return "".join("export %s=%s\n" % kv for kv in pairs)


def inventory(nodes_records: Sequence[dict[str, object]], admin_conf: str) -> str:
    """`cluster.sh inventory`: groups kube_control_plane (the first node), gpu_nodes, and localhost."""
    out = ["# Ansible inventory of the local cluster (scripts/cluster/cluster.sh inventory)", "all:",
           "  vars:", "    metax_gpu_kubeconfig: %s" % admin_conf, "  children:"]

    def host(n: dict[str, object]) -> list[str]:
        return ["        %s:" % n["name"], "          ansible_connection: local",
                "          ansible_python_interpreter: \"{{ ansible_playbook_python }}\"",
                "          metax_gpu_host_root: %s" % n["sim_root"], "          metax_gpu_node_name: %s" % n["name"]]

    out += ["    kube_control_plane:", "      hosts:"]
    for n in nodes_records:
        if n["control_plane"]:
            out += host(n)
    out += ["    gpu_nodes:", "      hosts:"]
    for n in nodes_records:
        out += host(n)
    out += ["  hosts:", "    localhost:", "      ansible_connection: local",
            "      ansible_python_interpreter: \"{{ ansible_playbook_python }}\""]
    return "\n".join(out) + "\n"
