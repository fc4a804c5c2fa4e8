# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Does a running cluster match what the package generates? Compared read-only.

Byte for byte: every generated file (node table, kubeconfigs, registry and
containerd configs, registry host config, CNI, kubelet and kube-proxy configs,
the scheduler manifest, cluster.env, nodes.json) and its mode, and each
component's command line (/proc/<pid>/cmdline). Structurally, where the
content is made at random at `up`: each certificate's subject, SANs, usages,
issuer and signature (openssl). Also the iptables chains, the pod routes and
the baseline (its files re-rendered from the parsed record, and the teardown
plan for the machine as it is now must not touch anything the baseline lists).
"""

from __future__ import annotations

import glob
import os
import ssl
import stat
import subprocess
import urllib.request
from dataclasses import dataclass
from typing import Optional

from . import apiserver, binaries, controller_manager, containerd, edge, envfile, etcd
from . import baseline as baseline_mod
from . import kube_proxy, kubelet, network, pki, registries, status
from . import node as node_mod
from .cluster import generated_files
from .component import FileSpec, ProcessSpec, Write, start_hash
from .nodes import Node
from .settings import Settings


@dataclass(frozen=True)
class Result:
    path: str
    verdict: str  # identical | structural | differs | missing | patched
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.verdict in ("identical", "structural", "patched")


def _mode(path: str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def compare_file(spec: FileSpec, check_mode: bool = True) -> Result:
    have = edge.read_text(spec.path)
    if have is None:
        return Result(spec.path, "missing")
    if have != spec.content:
        return Result(spec.path, "differs", _first_difference(spec.content, have))
    if check_mode and _mode(spec.path) != spec.mode:
        return Result(spec.path, "differs", "mode %o, expected %o" % (_mode(spec.path), spec.mode))
    return Result(spec.path, "identical")


def _first_difference(want: str, have: str) -> str:
    for i, (w, h) in enumerate(zip(want.splitlines(), have.splitlines()), start=1):
        if w != h:
            return "line %d: expected %r, found %r" % (i, w, h)
    return "lengths differ: expected %d lines, found %d" % (len(want.splitlines()), len(have.splitlines()))


def _is_subsequence(small: list[str], big: list[str]) -> bool:
    it = iter(big)
    return all(line in it for line in small)


def compare_scheduler_manifest(spec: FileSpec) -> Result:
    """Written once (IF_ABSENT); metax.gpu.scheduler_extender may have patched it since: then every line
    `up` wrote is still there, in order, and what was added carries the extender's --config."""
    r = compare_file(spec, check_mode=False)
    if r.verdict != "differs" or spec.write is not Write.IF_ABSENT:
        return r
    have = (edge.read_text(spec.path) or "").splitlines()
    want = spec.content.splitlines()
    added = [line for line in have if line not in want]
    if _is_subsequence(want, have) and any("--config=" in line for line in added):
        return Result(spec.path, "patched", "every line up wrote is there; scheduler_extender added %d" % len(added))
    return r


# ---------------------------------------------------------------- certificates
def _openssl(*args: str) -> str:
    return subprocess.run(["openssl", *args], capture_output=True, text=True, check=True).stdout


def compare_cert(settings: Settings, spec: pki.CertSpec) -> Result:
    crt = "%s/%s.crt" % (settings.pki, spec.name)
    if not os.path.exists(crt):
        return Result(crt, "missing")
    text = _openssl("x509", "-in", crt, "-noout", "-subject", "-issuer", "-ext",
                    "subjectAltName,extendedKeyUsage,keyUsage,basicConstraints", "-nameopt", "compat")
    problems = []
    subject = next((ln for ln in text.splitlines() if ln.startswith("subject=")), "")
    if subject != "subject=" + spec.subject:
        problems.append("%s, expected subject=%s" % (subject, spec.subject))
    if "issuer=/CN=kubernetes" not in text:
        problems.append("not issued by the cluster CA")
    usages = {"serverAuth": "TLS Web Server Authentication", "clientAuth": "TLS Web Client Authentication"}
    want_eku = ", ".join(usages[u] for u in spec.usage.value.split(","))
    if want_eku not in text:
        problems.append("extended key usage is not %s" % want_eku)
    if "CA:FALSE" not in text or "Digital Signature, Key Encipherment" not in text:
        problems.append("basic constraints / key usage differ")
    want_sans = ", ".join(s.replace("IP:", "IP Address:") for s in spec.sans)
    sans_line = ""
    lines = text.splitlines()
    for i, ln in enumerate(lines):
        if "Subject Alternative Name" in ln and i + 1 < len(lines):
            sans_line = lines[i + 1].strip()
    if sans_line != want_sans:
        problems.append("SANs %r, expected %r" % (sans_line, want_sans))
    if "ASN1 OID: prime256v1" not in _openssl("x509", "-in", crt, "-noout", "-text"):
        problems.append("not an EC P-256 key")
    verify = subprocess.run(["openssl", "verify", "-CAfile", settings.pki + "/ca.crt", crt], capture_output=True,
                            text=True, check=False)
    if verify.returncode != 0:
        problems.append("does not verify against ca.crt: " + verify.stdout.strip())
    if problems:
        return Result(crt, "differs", "; ".join(problems))
    return Result(crt, "structural", "subject, SANs, usages, issuer, P-256, signature")


