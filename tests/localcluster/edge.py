# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Read a cluster's state, read-only: the node plan and the inputs its files embed (PKI, secrets, paths).

Nothing here writes: the equivalence check runs against the shared running
cluster (docs/local-cluster.md).
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import os
import shutil
import subprocess
import time
from typing import Iterator, Mapping, Optional

from . import baseline, status
from . import nodes as nodes_mod
from . import pki
from .component import Inputs
from .nodes import Node
from .settings import MARKER_NAME, Settings


def read_text(path: str) -> Optional[str]:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError:
        return None


def read_bytes(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def first_node_name(settings: Settings) -> str:
    """The recorded name, else METAX_NODE_NAME, else vm.

    A fixed name, not the machine's hostname: the example inventory, the demo and the cluster tests
    address the nodes as vm, vm-2, ... and must work on any machine. Nothing needs the name to resolve:
    the apiserver reaches each kubelet at its own InternalIP, which its serving certificate lists.
    """
    recorded = read_text(settings.state_dir + "/node-name")
    return recorded.strip() if recorded is not None else settings.first_node_name


def planned_nodes(settings: Settings, env: Mapping[str, str]) -> list[Node]:
    """What `cluster.sh plan` prints: NODES, else the running cluster's presets, else one METAX_SIM_PRESET node.

    A NODES of only blanks plans no node (`up` then refuses it).
    """
    if env.get("NODES", "") and not env["NODES"].split():
        return []
    presets = nodes_mod.parse_nodes_var(env.get("NODES", ""))
    if not presets:
        table = read_text(settings.state_dir + "/node-table")
        if table is not None:
            presets = [n.preset for n in nodes_mod.parse_table(table)]
    if not presets:
        presets = [settings.sim_preset]
    return nodes_mod.plan(presets, first_node_name(settings))


def recorded_nodes(settings: Settings) -> list[Node]:
    table = read_text(settings.state_dir + "/node-table")
    return nodes_mod.parse_table(table) if table else []


def load_inputs(settings: Settings, nodes: list[Node]) -> Inputs:
    """Certificates, secrets and the password the running cluster's files embed."""
    names = [c.name for c in pki.plan(nodes)]
    certs = {n: (read_bytes("%s/%s.crt" % (settings.pki, n)), read_bytes("%s/%s.key" % (settings.pki, n)))
             for n in names}

    def secret(path: str) -> str:
        return (read_text(path) or "").strip()

    return Inputs(ca_crt=read_bytes(settings.pki + "/ca.crt"), certs=certs,
                  registry_secret=secret(settings.state_dir + "/registry/secret"),
                  registry_auth_secret=secret(settings.state_dir + "/registry-auth/secret"),
                  registry_password=secret(settings.state_dir + "/registry-auth/password"),
                  runc=shutil.which("runc", path=os.environ.get("PATH", "") + ":/usr/sbin:/usr/bin") or "runc")


def recorded_source(settings: Settings) -> Optional[str]:
    """The checkout the running cluster was started from (its identity record)."""
    text = read_text(settings.state_dir + "/identity.json")
    if not text:
        return None
    try:
        source = json.loads(text).get("source")
    except ValueError:
        return None
    return source if isinstance(source, str) else None


def _find(root: str) -> tuple[str, ...]:
    """`cd ROOT && find . -mindepth 1 | sort` (relative, "./" prefixed)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        for name in dirnames + filenames:
            out.append("./" + (name if rel == "." else rel + "/" + name))
    return tuple(sorted(out))


def _lines(argv: list[str]) -> list[str]:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    except OSError:
        return []
    return proc.stdout.splitlines()


def observe_mounts() -> list[str]:
    """Every mount point of this mount namespace (/proc/self/mountinfo)."""
    mounts = []
    for line in (read_text("/proc/self/mountinfo") or "").splitlines():
        fields = line.split()
        if len(fields) > 4:
            mounts.append(fields[4].replace("\\040", " "))
    return mounts


def observe(settings: Settings) -> baseline.Observed:
    """The machine as it is now (read-only): what recording and teardown decide on."""
    present = frozenset(p for p in settings.tracked_paths() if os.path.lexists(p))
    cgroups = sorted(set(glob.glob("/sys/fs/cgroup/*/kubepods") + glob.glob("/sys/fs/cgroup/kubepods")
                         + glob.glob("/sys/fs/cgroup/*/%s*" % settings.cgroup_prefix)))
    cgroups = [c for c in cgroups if os.path.isdir(c)]
    netns = sorted(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else []
    chains = []
    for tool in ("iptables", "ip6tables"):
        for table in baseline.TABLES:
            for line in _lines([tool, "-t", table, "-S"]):
                words = line.split()
                if len(words) == 2 and words[0] == "-N":
                    chains.append(baseline.Chain(tool, table, words[1]))
    links = [ln.split(": ")[1].split("@")[0] for ln in _lines(["ip", "-o", "link", "show"]) if ln.count(": ") >= 1]
    mounts = observe_mounts()
    return baseline.Observed(
        present=present,
        etc_files=_find(settings.kube_etc) if os.path.isdir(settings.kube_etc) else (),
        kubelet_files=_find(settings.kubelet_dir) if os.path.isdir(settings.kubelet_dir) else (),
        cgroups=tuple(cgroups), netns=tuple(netns), chains=tuple(chains), links=tuple(links), mounts=tuple(mounts),
        ip_forward=(read_text("/proc/sys/net/ipv4/ip_forward") or "").strip(),
        state_exists=os.path.isdir(settings.state_dir),
        etc_marker=os.path.exists(os.path.join(settings.kube_etc, MARKER_NAME)),
        kubelet_marker=os.path.exists(os.path.join(settings.kubelet_dir, MARKER_NAME)))


@contextlib.contextmanager
def shared_cluster_lock(settings: Settings, timeout: float = 600.0) -> Iterator[bool]:
    """Hold cluster.sh's own lock (<cache>/cluster.lock, exclusive during up/down/restart-kubelet) shared:
    a read sees no half-written state. Yields whether it got the lock (False: no lock file, or timeout)."""
    try:
        fh = open(settings.cache_dir + "/cluster.lock", "rb")  # pylint: disable=consider-using-with
    except OSError:
        yield False
        return
    with fh:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
                break
            except OSError:
                if time.monotonic() >= deadline:
                    yield False
                    return
                time.sleep(0.5)
        try:
            yield True
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def process_states(settings: Settings, names: list[str]) -> dict[str, status.ProcessState]:
    """Each component's state from its PID files and /proc (read-only)."""
    out = {}
    for name in names:
        pid = read_text("%s/%s.pid" % (settings.pids, name))
        pid_s = (pid or "").strip()
        alive = bool(pid_s) and os.path.isdir("/proc/" + pid_s)
        try:
            actual: Optional[str] = os.readlink("/proc/%s/exe" % pid_s) if alive else None
        except OSError:
            actual = None
        out[name] = status.process_state(pid, alive, read_text("%s/%s.exe" % (settings.pids, name)), actual)
    return out


CONTAINERS_CONF_SUFFIX = "/scripts/cluster/containers/containers.conf"


def env_source(settings: Settings) -> Optional[str]:
    """The checkout whose `up` last wrote cluster.env (its CONTAINERS_CONF is inside it): an input of that
    file like the secrets are. Test sessions of several checkouts share one cluster, and each reusing `up`
    rewrites cluster.env -- not always in the order the identity record was written."""
    for line in (read_text(settings.state_dir + "/cluster.env") or "").splitlines():
        if line.startswith("export CONTAINERS_CONF="):
            value = line.split("=", 1)[1]
            if value.endswith(CONTAINERS_CONF_SUFFIX) and os.path.exists(value):
                return value[:-len(CONTAINERS_CONF_SUFFIX)]
    return None
