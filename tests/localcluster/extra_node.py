# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""A temporary node: joined to the running cluster for one test, then removed without a trace.

For a test that needs a node unlike the cluster's own -- Debian's containerd
1.6 (no CDI), while every node of the shared cluster runs containerd 2.4 --
without a second cluster (two clash on the kubelet's device-plugin dir) and
without changing the node table, so that nothing else (`up`'s reuse check,
the equivalence test, `down`) ever sees it. It is the cluster's next node by
index (its name, address and pod CIDR follow the node plan), built by the
same ``NodeComponent`` as the others; only the containerd binary and its
config version differ. The other nodes get no route to its pod CIDR: a test
on it talks to the apiserver and the registries, not to other nodes' pods.

``remove`` undoes ``add`` in `down`'s order (pods, kubelet, containerd,
namespaces, cgroups) and then deletes the Node object, its certificates and
kubeconfig and its directories: what `down` would remove for a node of the
table.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
from typing import Sequence

from . import edge, pki
from .component import Inputs
from .node import NodeComponent, cgroup_dirs, hierarchies
from .nodes import Node, NodePaths, PlanError, node_ip
from .output import ClusterError
from .pki import PkiComponent
from .runtime import Runtime
from .settings import Settings
from .teardown import remove_cgroup
from .waiting import wait_for

# Debian 12's containerd (requirements/system.txt: deb containerd), 1.6.20: config version 2, no CDI
DEBIAN_CONTAINERD_BIN = "/usr/bin"


def plan_extra(nodes: Sequence[Node], preset: str) -> Node:
    """The node after the table's last: index, name (``<first>-<index>``) and so address and pod CIDR."""
    if not nodes:
        raise PlanError("no node table: the cluster is not up")
    first = next((n for n in nodes if n.control_plane), nodes[0])
    index = max(n.index for n in nodes) + 1
    node = Node(index, "%s-%d" % (first.name, index), preset)
    if node.name in {n.name for n in nodes}:
        raise PlanError("node name %s is taken" % node.name)
    node_ip(index)  # raises when past the cluster network's addresses
    return node


def own_files(settings: Settings, node: Node) -> list[str]:
    """What `add` makes for NODE alone and `remove` deletes: its certificates, its state, run and simulated-root
    directories (its kubeconfig lives in its state dir)."""
    p = NodePaths(settings, node)
    shared = {c.name for c in pki.plan([])}
    certs = [c.name for c in pki.plan([node]) if c.name not in shared]
    return ([p.dir, p.run, p.sim_dir] + ["%s/%s.%s" % (settings.pki, name, ext) for name in certs
                                         for ext in ("crt", "key")])


def pause_archive(rt: Runtime) -> str:
    """The sandbox image's OCI archive, as `up` imports it into every node (built when not cached)."""
    env = dict(os.environ, **rt.env)
    for argv in ([rt.scripts + "/images.sh", "pause"], [rt.scripts + "/images.sh", "archive", "pause"]):
        proc = subprocess.run(argv, capture_output=True, text=True, check=False, env=env)
        if proc.returncode != 0:
            raise ClusterError("%s failed: %s" % (" ".join(argv[1:]), (proc.stderr or proc.stdout).strip()))
    path = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    if not os.path.isfile(path):
        raise ClusterError("images.sh archive pause: no archive at %r" % path)
    return path


def component(rt: Runtime, node: Node, inputs: Inputs, containerd_bin: str, config_version: int,
              images: tuple[str, ...] = ()) -> NodeComponent:
    nodes = tuple(edge.recorded_nodes(rt.settings)) + (node,)
    tools = dataclasses.replace(rt.tools, containerd_bin=containerd_bin)
    return NodeComponent(rt.settings, node, inputs, containerd_config_version=config_version, tools=tools,
                         nodes=nodes, python=rt.python, images=images, want_images=(rt.settings.pause_image,))


def add(rt: Runtime, preset: str, containerd_bin: str = DEBIAN_CONTAINERD_BIN,
        config_version: int = 2) -> NodeComponent:
    """Bring up the next node with PRESET on CONTAINERD_BIN; returns it once Ready (kube-proxy healthy)."""
    s, host = rt.settings, rt.host
    table = edge.recorded_nodes(s)
    node = plan_extra(table, preset)
    every = table + [node]
    # the certificates of the plan that are missing: only the new node's (a made one is never remade)
    PkiComponent(s, tuple(every), Inputs()).up(host)
    comp = component(rt, node, edge.load_inputs(s, every), containerd_bin, config_version, (pause_archive(rt),))
    try:
        comp.up(host)
        ready = '{.status.conditions[?(@.type=="Ready")].status}'
        wait_for(host, "node %s Ready" % node.name, 180, "kubelet-" + node.name,
                 lambda: host.run([*rt.kubectl(), "get", "node", node.name, "-o", "jsonpath=" + ready]).strip()
                 == "True")
        patch = {"spec": {"podCIDR": node.pod_cidr, "podCIDRs": [node.pod_cidr]}}
        if not host.run([*rt.kubectl(), "get", "node", node.name, "-o", "jsonpath={.spec.podCIDR}"]).strip():
            host.run([*rt.kubectl(), "patch", "node", node.name, "--type", "merge", "-p", json.dumps(patch)])
        wait_for(host, "kube-proxy of %s /healthz" % node.name, 60, "kube-proxy-" + node.name,
                 lambda: comp.ready(host))
    except BaseException:
        remove(rt, comp)
        raise
    return comp


def remove(rt: Runtime, comp: NodeComponent) -> None:
    """Everything `add` made, whatever state the node is in (an `add` that failed half-way included)."""
    s, host, node = rt.settings, rt.host, comp.node
    kubectl = [*rt.kubectl(), "--request-timeout=20s"]
    # the kubelet tears its pods down (CNI DEL, unmounts) while it still runs
    if host.running("kubelet-" + node.name):
        host.ok([*kubectl, "delete", "pods", "--all-namespaces", "--field-selector", "spec.nodeName=" + node.name,
                 "--grace-period=0", "--force", "--wait=false"])
        ctrd = comp.parts().containerd
        try:
            wait_for(host, "the pods of %s gone" % node.name, 45, "",
                     lambda: not host.running(ctrd.name) or not ctrd.containers(host))
        except ClusterError:
            pass  # stop_runtime kills what is left
    comp.down(host)
    for d in cgroup_dirs(s, node, hierarchies()):
        if os.path.isdir(d):
            remove_cgroup(d)
    host.ok([*kubectl, "delete", "node", node.name, "--ignore-not-found", "--wait=false"])
    mounts = edge.observe_mounts()
    for path in own_files(s, node):
        if any(m == path or m.startswith(path + "/") for m in mounts):
            raise ClusterError("%s still has mounts on the machine; not removing it" % path)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.lexists(path):
            os.unlink(path)
