# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The read-mostly commands of cluster.sh: status, env, json, inventory, plan, podman-env, restart-kubelet."""

from __future__ import annotations

import json
import os
import sys
from typing import TextIO

from . import edge, envfile, nodes as nodes_mod, status
from .kubelet import KubeletComponent
from .output import ClusterError, log
from .runtime import Runtime
from .waiting import wait_for

JSON_KEYS = ("KUBECONFIG", "METAX_KUBE_BIN", "METAX_NODE_NAME", "METAX_APISERVER", "METAX_APISERVER_NODES",
             "METAX_REGISTRY", "METAX_REGISTRY_AUTH", "METAX_REGISTRY_AUTH_USER", "METAX_REGISTRY_AUTH_PASSWORD_FILE",
             "METAX_REGISTRY_AUTH_CA", "METAX_REGISTRY_AUTH_CERT_DIR", "METAX_SIM_ROOT", "METAX_SIM_PRESET",
             "METAX_CONTAINERD_ADDRESS", "METAX_CONTAINERD_BIN", "METAX_PAUSE_IMAGE", "METAX_SCHEDULER_IMAGE",
             "METAX_BASE_IMAGE", "METAX_REGISTRY_BASE_IMAGE", "METAX_HELM", "HELM_PLUGINS", "CONTAINERS_CONF",
             "CONTAINERS_REGISTRIES_CONF")


def _need_state(rt: Runtime, name: str) -> str:
    path = "%s/%s" % (rt.settings.state_dir, name)
    if not os.path.isfile(path):
        raise ClusterError("no cluster state in %s: run 'make cluster-up' first" % rt.settings.state_dir)
    return path


def parse_env(text: str) -> dict[str, str]:
    """cluster.env's `export K=V` lines as the shell reads them (one level of double quotes)."""
    out = {}
    for line in text.splitlines():
        if line.startswith("export ") and "=" in line:
            key, value = line[len("export "):].split("=", 1)
            if len(value) >= 2 and value[0] == value[-1] == '"':
                value = value[1:-1]
            out[key] = value
    return out


def render_json(env_text: str, nodes_records: object) -> str:
    """`cluster.sh json`: cluster.env's values (PATH aside) and the node list."""
    env = parse_env(env_text)
    info: dict[str, object] = {k: env.get(k, "") for k in JSON_KEYS}
    info["nodes"] = nodes_records
    return json.dumps(info, indent=2, sort_keys=True) + "\n"


def env_command(rt: Runtime, out: TextIO = sys.stdout) -> int:
    with open(_need_state(rt, "cluster.env"), encoding="utf-8") as fh:
        out.write(fh.read())
    return 0


def json_command(rt: Runtime, out: TextIO = sys.stdout) -> int:
    with open(_need_state(rt, "cluster.env"), encoding="utf-8") as fh:
        text = fh.read()
    with open(parse_env(text).get("METAX_NODES_FILE") or rt.settings.state_dir + "/nodes.json",
              encoding="utf-8") as fh:
        records = json.load(fh)
    out.write(render_json(text, records))
    return 0


def inventory_command(rt: Runtime, out: TextIO = sys.stdout) -> int:
    with open(_need_state(rt, "nodes.json"), encoding="utf-8") as fh:
        out.write(envfile.inventory(json.load(fh), rt.settings.admin_conf))
    return 0


def plan_command(rt: Runtime, out: TextIO = sys.stdout) -> int:
    try:
        out.write(nodes_mod.render_table(edge.planned_nodes(rt.settings, rt.env)))
    except nodes_mod.PlanError as exc:
        sys.stderr.write("ERROR: %s\n" % exc)
        return 1
    return 0


def podman_env_command(rt: Runtime, out: TextIO = sys.stdout) -> int:
    """Usable without a cluster (Molecule, image builds)."""
    out.write("export CONTAINERS_CONF=%s\nexport CONTAINERS_REGISTRIES_CONF=%s\n"
              % (rt.tools.containers_conf, rt.tools.containers_registries_conf))
    return 0


def status_command(rt: Runtime, out: TextIO = sys.stdout) -> int:
    s, host = rt.settings, rt.host
    if not os.path.isdir(s.state_dir):
        line, code = status.no_state(s)
        out.write(line + "\n")
        return code
    nodes = edge.recorded_nodes(s)
    states = edge.process_states(s, status.components(nodes))
    out.write(status.render_head(s, nodes, states, rt.tools))
    out.flush()
    if host.running("kube-apiserver") and os.path.isfile(s.admin_conf):
        for args in (["get", "nodes", "-o", "wide"], ["-n", "kube-system", "get", "pods"]):
            try:
                table = host.run([*rt.kubectl(), *args])
            except (RuntimeError, OSError):
                continue
            out.write("".join("  " + line + "\n" for line in table.splitlines()))
    line, code = status.verdict(s, nodes, states)
    out.write(line + "\n")
    return code


def restart_kubelet_command(rt: Runtime, target: str = "") -> int:
    """What a kubelet upgrade or crash does to device plugins (kubelet.sock recreated, plugin sockets
    removed), for tests and demos. Default: the first node."""
    from .up import require_root  # pylint: disable=import-outside-toplevel

    require_root()
    s, host = rt.settings, rt.host
    nodes = edge.recorded_nodes(s)
    if not nodes:
        raise ClusterError("no cluster recorded in %s; start it first: make cluster-up" % s.state_dir)
    target = target or nodes[0].name
    node = next((n for n in nodes if n.name == target), None)
    if node is None:
        raise ClusterError("no node %s in this cluster (nodes: %s)" % (target, " ".join(n.name for n in nodes)))
    klet = KubeletComponent(s, node, rt.tools.kube_bin)
    if not host.running(klet.name):
        raise ClusterError("the kubelet of %s is not running; start the cluster first: make cluster-up" % target)
    host.stop(klet.name)
    klet.up(host)
    wait_for(host, "kubelet of %s /healthz" % target, 120, klet.name, lambda: klet.ready(host))
    ready = '{.status.conditions[?(@.type=="Ready")].status}'
    wait_for(host, "node %s Ready" % target, 120, klet.name,
             lambda: host.run([*rt.kubectl(), "get", "node", target, "-o", "jsonpath=" + ready]).strip() == "True")
    log("kubelet of %s restarted" % target)
    return 0
