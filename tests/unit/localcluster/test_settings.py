# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The package's defaults are lib.sh's: the two cannot drift while cluster.sh still runs the cluster."""

from __future__ import annotations

import os
import subprocess

from localcluster.settings import Settings, from_env

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
LIB = os.path.join(REPO, "scripts", "cluster", "lib.sh")
VARS = {"METAX_CLUSTER_DIR": "state_dir", "METAX_KUBE_ETC": "kube_etc", "METAX_KUBELET_DIR": "kubelet_dir",
        "METAX_SIM_ROOT": "sim_root", "METAX_SIM_PRESET": "sim_preset", "METAX_CACHE_DIR": "cache_dir",
        "METAX_ETCD_PORT": "etcd_port", "METAX_ETCD_PEER_PORT": "etcd_peer_port",
        "METAX_APISERVER_PORT": "apiserver_port", "METAX_REGISTRY_PORT": "registry_port",
        "METAX_REGISTRY_AUTH_PORT": "registry_auth_port", "METAX_KUBELET_PORT": "kubelet_port",
        "METAX_REGISTRY_USER": "registry_user", "METAX_REGISTRY": "registry", "METAX_REGISTRY_AUTH": "registry_auth",
        "METAX_PAUSE_IMAGE": "pause_image", "METAX_SCHEDULER_IMAGE": "scheduler_image",
        "METAX_BASE_IMAGE": "base_image", "METAX_BASE_SUITE": "base_suite", "KUBE_VERSION": "kube_version",
        "CONTAINERD_VERSION": "containerd_version", "HELM_VERSION": "helm_version",
        "HELM_DIFF_VERSION": "helm_diff_version"}


def _lib_sh(env: dict[str, str]) -> dict[str, str]:
    """lib.sh's values of VARS under ENV (GO set: lib.sh would otherwise probe for a Go toolchain)."""
    script = 'source "$1" >/dev/null 2>&1; for v in %s; do printf "%%s=%%s\\n" "$v" "${!v}"; done' % " ".join(VARS)
    proc = subprocess.run(["bash", "-c", script, "bash", LIB], env=dict(env, GO="/bin/false"), capture_output=True,
                          text=True, check=True, timeout=60)
    return dict(line.split("=", 1) for line in proc.stdout.splitlines())


def _clean_env(tmp_path) -> dict[str, str]:
    return {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}


def test_defaults_are_lib_sh_defaults(tmp_path):
    env = _clean_env(tmp_path)
    lib = _lib_sh(env)
    mine = from_env(env)
    assert {v: str(getattr(mine, f)) for v, f in VARS.items()} == lib
    # the dataclass defaults are the machine's (HOME=/root) values
    assert Settings().state_dir == lib["METAX_CLUSTER_DIR"]
    assert Settings().scheduler_image == lib["METAX_SCHEDULER_IMAGE"]


def test_overrides_follow_lib_sh(tmp_path):
    env = dict(_clean_env(tmp_path), METAX_REGISTRY_PORT="15000", KUBE_VERSION="v1.37.0",
               METAX_CLUSTER_DIR=str(tmp_path / "s"), XDG_CACHE_HOME=str(tmp_path / "xdg"))
    lib = _lib_sh(env)
    mine = from_env(env)
    assert {v: str(getattr(mine, f)) for v, f in VARS.items()} == lib
    assert mine.pause_image == "127.0.0.1:15000/metax-gpu/pause:3.10"
    assert mine.scheduler_image.endswith(":v1.37.0")
    assert mine.cache_dir == str(tmp_path / "xdg" / "metax-gpu")


def test_empty_values_count_as_unset(tmp_path):
    assert from_env(dict(_clean_env(tmp_path), METAX_APISERVER_PORT="", METAX_CLUSTER_DIR="")) == from_env(
        _clean_env(tmp_path))


def test_derived_paths():
    s = Settings()
    assert (s.pki, s.manifests, s.admin_conf) == ("/etc/kubernetes/pki", "/etc/kubernetes/manifests",
                                                  "/etc/kubernetes/admin.conf")
    assert (s.apiserver, s.apiserver_nodes) == ("https://127.0.0.1:6443", "https://10.250.0.1:6443")
    assert s.sim_parent == "/var/lib/metax-sim"
    assert s.first_node_name == "vm" and Settings(node_name="gpu").first_node_name == "gpu"
    assert s.tracked_paths()[:2] == ("/etc/kubernetes", "/var/lib/kubelet")
