# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""`up`: the components in the order they need each other, each waited for, with phase timings.

deps (requirements/system.txt, scripts/deps.sh) -> preflight -> PKI and
kubeconfigs -> registries -> images -> network -> etcd -> kube-apiserver ->
kube-controller-manager -> the scheduler's static pod -> each node ->
Ready waits -> cluster.env and nodes.json. Idempotent: what runs with an
unchanged configuration is kept (``LocalHost.start``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Callable

from . import edge, envfile, nodes as nodes_mod, preflight
from .apiserver import ApiserverComponent
from .component import Component, FileSpec, Inputs
from .controller_manager import ControllerManagerComponent
from .etcd import EtcdComponent
from .network import NetworkComponent
from .node import NodeComponent, SimRootComponent, host_binds_up
from .nodes import Node
from .output import ClusterError, Phases, log, warn
from .pki import PkiComponent
from .registries import RegistriesComponent
from .runtime import Runtime
from .scheduler import SchedulerComponent
from .settings import CLUSTER_BRIDGE, CLUSTER_NET, MARKER_NAME
from .teardown import down, read_baseline, record_baseline
from .waiting import wait_for

PRESET_CHECK = """
import sys
from ansible_collections.metax.gpu.plugins.module_utils.sim.spec import PRESETS
print(" ".join(sorted(PRESETS)))
"""


def _passthrough(argv: list[str], what: str) -> None:
    """A step whose own output the user reads (deps, image builds)."""
    if subprocess.run(argv, stdin=subprocess.DEVNULL, check=False).returncode != 0:
        raise ClusterError("%s failed (%s)" % (what, " ".join(argv)))


def _out(argv: list[str]) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ClusterError("%s failed: %s" % (" ".join(argv), (proc.stderr or proc.stdout).strip()))
    return proc.stdout


def require_root() -> None:
    if os.geteuid() != 0:
        raise ClusterError("this must run as root (it starts kubelet/containerd, mounts and writes /etc/kubernetes).")


def known_presets(rt: Runtime) -> list[str]:
    return _out([rt.python, "-c", PRESET_CHECK]).split()


def port_owner(port: int) -> str:
    out = subprocess.run(["ss", "-Hltnp", "( sport = :%d )" % port], capture_output=True, text=True,
                         check=False).stdout
    for line in out.splitlines():
        if "users:" in line:
            return line.split("users:", 1)[1].strip()
    return ""


def port_in_use(port: int) -> bool:
    return bool(subprocess.run(["ss", "-Hltn", "( sport = :%d )" % port], capture_output=True, text=True,
                               check=False).stdout.strip())


def run_preflight(rt: Runtime) -> None:
    """What stops `up` before it changes anything (preflight.py decides, this gathers)."""
    s, host = rt.settings, rt.host
    b = read_baseline(s)
    manifests = sorted(os.path.join(s.manifests, e) for e in os.listdir(s.manifests)) \
        if os.path.isdir(s.manifests) else []
    present = {p for p in preflight.candidates(s) if os.path.lexists(p)}
    foreign = preflight.foreign_files(s, present, manifests, bool(b and b.complete),
                                      os.path.exists(os.path.join(s.kube_etc, MARKER_NAME)))
    if foreign:
        raise ClusterError(
            "this machine already holds files of another Kubernetes installation:\n    %s\n  The local cluster "
            "uses the kubeadm paths %s and %s and will not touch a foreign\n  cluster's files. Move them away (or "
            "run on another machine), then 'make cluster-up' again." % (" ".join(foreign), s.kube_etc, s.kubelet_dir))
    proc = subprocess.run([rt.scripts + "/packages.sh", "--check"], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ClusterError("%s. Run scripts/cluster/packages.sh (installs them with apt-get)." % proc.stdout.strip())
    if not os.path.isdir("/sys/fs/cgroup"):
        raise ClusterError("/sys/fs/cgroup is not mounted")
    for name, port in preflight.ports(s):
        if host.running(name) or not port_in_use(port):
            continue
        owner = port_owner(port)
        raise ClusterError(
            "port 127.0.0.1:%d (needed by %s) is already in use%s.\n  Stop that process (if it is a leftover of this "
            "cluster: 'make cluster-down'), or choose another\n  port through the environment (see "
            "docs/local-cluster.md, e.g. METAX_APISERVER_PORT, METAX_REGISTRY_PORT)."
            % (port, name, " by " + owner if owner else ""))
    leftover = preflight.leftover_bridge(host.ok(["ip", "link", "show", CLUSTER_BRIDGE]),
                                         os.path.exists(s.state_dir + "/node-table"))
    if leftover:
        raise ClusterError(leftover)
    routes = subprocess.run(["ip", "route", "show", CLUSTER_NET], capture_output=True, text=True,
                            check=False).stdout.splitlines()
    if preflight.foreign_route(routes):
        raise ClusterError("%s (the local cluster's node network) is already routed on this machine: %s"
                           % (CLUSTER_NET, " ".join(routes)))


def _identity(rt: Runtime, verb: str, nodes_var: str) -> str:
    sources = "%s:%s" % (rt.scripts, os.path.join(rt.repo, "tests", "localcluster"))
    return _out(["python3", rt.scripts + "/identity.py", verb, rt.settings.state_dir + "/identity.json", rt.repo,
                 sources, nodes_var]).strip()


def _kubectl_ok(rt: Runtime, *args: str) -> Callable[[], bool]:
    return lambda: rt.host.ok([*rt.kubectl(), *args])


def _jsonpath(rt: Runtime, *args: str) -> str:
    return rt.host.run([*rt.kubectl(), *args]).strip()


def up(rt: Runtime, nodes_var: str) -> int:
    require_root()
    s, host = rt.settings, rt.host
    phases = Phases()
    # the project's one dependency list (requirements/system.txt): Debian packages, the Kubernetes,
    # containerd and helm builds, the base image
    phases.start("deps (requirements/system.txt)")
    _passthrough([os.path.join(rt.repo, "scripts", "deps.sh")], "scripts/deps.sh")
    phases.start("preflight")
    planned = edge.planned_nodes(s, dict(rt.env, NODES=nodes_var))
    if not planned:
        raise ClusterError('NODES is empty: give one preset per node, e.g. NODES="8xC500 4xN100"')
    nodes_var = " ".join(n.preset for n in planned) if not nodes_var.split() else nodes_var
    known = known_presets(rt)
    bad = preflight.unknown_presets([n.preset for n in planned], known)
    if bad:
        raise ClusterError('NODES="%s": unknown simulated node preset(s) %s; known: %s'
                           % (nodes_var, " ".join(bad), " ".join(known)))
    # a cluster started by another checkout, other cluster scripts or with other nodes is never reused
    # silently (scripts/cluster/identity.py)
    verdict = _identity(rt, "check", nodes_var)
    if verdict.startswith("replace"):
        warn("replacing the running cluster: " + verdict.split(": ", 1)[-1])
        down(rt)
    elif verdict.startswith("reuse:"):
        warn("reusing the running cluster: " + verdict.split(": ", 1)[-1])
    run_preflight(rt)
    for d in (s.state_dir, s.logs, s.pids):
        os.makedirs(d, exist_ok=True)
    os.chmod(s.state_dir, 0o700)
    record_baseline(s)
    os.makedirs(s.run_dir, exist_ok=True)
    host.write(FileSpec(s.state_dir + "/node-table", nodes_mod.render_table(planned)))
    _identity(rt, "record", nodes_var)
    first = planned[0]
    host.write(FileSpec(s.state_dir + "/node-name", first.name + "\n"))
    log("nodes: " + " ".join("%s (%s)" % (n.name, n.preset) for n in planned))

    phases.start("pki + kubeconfigs")
    PkiComponent(s, tuple(planned), Inputs()).up(host)
    phases.start("registries")
    regs = RegistriesComponent(s, Inputs())
    for d in (s.state_dir + "/registry/data", s.state_dir + "/registry-auth/data"):
        os.makedirs(d, exist_ok=True)
    regs.up(host)
    wait_for(host, "registries %s and %s" % (s.registry, s.registry_auth), 30, "registry", lambda: regs.ready(host))
    inputs = edge.load_inputs(s, planned)
    phases.start("images (build + push)")
    _passthrough([rt.scripts + "/images.sh", "build"], "images.sh build")
    _passthrough([rt.scripts + "/images.sh", "push"], "images.sh push")
    phases.start("network (bridge, service ip)")
    NetworkComponent(s).up(host)
    control: list[tuple[str, Component, str, int]] = [
        ("etcd", EtcdComponent(s), "etcd", 60),
        ("kube-apiserver", ApiserverComponent(s, rt.tools.kube_bin), "kube-apiserver %s/readyz" % s.apiserver, 180),
        ("kube-controller-manager", ControllerManagerComponent(s, rt.tools.kube_bin),
         "kube-controller-manager /healthz", 120)]
    for phase, comp, desc, timeout in control:
        phases.start(phase)
        comp.up(host)
        wait_for(host, desc, timeout, comp.name, lambda c=comp: c.ready(host))  # type: ignore[misc]
    sched = SchedulerComponent(s, first.name, rt.kubectl())
    sched.up(host)
    SimRootComponent(s, first, rt.python).up(host)
    host_binds_up(s, first)
    archives = {img: _out([rt.scripts + "/images.sh", "archive", img]).strip() for img in ("pause", "scheduler")}
    for n in planned:
        phases.start("node %s (%s)" % (n.name, n.preset))
        node_component(rt, n, planned, inputs, archives).up(host)
    # single-node tools read the first kubelet's config at the old path
    os.makedirs(s.state_dir + "/kubelet", exist_ok=True)
    link = s.state_dir + "/kubelet/config.yaml"
    if os.path.lexists(link):
        os.unlink(link)
    os.symlink("%s/nodes/%s/kubelet-config.yaml" % (s.state_dir, first.name), link)
    phases.start("nodes Ready + static kube-scheduler")
    ready = '{.status.conditions[?(@.type=="Ready")].status}'
    for n in planned:
        wait_for(host, "node %s Ready" % n.name, 180, "kubelet-" + n.name,
                 lambda n=n: _jsonpath(rt, "get", "node", n.name, "-o", "jsonpath=" + ready) == "True")  # type: ignore[misc]
    host.run([*rt.kubectl(), "label", "node", first.name, "--overwrite", "node-role.kubernetes.io/control-plane="])
    for n in planned:
        comp = node_component(rt, n, planned, inputs, archives)
        wait_for(host, "kube-proxy of node %d /healthz" % n.index, 60, "kube-proxy-" + n.name,
                 lambda c=comp: c.ready(host))  # type: ignore[misc]
    # what the node IPAM controller would record (the CNI config already uses it)
    for n in planned:
        if not _jsonpath(rt, "get", "node", n.name, "-o", "jsonpath={.spec.podCIDR}"):
            patch = {"spec": {"podCIDR": n.pod_cidr, "podCIDRs": [n.pod_cidr]}}
            host.run([*rt.kubectl(), "patch", "node", n.name, "--type", "merge", "-p", json.dumps(patch)])
    wait_for(host, "static pod kube-system/kube-scheduler-%s Ready" % first.name, 180, "kubelet-" + first.name,
             lambda: sched.ready(host))
    wait_for(host, "default ServiceAccount", 60, "kube-controller-manager",
             _kubectl_ok(rt, "-n", "default", "get", "serviceaccount", "default"))
    host.write(FileSpec(s.state_dir + "/cluster.env", envfile.cluster_env(s, planned, rt.tools)))
    host.write(FileSpec(s.state_dir + "/nodes.json", envfile.nodes_json(s, planned)))
    sys.stderr.write(phases.report("cluster up"))
    sys.stderr.flush()
    from .commands import status_command  # pylint: disable=import-outside-toplevel

    return status_command(rt)


def node_component(rt: Runtime, n: Node, planned: list[Node], inputs: Inputs,
                   archives: dict[str, str]) -> NodeComponent:
    """The node with the images its containerd must hold without any pull: the pod sandbox, and the
    scheduler on the control-plane node."""
    s = rt.settings
    images = (archives["pause"],) + ((archives["scheduler"],) if n.control_plane else ())
    want = (s.pause_image,) + ((s.scheduler_image,) if n.control_plane else ())
    return NodeComponent(s, n, inputs, tools=rt.tools, nodes=tuple(planned), python=rt.python, images=images,
                         want_images=want)
