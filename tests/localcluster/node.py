# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""A GPU node: network namespace, cgroups, mount namespace, containerd, kubelet, kube-proxy, simulated root.

Each node is a namespace pair (what kind's node containers solve): its own
network namespace on the cluster bridge, and a mount namespace where its own
directories are bind-mounted at the standard paths, so one DaemonSet spec
resolves hostPaths to each node's own device-plugin dir, pod-resources socket
and simulated root. ``NodeComponent.files()`` is everything it writes.
"""

from __future__ import annotations

import glob
import os
import subprocess
import time
from dataclasses import dataclass
from typing import Optional

from . import containerd, kube_proxy, kubelet, network
from .component import FileSpec, Host, Inputs, ProcessSpec
from .envfile import Tools
from .nodes import Node, NodePaths
from .output import ClusterError, log, warn
from .settings import CLUSTER_BRIDGE, HOST_IP, Settings
from .waiting import wait_for


def bind_mounts(settings: Settings, node: Node) -> list[tuple[str, str]]:
    """(source on the host, target inside the node's mount namespace)."""
    p = NodePaths(settings, node)
    return [(p.kubelet_dir, settings.kubelet_dir), (p.sim_dir, settings.sim_root),
            (p.dir + "/cni-cache", "/var/lib/cni"), (p.run + "/containerd", "/run/containerd"),
            (p.dir + "/cdi-etc", "/etc/cdi"), (p.run + "/cdi", "/run/cdi")]


def host_bind_mounts(settings: Settings, first: Node) -> list[tuple[str, str]]:
    """The first node's kubelet dir and simulated root also at the standard paths on the host."""
    p = NodePaths(settings, first)
    return [(p.kubelet_dir, settings.kubelet_dir), (p.sim_dir, settings.sim_root)]


def holder_process(node: Node) -> ProcessSpec:
    """The namespace holder: a `sleep infinity` in the node's network namespace and a new mount namespace
    (slave: the host's later mounts show inside, the node's stay there); everything else of the node
    enters its namespaces through this process (nsenter -t PID)."""
    return ProcessSpec("ns-" + node.name, ("/usr/bin/sleep", "infinity"),
                       wrap=("nsenter", "--net=/run/netns/" + node.netns, "unshare", "--mount", "--propagation",
                             "slave", "--"))


def cgroup_dirs(settings: Settings, node: Node, hierarchies: list[str]) -> list[str]:
    """The node's cgroupRoot in every hierarchy (the kubelet wants it in each)."""
    return ["%s/%s%s" % (h.rstrip("/"), settings.cgroup_prefix, node.name) for h in hierarchies]


SIM_MODULE = "ansible_collections.metax.gpu.plugins.module_utils.sim"


def sim_create_argv(python: str, preset: str, directory: str) -> list[str]:
    return [python, "-m", SIM_MODULE, "create", "--force", "--preset", preset, directory]


def sim_refresh_argv(python: str, directory: str) -> list[str]:
    """A root made by an older checkout gets this checkout's mx-smi (e.g. the real -L form)."""
    return [python, "-m", SIM_MODULE, "install-mx-smi", directory]


def hierarchies() -> list[str]:
    """The cgroup hierarchies a kubelet with cgroupfs wants its cgroupRoot in."""
    return sorted(d for d in glob.glob("/sys/fs/cgroup/*/") if os.path.isfile(d + "cgroup.procs"))


@dataclass(frozen=True)
class SimRootComponent:
    """The node's simulated MetaX root (the collection's simulator, run by the project's PYTHON): made for
    its preset, kept while the preset is the same."""

    settings: Settings
    node: Node
    python: str

    @property
    def name(self) -> str:
        return "simulated root of " + self.node.name

    def files(self) -> list[FileSpec]:
        return [FileSpec(NodePaths(self.settings, self.node).dir + "/sim-preset", self.node.preset + "\n")]

    def up(self, host: Host) -> None:
        p = NodePaths(self.settings, self.node)
        if host.read(p.dir + "/sim-preset").strip() == self.node.preset and os.path.isdir(p.sim_dir):
            log("simulated MetaX node %s (%s) present at %s" % (self.node.name, self.node.preset, p.sim_dir))
            try:
                host.run(sim_refresh_argv(self.python, p.sim_dir))
            except RuntimeError as exc:
                raise ClusterError("cannot update the mx-smi of the simulated node at %s: %s" % (p.sim_dir, exc))
            return
        host.mkdir(self.settings.sim_parent)
        try:
            host.run(sim_create_argv(self.python, self.node.preset, p.sim_dir))
        except RuntimeError as exc:
            raise ClusterError("the simulated node generator failed for preset %s: %s" % (self.node.preset, exc))
        for f in self.files():
            host.write(f)

    def ready(self, host: Host) -> bool:
        return os.path.isdir(NodePaths(self.settings, self.node).sim_dir + "/dev")

    def down(self, host: Host) -> None:
        """Nothing: the teardown plan removes the simulated roots' parent when `up` made it."""


@dataclass(frozen=True)
class NodeComponent:
    """A GPU node. ``files()`` is pure; the lifecycle needs TOOLS (the binaries), NODES (every node: the
    routes), PYTHON (the simulator's interpreter) and IMAGES (archives its containerd imports, and the
    references that must be there afterwards)."""

    settings: Settings
    node: Node
    inputs: Inputs
    containerd_config_version: int = 3
    tools: Optional[Tools] = None
    nodes: tuple[Node, ...] = ()
    python: str = "python3"
    images: tuple[str, ...] = ()
    want_images: tuple[str, ...] = ()
    wait: float = 1.0  # scales the timeouts of its waits (tests)

    @property
    def name(self) -> str:
        return "node " + self.node.name

    def files(self) -> list[FileSpec]:
        c = containerd.config_for(self.settings, self.node, self.inputs.runc, self.inputs.registry_password,
                                  self.containerd_config_version)
        return [network.cni_file(self.settings, self.node),
                containerd.config_file(self.settings, self.node, c),
                kubelet.config_file(self.settings, self.node),
                kube_proxy.config_file(self.settings, self.node),
                FileSpec(NodePaths(self.settings, self.node).dir + "/sim-preset", self.node.preset + "\n")]

    # ---------------------------------------------------------------- lifecycle

    def _tools(self) -> Tools:
        if self.tools is None:
            raise ValueError("NodeComponent(%s): the lifecycle needs tools" % self.node.name)
        return self.tools

    def parts(self) -> "NodeParts":
        t = self._tools()
        return NodeParts(SimRootComponent(self.settings, self.node, self.python),
                         NodeNetworkComponent(self.settings, self.node, self.nodes or (self.node,)),
                         containerd.ContainerdComponent(self.settings, self.node, self.inputs.runc,
                                                        self.inputs.registry_password, t.containerd_bin,
                                                        self.containerd_config_version),
                         kubelet.KubeletComponent(self.settings, self.node, t.kube_bin),
                         kube_proxy.KubeProxyComponent(self.settings, self.node, t.kube_bin))

    def cgroups_up(self) -> None:
        """Each kubelet its own cgroupRoot (two kubelets on one root remove each other's pod cgroups)."""
        for d in cgroup_dirs(self.settings, self.node, hierarchies()):
            os.makedirs(d, exist_ok=True)

    def namespaces_up(self, host: Host) -> None:
        """The holder process, and the node's directories bind-mounted at the standard paths inside it."""
        p, s = NodePaths(self.settings, self.node), self.settings
        for d in (p.kubelet_dir, p.dir + "/cni-cache", p.dir + "/cdi-etc", p.run + "/containerd", p.run + "/cdi",
                  # mount points on the machine (empty there)
                  s.kubelet_dir, s.sim_root, "/var/lib/cni", "/run/containerd", "/etc/cdi", "/run/cdi"):
            os.makedirs(d, exist_ok=True)
        holder = holder_process(self.node)
        if not host.running(holder.name):
            host.start(holder)
            deadline = time.monotonic() + 5
            # running once nsenter and unshare have exec'd `sleep`
            while not host.running(holder.name) and not host.exited(holder.name) and time.monotonic() < deadline:
                time.sleep(0.05)
            if not host.running(holder.name):
                raise ClusterError("node %s: cannot start its namespace holder (log %s/%s.log)"
                                   % (self.node.name, s.logs, holder.name))
        pid = host.pid(holder.name)
        for src, dst in bind_mounts(s, self.node):
            if not same_file(src, "/proc/%d/root%s" % (pid, dst)):
                host.run(["nsenter", "-t", str(pid), "-m", "-n", "--", "mount", "--bind", src, dst])

    def up(self, host: Host) -> None:
        """Everything of the node up to a healthy kubelet; kube-proxy started (ready() waits for both)."""
        p = self.parts()
        ctrd, klet = p.containerd, p.kubelet
        p.sim.up(host)
        p.network.up(host)
        self.cgroups_up()
        self.namespaces_up(host)
        ctrd.up(host)
        wait_for(host, "containerd of %s (%s)" % (self.node.name, NodePaths(self.settings, self.node).socket),
                 60 * self.wait, ctrd.name, lambda: ctrd.ready(host))
        missing = ctrd.import_images(host, self.images, self.want_images)
        if missing:
            raise ClusterError("the image %s is not in the containerd of %s after import"
                               % (missing[0], self.node.name))
        klet.up(host)
        wait_for(host, "kubelet of %s /healthz" % self.node.name, 120 * self.wait, klet.name,
                 lambda: klet.ready(host))
        p.kube_proxy.up(host)

    def ready(self, host: Host) -> bool:
        p = self.parts()
        return p.kubelet.ready(host) and p.kube_proxy.ready(host)

    def stop_kubernetes(self, host: Host) -> None:
        """kubelet and kube-proxy (the first step of `down`, while containerd still runs)."""
        p = self.parts()
        p.kubelet.down(host)
        p.kube_proxy.down(host)

    def stop_runtime(self, host: Host) -> None:
        """containerd with whatever still runs in it, every leftover process of the node, the holder."""
        self.parts().containerd.down(host)
        self.kill_leftovers(host)
        host.stop(holder_process(self.node).name)

    def kill_leftovers(self, host: Host) -> None:
        """Every process still in the node's network namespace or under its cgroupRoot (shims, containers)."""
        pids: set[str] = set()
        try:
            pids.update(host.run(["ip", "netns", "pids", self.node.netns]).split())
        except RuntimeError:
            pass
        for d in cgroup_dirs(self.settings, self.node, hierarchies()):
            for dirpath, _dirs, names in os.walk(d):
                if "cgroup.procs" in names:
                    pids.update((host.read(dirpath + "/cgroup.procs") or "").split())
        pids.discard(str(host.pid(holder_process(self.node).name)))
        found = False
        for pid in sorted(pids):
            try:
                os.kill(int(pid), 9)
                found = True
            except (OSError, ValueError):
                pass
        if found:
            warn("killed leftover processes of node %s" % self.node.name)
            time.sleep(0.5)

    def down(self, host: Host) -> None:
        """This node alone (the cluster's `down` runs the steps node by node in its own order)."""
        self.stop_kubernetes(host)
        self.stop_runtime(host)
        self.parts().network.down(host)


@dataclass(frozen=True)
class NodeParts:
    """A node's components, in the order `up` starts them."""

    sim: SimRootComponent
    network: "NodeNetworkComponent"
    containerd: containerd.ContainerdComponent
    kubelet: kubelet.KubeletComponent
    kube_proxy: kube_proxy.KubeProxyComponent


def same_file(a: str, b: str) -> bool:
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def host_binds_up(settings: Settings, first: Node) -> None:
    """The first node's kubelet dir and simulated root also at the standard paths on the machine (what
    single-node tests and tools read); made before any node namespace, which then inherits them."""
    for src, dst in host_bind_mounts(settings, first):
        os.makedirs(src, exist_ok=True)
        os.makedirs(dst, exist_ok=True)
        if not same_file(src, dst):  # a bind mount of the same filesystem: os.path.ismount cannot tell
            subprocess.run(["mount", "--bind", src, dst], check=True)


@dataclass(frozen=True)
class NodeNetworkComponent:
    """A node's network: its namespace on the cluster bridge (veth, address, default route via the host),
    the pod CIDR routes (its own from the host, the others' from it) and its CNI config."""

    settings: Settings
    node: Node
    nodes: tuple[Node, ...]  # every node: the routes to the others' pod CIDRs

    @property
    def name(self) -> str:
        return "network of " + self.node.name

    def files(self) -> list[FileSpec]:
        return [network.cni_file(self.settings, self.node)]

    def routes(self) -> list[network.Route]:
        return [r for r in network.routes(self.nodes)
                if r.netns == self.node.netns or (not r.netns and r.dest == self.node.pod_cidr)]

    def up(self, host: Host) -> None:
        n, ns = self.node, self.node.netns
        host.mkdir(NodePaths(self.settings, n).cni_dir + "/ipam")
        for f in self.files():
            host.write(f)
        if not host.ok(["test", "-e", "/run/netns/" + ns]):
            host.run(["ip", "netns", "add", ns])
        if not host.ok(["ip", "link", "show", n.veth]):
            host.run(["ip", "link", "add", n.veth, "type", "veth", "peer", "name", "eth0", "netns", ns])
            host.run(["ip", "link", "set", n.veth, "master", CLUSTER_BRIDGE, "up"])
            host.run(["ip", "-n", ns, "addr", "add", n.ip + "/24", "dev", "eth0"])
            host.run(["ip", "-n", ns, "link", "set", "eth0", "up"])
            host.run(["ip", "-n", ns, "link", "set", "lo", "up"])
        host.run(["ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.ip_forward=1"])
        host.run(["ip", "-n", ns, "route", "replace", "default", "via", HOST_IP])
        for r in self.routes():
            host.run(r.argv())

    def ready(self, host: Host) -> bool:
        """The node's address, and each of its routes as planned."""
        ns = self.node.netns
        if not host.ok(["ip", "-n", ns, "addr", "show", "dev", "eth0"]):
            return False
        if " %s/24 " % self.node.ip not in host.run(["ip", "-n", ns, "-4", "-o", "addr", "show", "dev", "eth0"]):
            return False
        for r in self.routes():
            show = (["ip", "-n", r.netns] if r.netns else ["ip"]) + ["route", "show", r.dest]
            if host.run(show).split() != [r.dest, "via", r.via, "dev", r.dev]:
                return False
        return True

    def down(self, host: Host) -> None:
        """Deleting the namespace takes its end of the veth and with it ours; the host's route goes with it."""
        host.ok(["ip", "netns", "delete", self.node.netns])
        host.ok(["ip", "link", "delete", self.node.veth])
        host.ok(["ip", "route", "del", self.node.pod_cidr])
