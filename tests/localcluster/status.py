# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""`cluster.sh status`: each component's state from its PID files, the facts, the node table; exit 0/1/3.

A component runs when its PID file names a live process whose executable is
still the recorded binary (``<pids>/NAME.exe``; a replaced binary shows as
``... (deleted)``); a PID file without such a process is stale.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from .envfile import Tools
from .nodes import Node, NodePaths
from .settings import Settings

CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "registry", "registry-auth")


class State(enum.Enum):
    RUNNING = "running"
    STALE = "stale"
    STOPPED = "stopped"


@dataclass(frozen=True)
class ProcessState:
    state: State
    pid: str = ""


def process_state(pid: Optional[str], alive: bool, recorded_exe: Optional[str],
                  actual_exe: Optional[str]) -> ProcessState:
    """From the PID file's content (None: no file), whether /proc/PID exists, NAME.exe and /proc/PID/exe."""
    if pid is None:
        return ProcessState(State.STOPPED)
    pid = pid.strip()
    running = (bool(pid) and alive and recorded_exe is not None and actual_exe is not None
               and actual_exe.removesuffix(" (deleted)") == recorded_exe.strip())
    return ProcessState(State.RUNNING if running else State.STALE, pid)


def components(nodes: Sequence[Node]) -> list[str]:
    names = list(CONTROL_PLANE)
    for n in nodes:
        names += ["ns-" + n.name, "containerd-" + n.name, "kubelet-" + n.name, "kube-proxy-" + n.name]
    return names


def render_head(settings: Settings, nodes: Sequence[Node], states: Mapping[str, ProcessState],
                tools: Tools) -> str:
    """Everything `status` prints before kubectl's node and pod tables."""
    out = ["cluster state: %s" % settings.state_dir]
    for name in components(nodes):
        st = states.get(name, ProcessState(State.STOPPED))
        what = {State.RUNNING: "running (pid %s)" % st.pid,
                State.STALE: "NOT RUNNING (stale PID file %s)" % st.pid,
                State.STOPPED: "stopped"}[st.state]
        out.append("  %-34s %s" % (name, what))
    a = settings.state_dir + "/registry-auth"
    out += [
        "kubeconfig (admin):   %s" % settings.admin_conf,
        "apiserver:            %s (nodes: %s)" % (settings.apiserver, settings.apiserver_nodes),
        "kubectl:              %s/kubectl" % tools.kube_bin,
        "helm:                 %s/helm (HELM_PLUGINS=%s)" % (tools.helm_bin, tools.helm_plugins),
        "registry (http):      %s" % settings.registry,
        "registry (tls+auth):  %s  user %s, password in %s/password, CA %s/tls.crt"
        % (settings.registry_auth, settings.registry_user, a, a),
        "static pod manifests: %s" % settings.manifests,
        "logs:                 %s" % settings.logs,
        'use it:               eval "$(scripts/cluster/cluster.sh env)"; scripts/cluster/cluster.sh inventory',
        "nodes (name, preset, simulated root, node IP, pod CIDR, containerd socket):",
    ]
    for i, n in enumerate(nodes):
        p = NodePaths(settings, n)
        row = (n.name, n.preset, p.sim_dir, n.ip, n.pod_cidr, p.socket, "  control plane" if i == 0 else "")
        out.append("  %-22s %-13s %-36s %-12s %-15s %s%s" % row)
    out.append("  (inside every node its own simulated root is at %s, its kubelet dir at %s)"
               % (settings.sim_root, settings.kubelet_dir))
    return "\n".join(out) + "\n"


def verdict(settings: Settings, nodes: Sequence[Node], states: Mapping[str, ProcessState]) -> tuple[str, int]:
    """The last line and the exit code: 0 all running, 3 none, 1 some."""
    names = components(nodes)
    ok = sum(1 for n in names if states.get(n, ProcessState(State.STOPPED)).state is State.RUNNING)
    if ok == len(names):
        return "cluster: up", 0
    if ok == 0:
        return "cluster: down (state left in %s: run 'make cluster-down' to clean up)" % settings.state_dir, 3
    return ("cluster: PARTIAL (%d/%d components running): run 'make cluster-down' then 'make cluster-up'"
            % (ok, len(names)), 1)


def no_state(settings: Settings) -> tuple[str, int]:
    return "cluster: down (no state in %s)" % settings.state_dir, 3
