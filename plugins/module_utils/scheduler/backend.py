# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""I/O of scheduler_extender: read both files, back up, write, wait, roll back.

current -> desired (plan.py) -> needs change -> back up -> write -> wait ->
(roll back on failure). The node's files go through an injected HostRoot; the
two observations of the running scheduler (its processes and its health
endpoint) are injected callables, so the sequence is tested without a cluster
and the real ones are exercised against the local cluster's scheduler.

Safety rules (the kubelet runs every non-hidden file of the manifest
directory): nothing but the manifest itself is ever written there, through a
dot-prefixed temporary file renamed over it; backups go to ``backup_dir``,
which must be outside the manifest directory.
"""

from __future__ import annotations

import ctypes
import http.client
import os
import select
import signal
import socket
import ssl
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

from ansible_collections.metax.gpu.plugins.module_utils.errors import MetaxGpuError
from ansible_collections.metax.gpu.plugins.module_utils.host import HostRoot
from ansible_collections.metax.gpu.plugins.module_utils.names import RESOURCE_NAME
from ansible_collections.metax.gpu.plugins.module_utils.scheduler import config as cfg
from ansible_collections.metax.gpu.plugins.module_utils.scheduler import manifest as mf
from ansible_collections.metax.gpu.plugins.module_utils.scheduler import plan
from ansible_collections.metax.gpu.plugins.module_utils.scheduler import restart

SCHEDULER_BINARY = "kube-scheduler"

Process = Tuple[int, List[str]]                 # pid, command line
Processes = Callable[[], List[Process]]         # the running kube-scheduler processes
Probe = Callable[[str, Optional[int]], bool]    # (URL, pid whose network to use) -> answered as wanted
Clock = Callable[[], float]
Sleep = Callable[[float], None]
Signal = Callable[[int], None]
# Consecutive good observations, one second apart, before the scheduler counts as
# up: a configuration it rejects makes it exit within a second, so one good look
# at a freshly started process proves nothing.
STABLE_CHECKS = 3


class ExtenderApplyError(MetaxGpuError):
    """The change was made, the scheduler did not come back, and the backup was restored."""


@dataclass(frozen=True)
class Request:
    state: str
    manifest_path: str                  # node path, e.g. /etc/kubernetes/manifests/kube-scheduler.yaml
    config_path: str
    backup_dir: str
    options: Optional[cfg.ExtenderOptions] = None
    kubernetes_version: Optional[str] = None
    wait: bool = True
    wait_timeout: float = 180.0
    health_url: Optional[str] = None
    check_extender: bool = True


@dataclass
class Outcome:
    changed: bool
    drift: bool
    manifest_before: str
    manifest_after: str
    config_before: Optional[str]
    config_after: Optional[str]
    kubernetes_version: Optional[str] = None
    api_version: Optional[str] = None
    previous_config: Optional[str] = None
    backup: Optional[str] = None
    waited: bool = False
    restarted: bool = False
    health_url: Optional[str] = None
    warnings: List[str] = field(default_factory=list)

    def diff(self) -> List[Dict[str, str]]:
        return [
            {"before_header": "manifest", "after_header": "manifest",
             "before": self.manifest_before, "after": self.manifest_after},
            # keyData (a private key) shows as a mask with a fingerprint: Ansible's own no_log masking
            # only catches the value where it appears verbatim
            {"before_header": "extender configuration", "after_header": "extender configuration",
             "before": cfg.mask_secrets(self.config_before) or "", "after": cfg.mask_secrets(self.config_after) or ""},
        ]


# ------------------------------------------------------------ observations

def scheduler_processes(proc: str = "/proc") -> List[Process]:
    """The kube-scheduler processes this machine runs (any container runtime shares the PID view)."""
    found: List[Process] = []
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        try:
            with open(os.path.join(proc, entry, "cmdline"), "rb") as handle:
                argv = [a.decode("utf-8", "replace") for a in handle.read().split(b"\0") if a]
        except OSError:
            continue        # exited while we looked
        if argv and os.path.basename(argv[0]) == SCHEDULER_BINARY:
            found.append((int(entry), argv))
    return sorted(found)


def _kubeconfig_flag(argv: Sequence[str]) -> Optional[str]:
    """The value of --kubeconfig in a command line (either form), if any."""
    for i, arg in enumerate(argv):
        if arg.startswith("--kubeconfig="):
            return arg.split("=", 1)[1]
        if arg == "--kubeconfig" and i + 1 < len(argv):
            return argv[i + 1]
    return None


def reads_node_kubeconfig(pid: int, argv: Sequence[str], host: HostRoot, proc: str = "/proc") -> bool:
    """Whether process ``pid`` sees its --kubeconfig as the same file as the node (``host``) does.

    A static pod's scheduler reads the node's kubeconfig through a hostPath
    mount, so both name one file. A scheduler of another cluster on the same
    machine (a nested one, or one in namespaces of its own) can run the very
    same command line and manifest with files of its own: it is not this
    node's, and must be neither waited for nor stopped. Unknown (no such flag,
    the process gone, a file unreadable) counts as the node's, as before.
    """
    path = _kubeconfig_flag(argv)
    if not path or not os.path.isabs(path):
        return True
    try:
        theirs = os.stat("%s/%d/root%s" % (proc, pid, path))
        ours = os.stat(host.join(path))
    except OSError:
        return True
    return (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino)


_CLONE_NEWNET = 0x40000000


def in_network_of(pid: Optional[int], check: Callable[[], bool], timeout: float = 10.0) -> bool:
    """``check()`` run in the network namespace of ``pid`` (here when it is ours or unknown).

    kube-scheduler uses hostNetwork and binds 127.0.0.1: its health endpoint,
    and the extender address as it sees it, are reachable only from its network
    namespace. A node's kubelet normally shares ours; when it does not (a
    kubelet started in its own namespace, as on the local test cluster) a
    forked child enters the scheduler's namespace with setns(2) and answers
    through a pipe, so the module process never leaves its own.
    """
    if pid is None:
        return check()
    try:
        if os.stat("/proc/%d/ns/net" % pid).st_ino == os.stat("/proc/self/ns/net").st_ino:
            return check()
    except OSError:
        return check()
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the forked child
        answer = b"0"
        try:
            os.close(read_end)
            fd = os.open("/proc/%d/ns/net" % pid, os.O_RDONLY)
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.setns(fd, _CLONE_NEWNET) == 0 and check():
                answer = b"1"
        except BaseException:       # the child must reach _exit whatever happens
            answer = b"0"
        try:
            os.write(write_end, answer)
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        ready, _w, _x = select.select([read_end], [], [], timeout)
        answer = os.read(read_end, 1) if ready else b""
    finally:
        os.close(read_end)
        if not answer:
            try:
                os.kill(child, signal.SIGKILL)
            except OSError:
                pass
        os.waitpid(child, 0)
    return answer == b"1"


def _get_200(url: str, timeout: float) -> bool:
    # The serving certificate is self-signed and the endpoint local: not verified
    # (the kubelet's probe does not verify it either).
    parsed = urllib.parse.urlsplit(url)
    try:
        if parsed.scheme == "https":
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                parsed.hostname or "", parsed.port or 443, timeout=timeout, context=context)
        else:
            conn = http.client.HTTPConnection(parsed.hostname or "", parsed.port or 80, timeout=timeout)
        try:
            conn.request("GET", parsed.path or "/")
            return conn.getresponse().status == 200
        finally:
            conn.close()
    except (OSError, ValueError, http.client.HTTPException):
        return False


def http_healthy(url: str, pid: Optional[int] = None, timeout: float = 5.0) -> bool:
    """GET the scheduler's /readyz or /healthz (from its network): 200 is healthy."""
    return in_network_of(pid, lambda: _get_200(url, timeout), timeout=timeout + 5)