# ---------------------------------------------------------------- processes
def _cmdline(settings: Settings, name: str) -> Optional[list[str]]:
    pid = (edge.read_text("%s/%s.pid" % (settings.pids, name)) or "").strip()
    if not pid:
        return None
    try:
        with open("/proc/%s/cmdline" % pid, "rb") as fh:
            return [a.decode() for a in fh.read().split(b"\0")[:-1]]
    except OSError:
        return None


def compare_process(settings: Settings, spec: ProcessSpec) -> Result:
    """The command line it runs, and the restart hash `start` recorded for it (so `up` adopts it)."""
    label = "process " + spec.name
    have = _cmdline(settings, spec.name)
    if have is None:
        return Result(label, "missing", "no running process recorded in %s" % settings.pids)
    want = [os.path.realpath(spec.argv[0])] + list(spec.argv[1:])
    if have != want:
        return Result(label, "differs", "expected %s, runs %s" % (" ".join(want), " ".join(have)))
    recorded = (edge.read_text("%s/%s.hash" % (settings.pids, spec.name)) or "").strip()
    try:
        contents = [edge.read_bytes(f) for f in spec.config_files]
    except OSError as exc:
        return Result(label, "missing", "config file: %s" % exc)
    if start_hash(spec, contents) != recorded:
        return Result(label, "differs", "the restart hash is not the one cluster.sh recorded")
    return Result(label, "identical", "command line and restart hash")


def _holder_pid(settings: Settings, node: Node) -> int:
    pid = (edge.read_text("%s/ns-%s.pid" % (settings.pids, node.name)) or "").strip()
    return int(pid) if pid.isdigit() else 0


def processes(settings: Settings, nodes: list[Node], kube_bin: str, containerd_bin: str) -> list[ProcessSpec]:
    specs = [etcd.process(settings), apiserver.process(settings, kube_bin + "/kube-apiserver"),
             controller_manager.process(settings, kube_bin + "/kube-controller-manager"),
             registries.process(registries.plain(settings, "")), registries.process(registries.auth(settings, ""))]
    for n in nodes:
        holder = _holder_pid(settings, n)
        specs += [node_mod.holder_process(n),
                  containerd.process(settings, n, containerd_bin + "/containerd", holder),
                  kubelet.process(settings, n, kube_bin + "/kubelet", holder),
                  kube_proxy.process(settings, n, kube_bin + "/kube-proxy", holder)]
    return specs


def compare_mounts(settings: Settings, nodes: list[Node]) -> list[Result]:
    """Each node's bind mounts, as its mount namespace sees them (through /proc/<holder>/root, read-only),
    and the first node's on the host: the target is the source (same device and inode), as `up` checks."""
    out = []
    checks = [("host", "", src, dst) for src, dst in node_mod.host_bind_mounts(settings, nodes[0])]
    for n in nodes:
        pid = _holder_pid(settings, n)
        checks += [(n.name, "/proc/%d/root" % pid, src, dst) for src, dst in node_mod.bind_mounts(settings, n)]
    for where, root, src, dst in checks:
        label = "mount %s at %s in %s" % (src, dst, where)
        try:
            a, b = os.stat(src), os.stat(root + dst)
        except OSError as exc:
            out.append(Result(label, "missing", str(exc)))
            continue
        same = (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)
        out.append(Result(label, "identical" if same else "differs"))
    return out


