# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""What every cluster command works with: the settings, the binaries, the checkout, the host.

``scripts/cluster/cluster.sh`` resolves what only lib.sh knows (the Go
version that keys the Kubernetes build, the project's python, the podman
configuration) and passes it in the environment (``METAX_LC_*``); run
directly, the same is derived here.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from typing import Mapping

from . import binaries, output
from .envfile import Tools
from .host import LocalHost
from .settings import Settings, from_env

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _go_version(repo: str) -> str:
    lib = os.path.join(repo, "scripts", "cluster", "lib.sh")
    proc = subprocess.run(["bash", "-c", 'source "$1" && go_version', "bash", lib], capture_output=True,
                          text=True, check=False)
    return proc.stdout.strip() or "unknown"


def tools_from_env(settings: Settings, env: Mapping[str, str], repo: str = REPO) -> Tools:
    kube_bin = env.get("METAX_LC_KUBE_BIN") or binaries.k8s_bin_dir(settings, _go_version(repo))
    containers = os.path.join(repo, "scripts", "cluster", "containers")
    return Tools(kube_bin=kube_bin,
                 containerd_bin=env.get("METAX_LC_CONTAINERD_BIN") or binaries.containerd_bin_dir(settings),
                 helm_bin=env.get("METAX_LC_HELM_BIN") or binaries.helm_bin_dir(settings),
                 helm_plugins=env.get("METAX_LC_HELM_PLUGINS") or binaries.helm_plugins_dir(settings),
                 containers_conf=env.get("CONTAINERS_CONF") or containers + "/containers.conf",
                 containers_registries_conf=env.get("CONTAINERS_REGISTRIES_CONF") or containers + "/registries.conf")


@dataclass(frozen=True)
class Runtime:
    settings: Settings
    tools: Tools
    env: Mapping[str, str]
    repo: str = REPO
    python: str = "python3"  # the project's (the venv's when there is one): the simulator runs in it

    @property
    def scripts(self) -> str:
        return os.path.join(self.repo, "scripts", "cluster")

    @property
    def host(self) -> LocalHost:
        return LocalHost(self.settings.pids, self.settings.logs, log=output.log)

    def kubectl(self) -> tuple[str, ...]:
        return (self.tools.kube_bin + "/kubectl", "--kubeconfig", self.settings.admin_conf)


def from_environ(env: Mapping[str, str]) -> Runtime:
    settings = from_env(env)
    repo = env.get("METAX_LC_REPO") or REPO
    venv = os.path.join(repo, ".venv", "bin", "python")
    python = env.get("METAX_LC_PYTHON") or (venv if os.access(venv, os.X_OK) else "python3")
    return Runtime(settings, tools_from_env(settings, env, repo), env, repo, python)