def _connects(url: str, timeout: float) -> bool:
    parsed = urllib.parse.urlsplit(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname or "", port), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


def extender_reachable(url: str, pid: Optional[int] = None, timeout: float = 5.0) -> bool:
    """A TCP connection to the extender's urlPrefix succeeds from the scheduler's network."""
    return in_network_of(pid, lambda: _connects(url, timeout), timeout=timeout + 5)


def terminate(pid: int) -> None:
    """SIGTERM a scheduler process; the kubelet starts the container again."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass


def probe_url(info: mf.ManifestInfo, version: Optional[tuple]) -> str:
    """The readiness URL: the manifest's probe, /readyz from 1.32 (kubeadm), else /healthz."""
    probe = info.probe or mf.Probe("https", "127.0.0.1", 10259, "/healthz")
    path = probe.path
    if path in ("/healthz", "/livez") and version is not None and version >= (1, 32):
        path = "/readyz"
    elif path == "/livez":
        path = "/healthz"
    return "%s://%s:%d%s" % (probe.scheme, probe.host, probe.port, path)


# ------------------------------------------------------------------- backend

class SchedulerExtender:
    def __init__(self, host: HostRoot, processes: Processes = scheduler_processes, health: Probe = http_healthy,
                 reachable: Probe = extender_reachable, kill: Signal = terminate,
                 pod_of: restart.PodOf = restart.pod_cgroup,
                 clock: Clock = time.monotonic, sleep: Sleep = time.sleep, stamp: Optional[str] = None,
                 of_this_node: Optional[Callable[[int, Sequence[str]], bool]] = None) -> None:
        self.host = host
        self.processes = processes
        self.of_this_node = of_this_node or (lambda pid, argv: reads_node_kubeconfig(pid, argv, host))
        self.health = health
        self.reachable = reachable
        self.kill = kill
        self.pod_of = pod_of
        self._new_pods: Set[str] = set()     # pod cgroups of schedulers started from a new manifest
        self.clock = clock
        self.sleep = sleep
        self.stamp = stamp or time.strftime("%Y%m%dT%H%M%S")

    # -- reads
    def _read(self, path: str) -> Optional[str]:
        return self.host.read_text(path) if self.host.exists(path) else None

    def _check_paths(self, req: Request) -> None:
        manifest_dir = os.path.normpath(os.path.dirname(req.manifest_path))
        backup_dir = os.path.normpath(req.backup_dir)
        if backup_dir == manifest_dir or backup_dir.startswith(manifest_dir + os.sep):
            raise MetaxGpuError(
                "backup_dir %s is inside the static pod directory %s: the kubelet would run the backup "
                "as a second scheduler; choose a directory outside it" % (req.backup_dir, manifest_dir))
        config_dir = os.path.normpath(os.path.dirname(req.config_path))
        if config_dir == manifest_dir:
            raise MetaxGpuError("config_path %s must not be in the static pod directory: the kubelet "
                                "would try to run it as a pod" % req.config_path)
        if not self.host.exists(req.manifest_path):
            raise MetaxGpuError("no kube-scheduler manifest at %s (host root %s)"
                                % (req.manifest_path, self.host.path))

    def plan(self, req: Request) -> Outcome:
        self._check_paths(req)
        manifest_before = self.host.read_text(req.manifest_path)
        config_before = self._read(req.config_path)
        if req.state == "present":
            if req.options is None:
                raise MetaxGpuError("url is required to enable the extender")
            want = plan.enabled(manifest_before, config_before, req.config_path, req.options, self._read,
                                req.kubernetes_version)
        else:
            want = plan.disabled(manifest_before, config_before, req.config_path)
        outcome = Outcome(
            changed=(want.manifest != manifest_before or want.config != config_before),
            drift=want.drift, manifest_before=manifest_before, manifest_after=want.manifest,
            config_before=config_before, config_after=want.config, previous_config=want.previous_arg)
        if want.version is not None:
            outcome.kubernetes_version = "%d.%d" % want.version
            outcome.api_version = cfg.api_version_for(want.version)
        info = mf.inspect(want.manifest)
        version = want.version
        if version is None:
            try:
                version = cfg.parse_version(req.kubernetes_version or info.image)
            except cfg.SchedulerConfigError:
                version = None
        outcome.health_url = req.health_url or probe_url(info, version)
        return outcome

    # -- writes
    def _mode(self, path: str) -> int:
        return os.stat(self.host.join(path)).st_mode & 0o7777 if self.host.exists(path) else 0o644

    def _write(self, path: str, text: Optional[str], mode: Optional[int] = None) -> None:
        """``text`` to ``path`` (None: remove it), with its mode kept (``mode``: the mode it had)."""
        if text is None:
            if self.host.exists(path):
                os.unlink(self.host.join(path))
            return
        local = self.host.join(path)
        if mode is None:
            mode = self._mode(path)
        if cfg.holds_secret(text):
            mode &= 0o700     # a private key inside: readable by its owner only (kube-scheduler runs as root)
        os.makedirs(os.path.dirname(local), exist_ok=True)
        # dot-prefixed temporary file in the same directory, renamed over the target:
        # the kubelet ignores hidden files and never sees a half-written manifest
        self.host.write_file_atomic(path, text.encode("utf-8"), mode=mode)

    def _backup(self, req: Request, outcome: Outcome) -> str:
        rel = os.path.join(req.backup_dir, "%s-%d" % (self.stamp, os.getpid()))
        local = self.host.join(rel)
        os.makedirs(local, mode=0o700, exist_ok=True)
        for path, text in ((req.manifest_path, outcome.manifest_before), (req.config_path, outcome.config_before)):
            name = os.path.basename(path)
            if text is None:
                name += ".absent"
                text = "%s did not exist before this change\n" % path
            # 0600: the configuration may hold a private key (tlsConfig.keyData)
            with os.fdopen(os.open(os.path.join(local, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600),
                           "w", encoding="utf-8") as handle:
                handle.write(text)
        return rel

    # -- waiting
    @staticmethod
    def _started_from(argv: Sequence[str], manifest_text: str) -> bool:
        """The process runs this manifest's command (argv[0] may carry a path)."""
        command = mf.inspect(manifest_text).command
        return bool(command) and list(argv[1:]) == list(command[1:]) and \
            os.path.basename(argv[0]) == os.path.basename(command[0])

    def _ours(self, outcome: Outcome) -> List[Process]:
        """The static pod's scheduler: processes started from the old or the new manifest.

        Another kube-scheduler on the node (a second scheduler deployed as a pod,
        a test's own) runs other flags, and one of another cluster on the machine
        reads another kubeconfig: neither is waited for nor stopped.
        """
        return [p for p in self.processes()
                if (self._started_from(p[1], outcome.manifest_before) or self._started_from(p[1], outcome.manifest_after))
                and self.of_this_node(p[0], p[1])]

    def _look(self, outcome: Outcome, expected: str, old_pids: Sequence[int], check_process: bool,
              check_health: bool, extender_url: Optional[str]) -> Optional[str]:
        """None when the scheduler of manifest ``expected`` runs and answers, else what is wrong, in words."""
        pid: Optional[int] = None
        if check_process:
            current = self._ours(outcome)
            stale = [p[0] for p in current if p[0] in old_pids or not self._started_from(p[1], expected)]
            new = [p[0] for p in current if p[0] not in stale]
            # their pod cgroups: a roll back waits for that pod to stop, even when a crash loop
            # leaves no process of it to see by then
            self._new_pods.update(pod for pod in map(self.pod_of, new) if pod)
            if stale:
                return "the previous kube-scheduler (pid %s) still runs" % ", ".join(str(p) for p in stale)
            if not new:
                return ("no kube-scheduler process started from the new manifest is running (a scheduler that "
                        "exits right after start usually rejects its configuration: see its container log)")
            pid = new[0]
        if check_health and not self.health(outcome.health_url or "", pid):
            return "%s does not answer 200" % outcome.health_url
        if extender_url is not None and not self.reachable(extender_url, pid):
            return ("the extender %s is not reachable from the scheduler's network and ignorable is false: "
                    "pods asking for %s would not schedule" % (extender_url, RESOURCE_NAME))
        return None

    def _wait(self, req: Request, outcome: Outcome, expected: str, old_pids: Sequence[int],
              check_process: bool, check_health: bool, extender_url: Optional[str]) -> Optional[str]:
        deadline = self.clock() + req.wait_timeout
        if not check_process:
            # Health alone cannot tell the old scheduler from the new one: watch for the
            # restart (the kubelet reacts through inotify, or its 20 s re-list) first.
            window = self.clock() + min(30.0, req.wait_timeout / 2)
            while self.clock() < window and self.health(outcome.health_url or "", None):
                self.sleep(1.0)
            if self.clock() >= window:
                outcome.warnings.append("no restart of the scheduler observed on %s" % outcome.health_url)
        good = 0
        seen = "nothing observed"
        while True:
            problem = self._look(outcome, expected, old_pids, check_process, check_health, extender_url)
            if problem is None:
                good += 1
                if good >= STABLE_CHECKS:
                    return None
            else:
                good = 0
                seen = problem
            if self.clock() >= deadline:
                return seen
            self.sleep(1.0)

    def apply(self, req: Request, outcome: Outcome) -> Outcome:
        if not outcome.changed:
            return outcome
        enabled = req.state == "present"
        before = self._ours(outcome) if req.wait else []
        old_pids = [p[0] for p in before]
        check_process = bool(before)
        check_health = req.wait and self.health(outcome.health_url or "", old_pids[0] if old_pids else None)
        extender_url = None
        if enabled and req.check_extender and req.options is not None and not req.options.ignorable:
            extender_url = req.options.url
        if req.wait and not check_process and not check_health:
            outcome.warnings.append(
                "no kube-scheduler process of this manifest visible and %s not reachable from here: not waiting "
                "for the scheduler to restart; check it yourself" % outcome.health_url)
        elif req.wait and not check_health:
            outcome.warnings.append("%s is not reachable from here; waiting for the kube-scheduler "
                                    "process only" % outcome.health_url)
        outcome.backup = self._backup(req, outcome)
        manifest_changed = outcome.manifest_after != outcome.manifest_before
        # The hostPath volume is of type File: the configuration must exist before the
        # manifest names it, and may go only once the manifest no longer does.
        if enabled:
            self._write(req.config_path, outcome.config_after)
        if manifest_changed and req.wait and check_process:
            self._replace_stopped(req, outcome, outcome.manifest_after, outcome.manifest_before, old_pids)
        else:
            self._write(req.manifest_path, outcome.manifest_after)
        if not manifest_changed and enabled and old_pids:
            # Same manifest, new configuration: the kubelet sees nothing to do, and
            # kube-scheduler reads --config only at start. Stop it; the kubelet restarts it.
            for pid in old_pids:
                self.kill(pid)
            outcome.restarted = True
        elif not manifest_changed and enabled:
            outcome.warnings.append("only %s changed and no kube-scheduler process is visible here: restart "
                                    "the kube-scheduler static pod to load it" % req.config_path)
        if req.wait and (check_process or check_health) and (manifest_changed or outcome.restarted):
            outcome.waited = True
            problem = self._wait(req, outcome, outcome.manifest_after, old_pids, check_process, check_health,
                                 extender_url)
            if problem is not None:
                self._rollback(req, outcome, enabled, check_process, check_health, problem)
        if not enabled:
            self._write(req.config_path, outcome.config_after)
        return outcome

    def _replace_stopped(self, req: Request, outcome: Outcome, text: str, previous: str,
                         running: Sequence[int], pods: Sequence[str] = ()) -> None:
        """Manifest ``text`` in place of ``previous`` once the static pod of ``running`` (and of the pod
        cgroups ``pods``) has stopped: restart.py. The manifest's mode is kept."""
        mode = self._mode(req.manifest_path)
        pods = list(pods) + [path for path in (self.pod_of(pid) for pid in running) if path]
        restart.StaticPodRestart(
            write=lambda manifest: self._write(req.manifest_path, manifest, mode),
            running=lambda: [p[0] for p in self._ours(outcome)], clock=self.clock, sleep=self.sleep,
        ).replace(text, previous, running, pods, min(restart.STOP_TIMEOUT, req.wait_timeout / 2),
                  outcome.warnings, self.host.join(outcome.backup or req.backup_dir))

    def _rollback(self, req: Request, outcome: Outcome, enabled: bool, check_process: bool, check_health: bool,
                  problem: str) -> None:
        failed = [p[0] for p in self._ours(outcome)] if check_process else []
        self._write(req.config_path, outcome.config_before)
        if outcome.manifest_before != outcome.manifest_after and check_process:
            # the failed pod may have no process left (a crash loop): its cgroup, seen while waiting, is watched
            self._replace_stopped(req, outcome, outcome.manifest_before, outcome.manifest_after, failed,
                                  sorted(self._new_pods))
        else:
            self._write(req.manifest_path, outcome.manifest_before)
        if outcome.manifest_before == outcome.manifest_after:
            # same manifest: the kubelet would keep the failed process; stop it
            for pid in failed:
                self.kill(pid)
        restored = self._wait(req, outcome, outcome.manifest_before, failed, check_process, check_health, None)
        state = "healthy again" if restored is None else "NOT healthy either (%s)" % restored
        raise ExtenderApplyError(
            "kube-scheduler did not come back within %ss after %s the extender: %s. The previous manifest "
            "and configuration were restored and the scheduler is %s. Backup: %s"
            % (int(req.wait_timeout), "enabling" if enabled else "disabling", problem, state,
               self.host.join(outcome.backup or req.backup_dir)))