def compare_cgroups(settings: Settings, nodes: list[Node]) -> list[Result]:
    hierarchies = sorted(d for d in glob.glob("/sys/fs/cgroup/*/") if os.path.isfile(d + "cgroup.procs"))
    out = []
    for n in nodes:
        dirs = node_mod.cgroup_dirs(settings, n, hierarchies)
        missing = [d for d in dirs if not os.path.isdir(d)]
        out.append(Result("cgroupRoot of %s in %d hierarchies" % (n.name, len(dirs)),
                          "differs" if missing or not dirs else "identical", ", ".join(missing)))
    return out


def compare_registry_cert(settings: Settings) -> Result:
    crt = settings.state_dir + "/registry-auth/tls.crt"
    if not os.path.exists(crt):
        return Result(crt, "missing")
    text = _openssl("x509", "-in", crt, "-noout", "-subject", "-ext", "subjectAltName", "-nameopt", "compat")
    want = registries.tls_sans().split("=", 1)[1].split(",")
    sans = next((ln.strip() for ln in text.splitlines() if ln.strip().startswith(("IP Address:", "DNS:"))), "")
    problems = []
    if "subject=" + registries.TLS_SUBJECT not in text:
        problems.append("subject: " + text.splitlines()[0])
    if sans != ", ".join(w.replace("IP:", "IP Address:") for w in want):
        problems.append("SANs " + sans)
    return Result(crt, "differs" if problems else "structural", "; ".join(problems) or "subject and SANs")


def compare_status(settings: Settings, nodes: list[Node], tools: envfile.Tools) -> Result:
    """`cluster.sh status` up to kubectl's tables, and its verdict line and exit code."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run(["bash", os.path.join(repo, "scripts", "cluster", "cluster.sh"), "status"],
                          capture_output=True, text=True, timeout=120, check=False, stdin=subprocess.DEVNULL)
    marker = "  (inside every node"
    lines = proc.stdout.splitlines(keepends=True)
    cut = next((i for i, line in enumerate(lines) if line.startswith(marker)), len(lines) - 1) + 1
    have_head, have_last = "".join(lines[:cut]), (lines[-1].rstrip("\n") if lines else "")
    states = edge.process_states(settings, status.components(nodes))
    want_head = status.render_head(settings, nodes, states, tools)
    want_last, want_rc = status.verdict(settings, nodes, states)
    if have_head != want_head:
        return Result("cluster.sh status", "differs", _first_difference(want_head, have_head))
    if (have_last, proc.returncode) != (want_last, want_rc):
        return Result("cluster.sh status", "differs", "%r exit %d, expected %r exit %d"
                      % (have_last, proc.returncode, want_last, want_rc))
    return Result("cluster.sh status", "identical", "all but kubectl's tables; verdict and exit code")


def _get(url: str, context: Optional[ssl.SSLContext]) -> int:
    # never through a proxy of the environment: these addresses are the machine's own
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context))
    try:
        with opener.open(url, timeout=5) as resp:
            return int(resp.status)
    except OSError as exc:
        return int(getattr(exc, "code", 0) or 0)


def compare_ready(settings: Settings, nodes: list[Node]) -> list[Result]:
    """The health URLs the components' ready() polls answer 200 on the running cluster (GET only)."""
    admin = ssl.create_default_context(cafile=settings.pki + "/ca.crt")
    admin.load_cert_chain(settings.pki + "/admin.crt", settings.pki + "/admin.key")
    unverified = ssl.create_default_context()
    unverified.check_hostname = False
    unverified.verify_mode = ssl.CERT_NONE  # the controller-manager's self-signed serving certificate
    urls: list[tuple[str, Optional[ssl.SSLContext]]] = [
        (etcd.health_url(settings), None), (apiserver.readyz_url(settings), admin),
        (controller_manager.healthz_url(), unverified)]
    for n in nodes:
        urls += [(kubelet.healthz_url(n), None), (kube_proxy.healthz_url(n), None)]
    out = []
    for url, context in urls:
        code = _get(url, context)
        out.append(Result("ready " + url, "identical" if code == 200 else "differs", "HTTP %d" % code))
    return out


# ---------------------------------------------------------------- network
def compare_chains(settings: Settings) -> list[Result]:
    out = []
    for chain in network.chains(settings):
        label = "iptables -t %s -S %s" % (chain.table, chain.name)
        proc = subprocess.run(["iptables", "-t", chain.table, "-S", chain.name], capture_output=True, text=True,
                              check=False)
        have = proc.stdout.splitlines()
        if have == network.listed(chain):
            out.append(Result(label, "identical"))
        else:
            out.append(Result(label, "differs", "expected %s, found %s" % (network.listed(chain), have)))
    return out


