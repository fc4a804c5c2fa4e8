# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Where the Go-built binaries live in the cache, keyed by version (lib.sh's *_bin_dir).

The builds themselves stay in scripts/cluster/build-*.sh (docs/development.md).
"""

from __future__ import annotations

from .settings import Settings

KUBE_BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl", "kube-proxy")


def k8s_bin_dir(settings: Settings, go_version: str) -> str:
    """Keyed by Kubernetes and Go version: a Go bump rebuilds."""
    return "%s/k8s/%s-%s/bin" % (settings.cache_dir, settings.kube_version, go_version)


def containerd_bin_dir(settings: Settings) -> str:
    return "%s/containerd/%s/bin" % (settings.cache_dir, settings.containerd_version)


def helm_bin_dir(settings: Settings) -> str:
    return "%s/helm/%s/bin" % (settings.cache_dir, settings.helm_version)


def helm_plugins_dir(settings: Settings) -> str:
    """A HELM_PLUGINS directory holding only the diff plugin."""
    return "%s/helm-diff/%s/plugins" % (settings.cache_dir, settings.helm_diff_version)


def complete_marker(bin_dir: str) -> str:
    """A finished build: ``.complete`` next to ``bin/``."""
    return bin_dir.rsplit("/", 1)[0] + "/.complete"
