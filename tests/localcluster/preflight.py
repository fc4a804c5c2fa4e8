# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Preflight decisions of `up`: whose files are these, which ports, presets and leftovers stop it.

The local cluster uses kubeadm's paths (/etc/kubernetes, /var/lib/kubelet)
and never touches another installation's files there: without its own
baseline or marker, any kubeconfig, CA, static pod manifest or kubelet config
found there is foreign and `up` refuses to start, changing nothing.
"""

from __future__ import annotations

from typing import Collection, Optional, Sequence

from .settings import CLUSTER_BRIDGE, KCM_PORT, Settings

KUBEADM_FILES = ("admin.conf", "kubelet.conf", "scheduler.conf", "controller-manager.conf", "super-admin.conf",
                 "pki/ca.crt")


def candidates(settings: Settings) -> list[str]:
    """The paths whose presence marks another Kubernetes installation (the manifests dir's entries too)."""
    return (["%s/%s" % (settings.kube_etc, f) for f in KUBEADM_FILES]
            + [settings.kubelet_dir + "/config.yaml", settings.kubelet_dir + "/pki"])


def foreign_files(settings: Settings, present: Collection[str], manifest_entries: Sequence[str],
                  baseline_complete: bool, marker: bool) -> list[str]:
    """What of another installation is there; nothing when this cluster's baseline or marker says it is ours."""
    if baseline_complete or marker:
        return []
    found = [p for p in candidates(settings)[:len(KUBEADM_FILES)] if p in present]
    found += list(manifest_entries)
    found += [p for p in candidates(settings)[len(KUBEADM_FILES):] if p in present]
    return found


def ports(settings: Settings) -> list[tuple[str, int]]:
    """The host ports `up` needs free (or held by the cluster's own process of that name); the kubelets and
    the scheduler listen inside the nodes' network namespaces and cannot clash."""
    return [("etcd", settings.etcd_port), ("etcd", settings.etcd_peer_port),
            ("kube-apiserver", settings.apiserver_port), ("kube-controller-manager", KCM_PORT),
            ("registry", settings.registry_port), ("registry-auth", settings.registry_auth_port)]


def unknown_presets(presets: Sequence[str], known: Collection[str]) -> list[str]:
    return [p for p in presets if p not in known]


def leftover_bridge(bridge_exists: bool, table_exists: bool) -> Optional[str]:
    """The bridge without a recorded cluster: a leftover `down` should remove first."""
    if bridge_exists and not table_exists:
        return ("the network interface %s exists but no cluster is recorded: a leftover? Remove it "
                "(ip link delete %s) or run 'make cluster-down', then 'make cluster-up' again."
                % (CLUSTER_BRIDGE, CLUSTER_BRIDGE))
    return None


def foreign_route(route_lines: Sequence[str]) -> bool:
    """`ip route show 10.250.0.0/24` names a route not through our bridge: the node network is taken."""
    return any(line.strip() and CLUSTER_BRIDGE not in line for line in route_lines)
