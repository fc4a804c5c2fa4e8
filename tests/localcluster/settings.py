# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The cluster's paths, ports, names and pinned versions, from the environment.

The defaults are scripts/cluster/lib.sh's (the contract of
docs/local-cluster.md), which the build scripts and the image builds still
read; tests/unit/localcluster/test_settings.py checks that both agree, so the
two cannot drift.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

# Fixed by cluster.sh (not overridable there either).
SERVICE_CIDR = "10.96.0.0/12"
SERVICE_IP = "10.96.0.1"
CLUSTER_NET = "10.250.0.0/24"
HOST_IP = "10.250.0.1"
POD_NET = "10.244.0.0/16"
CLUSTER_BRIDGE = "metax-br0"
POD_BRIDGE = "metax-cni0"
NETNS_PREFIX = "metax-gpu-"
VETH_PREFIX = "metax-v"
CNI_NAME = "metax-gpu-cluster"
CHAIN = "METAX-GPU-CLUSTER"
CHAIN_FWD = "METAX-GPU-CLUSTER-FWD"
CHAIN_IN = "METAX-GPU-CLUSTER-IN"
MARKER_NAME = ".metax-gpu-cluster"
SCHED_PORT = 10259
KCM_PORT = 10257
KUBELET_HEALTHZ_PORT = 10248
KUBE_PROXY_HEALTHZ_PORT = 10256
KUBE_PROXY_METRICS = "127.0.0.1:10249"
DEFAULT_NODE_NAME = "vm"


@dataclass(frozen=True)
class Settings:
    """Everything the environment can change (lib.sh's variables)."""

    state_dir: str = "/var/lib/metax-gpu-cluster"
    run_dir: str = "/run/metax-gpu-cluster"
    kube_etc: str = "/etc/kubernetes"
    kubelet_dir: str = "/var/lib/kubelet"
    sim_root: str = "/var/lib/metax-sim/root"
    sim_preset: str = "8xC500"
    cache_dir: str = "/root/.cache/metax-gpu"
    cgroup_prefix: str = "metax-gpu-"
    node_name: str = ""  # METAX_NODE_NAME; empty: DEFAULT_NODE_NAME
    etcd_port: int = 2379
    etcd_peer_port: int = 2380
    apiserver_port: int = 6443
    registry_port: int = 5000
    registry_auth_port: int = 5443
    kubelet_port: int = 10250
    registry_user: str = "metax"
    registry: str = "127.0.0.1:5000"
    registry_auth: str = "127.0.0.1:5443"
    pause_image: str = "127.0.0.1:5000/metax-gpu/pause:3.10"
    scheduler_image: str = "127.0.0.1:5000/metax-gpu/kube-scheduler:v1.36.3"
    base_image: str = "localhost/metax-gpu/base:bookworm"
    base_suite: str = "bookworm"
    kube_version: str = "v1.36.3"
    containerd_version: str = "v2.4.2"
    helm_version: str = "v3.22.0"
    helm_diff_version: str = "v3.9.14"

    # ---- derived paths (cluster.sh's variables of the same meaning)
    @property
    def pki(self) -> str:
        return self.kube_etc + "/pki"

    @property
    def manifests(self) -> str:
        return self.kube_etc + "/manifests"

    @property
    def admin_conf(self) -> str:
        return self.kube_etc + "/admin.conf"

    @property
    def logs(self) -> str:
        return self.state_dir + "/logs"

    @property
    def pids(self) -> str:
        return self.state_dir + "/pids"

    @property
    def baseline_dir(self) -> str:
        return self.state_dir + "/baseline"

    @property
    def sim_parent(self) -> str:
        return os.path.dirname(self.sim_root)

    @property
    def apiserver(self) -> str:
        """What the host uses."""
        return "https://127.0.0.1:%d" % self.apiserver_port

    @property
    def apiserver_nodes(self) -> str:
        """What the nodes (and the scheduler, kube-proxy) use: from a node's namespace 127.0.0.1 is its own."""
        return "https://%s:%d" % (HOST_IP, self.apiserver_port)

    @property
    def first_node_name(self) -> str:
        return self.node_name or DEFAULT_NODE_NAME

    def tracked_paths(self) -> tuple[str, ...]:
        """Host paths `up` may create and `down` removes unless they existed before (TRACKED_PATHS)."""
        return (self.kube_etc, self.kubelet_dir, "/var/log/pods", "/var/log/containers", "/var/lib/cni",
                self.sim_parent, self.run_dir, "/run/netns", "/run/containerd", "/etc/cdi", "/run/cdi")


def _port(env: Mapping[str, str], name: str, default: int) -> int:
    value = env.get(name, "")
    return int(value) if value else default


def from_env(env: Mapping[str, str]) -> Settings:
    """Settings as lib.sh derives them from ENV (pure: pass os.environ at the edge)."""
    def get(name: str, default: str) -> str:
        # lib.sh's ${VAR:=default}: empty counts as unset
        return env.get(name) or default

    home = env.get("HOME") or "/root"
    cache = get("METAX_CACHE_DIR", (env.get("XDG_CACHE_HOME") or home + "/.cache") + "/metax-gpu")
    registry_port = _port(env, "METAX_REGISTRY_PORT", 5000)
    registry_auth_port = _port(env, "METAX_REGISTRY_AUTH_PORT", 5443)
    kube_version = get("KUBE_VERSION", "v1.36.3")
    registry = get("METAX_REGISTRY", "127.0.0.1:%d" % registry_port)
    return Settings(
        state_dir=get("METAX_CLUSTER_DIR", "/var/lib/metax-gpu-cluster"),
        run_dir=get("METAX_RUN_DIR", "/run/metax-gpu-cluster"),
        kube_etc=get("METAX_KUBE_ETC", "/etc/kubernetes"),
        kubelet_dir=get("METAX_KUBELET_DIR", "/var/lib/kubelet"),
        sim_root=get("METAX_SIM_ROOT", "/var/lib/metax-sim/root"),
        sim_preset=get("METAX_SIM_PRESET", "8xC500"),
        cache_dir=cache,
        cgroup_prefix=get("METAX_CGROUP_PREFIX", "metax-gpu-"),
        node_name=env.get("METAX_NODE_NAME", ""),
        etcd_port=_port(env, "METAX_ETCD_PORT", 2379),
        etcd_peer_port=_port(env, "METAX_ETCD_PEER_PORT", 2380),
        apiserver_port=_port(env, "METAX_APISERVER_PORT", 6443),
        registry_port=registry_port,
        registry_auth_port=registry_auth_port,
        kubelet_port=_port(env, "METAX_KUBELET_PORT", 10250),
        registry_user=get("METAX_REGISTRY_USER", "metax"),
        registry=registry,
        registry_auth=get("METAX_REGISTRY_AUTH", "127.0.0.1:%d" % registry_auth_port),
        pause_image=get("METAX_PAUSE_IMAGE", registry + "/metax-gpu/pause:3.10"),
        scheduler_image=get("METAX_SCHEDULER_IMAGE", registry + "/metax-gpu/kube-scheduler:" + kube_version),
        base_image=get("METAX_BASE_IMAGE", "localhost/metax-gpu/base:bookworm"),
        base_suite=get("METAX_BASE_SUITE", "bookworm"),
        kube_version=kube_version,
        containerd_version=get("CONTAINERD_VERSION", "v2.4.2"),
        helm_version=get("HELM_VERSION", "v3.22.0"),
        helm_diff_version=get("HELM_DIFF_VERSION", "v3.9.14"),
    )