def compare_routes(nodes: list[Node]) -> list[Result]:
    out = []
    for route in network.routes(nodes):
        argv = (["ip", "-n", route.netns] if route.netns else ["ip"]) + ["route", "show", route.dest]
        have = subprocess.run(argv, capture_output=True, text=True, check=False).stdout.split()
        want = [route.dest, "via", route.via, "dev", route.dev]
        label = "route %s%s" % (route.dest, " in " + route.netns if route.netns else " on the host")
        out.append(Result(label, "identical") if have == want else Result(label, "differs", " ".join(have)))
    return out


# ---------------------------------------------------------------- baseline
def compare_baseline(settings: Settings) -> list[Result]:
    files = {}
    for name in baseline_mod.FILES + ("complete",):
        text = edge.read_text("%s/%s" % (settings.baseline_dir, name))
        if text is not None:
            files[name] = text
    b = baseline_mod.parse(files)
    out = []
    for name, content in baseline_mod.render(b, settings).items():
        out.append(compare_file(FileSpec("%s/%s" % (settings.baseline_dir, name), content), check_mode=False))
    plan = baseline_mod.plan_down(settings, b, edge.observe(settings))
    bad = baseline_mod.violates_baseline(plan, b, settings)
    out.append(Result("teardown plan of the running cluster", "differs" if bad else "structural",
                      "would remove what existed before: %s" % bad if bad else
                      "removes %d paths, %d netns, %d cgroups, %d links, %d chains; nothing the baseline lists"
                      % (len(plan.paths), len(plan.netns), len(plan.cgroups), len(plan.links), len(plan.chains))))
    return out


# ---------------------------------------------------------------- all
def go_version(source: str) -> str:
    """The Go version lib.sh keys the Kubernetes binaries by (it runs `go env GOVERSION`)."""
    lib = os.path.join(source, "scripts", "cluster", "lib.sh")
    proc = subprocess.run(["bash", "-c", 'source "$1" && go_version', "bash", lib], capture_output=True, text=True,
                          check=False)
    return proc.stdout.strip() or "unknown"


def compare_running(settings: Settings, source: str = "") -> list[Result]:
    """Everything, while no `up`/`down` runs (cluster.sh's lock, held shared for these few seconds)."""
    with edge.shared_cluster_lock(settings):
        return _compare_running(settings, source)


def _compare_running(settings: Settings, source: str) -> list[Result]:
    nodes = edge.recorded_nodes(settings)
    if not nodes:
        return [Result(settings.state_dir + "/node-table", "missing", "no running cluster")]
    inputs = edge.load_inputs(settings, nodes)
    results: list[Result] = []
    for spec in generated_files(settings, nodes, inputs):
        if spec.path.endswith("/kube-scheduler.yaml"):
            results.append(compare_scheduler_manifest(spec))
        else:
            results.append(compare_file(spec))
    results += [compare_cert(settings, c) for c in pki.plan(nodes)]
    source = source or edge.env_source(settings) or edge.recorded_source(settings) or ""
    kube_bin = binaries.k8s_bin_dir(settings, go_version(source))
    ctrd_bin = binaries.containerd_bin_dir(settings)
    tools = envfile.Tools(
        kube_bin=kube_bin, containerd_bin=ctrd_bin, helm_bin=binaries.helm_bin_dir(settings),
        helm_plugins=binaries.helm_plugins_dir(settings),
        containers_conf=os.path.join(source, "scripts/cluster/containers/containers.conf"),
        containers_registries_conf=os.path.join(source, "scripts/cluster/containers/registries.conf"))
    results.append(compare_file(FileSpec(settings.state_dir + "/cluster.env",
                                         envfile.cluster_env(settings, nodes, tools)), check_mode=False))
    results.append(compare_file(FileSpec(settings.state_dir + "/nodes.json", envfile.nodes_json(settings, nodes)),
                                check_mode=False))
    results += [compare_process(settings, p) for p in processes(settings, nodes, kube_bin, ctrd_bin)]
    results.append(compare_status(settings, nodes, tools))
    results.append(compare_registry_cert(settings))
    results += compare_ready(settings, nodes)
    results += compare_mounts(settings, nodes)
    results += compare_cgroups(settings, nodes)
    results += compare_chains(settings)
    results += compare_routes(nodes)
    results += compare_baseline(settings)
    return results
