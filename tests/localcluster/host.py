# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The I/O edge of the components: files and processes on this machine.

Each process `up` starts has its records -- ``<pids>/NAME.pid`` (the PID),
``NAME.exe`` (the resolved binary), ``NAME.hash`` (``component.start_hash``)
and the log ``<logs>/NAME.log`` -- so a later `up` recognises it, keeps it
when its configuration is unchanged and restarts it otherwise, and `down`
stops it. Only a recorded PID whose ``/proc/PID/exe`` is still the recorded
binary is ever signalled.
"""

from __future__ import annotations

import base64
import datetime
import os
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from . import status
from .component import FileSpec, ProcessSpec, Write, start_hash


def _read(path: str) -> Optional[str]:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError:
        return None


def _zombie_or_gone(pid: int) -> bool:
    stat = _read("/proc/%d/stat" % pid)
    # the state is the field after the parenthesised command name
    return stat is None or stat.rsplit(")", 1)[-1].split()[0] == "Z"


@dataclass
class LocalHost:
    """This machine. pids/logs: cluster.sh's PID and log dirs; log: where progress lines go."""

    pids: str
    logs: str
    log: Callable[[str], None] = lambda line: None
    grace: float = 10.0  # seconds between TERM and KILL (cluster.sh: 100 x 0.1 s)

    # ---------------------------------------------------------------- files
    def write(self, spec: FileSpec) -> bool:
        """Write SPEC as its policy says; True when the file changed."""
        have = _read(spec.path)
        if spec.write is Write.IF_ABSENT and have:
            return False
        if have == spec.content:
            if spec.write is not Write.IF_ABSENT:
                os.chmod(spec.path, spec.mode)
            return False
        os.makedirs(os.path.dirname(spec.path), exist_ok=True)
        # a reader (the kubelet's static pod scan, kube-proxy) never sees half a file
        tmp = spec.path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, spec.mode)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(spec.content)
        os.chmod(tmp, spec.mode)
        os.replace(tmp, spec.path)
        return True

    # ---------------------------------------------------------------- processes
    def _file(self, name: str, ext: str) -> str:
        return "%s/%s.%s" % (self.pids, name, ext)

    def state(self, name: str) -> status.ProcessState:
        pid = _read(self._file(name, "pid"))
        pid_s = (pid or "").strip()
        alive = pid_s.isdigit() and os.path.isdir("/proc/" + pid_s)
        try:
            exe: Optional[str] = os.readlink("/proc/%s/exe" % pid_s) if alive else None
        except OSError:
            exe = None
        return status.process_state(pid, alive, _read(self._file(name, "exe")), exe)

    def running(self, name: str) -> bool:
        return self.state(name).state is status.State.RUNNING

    def recorded(self, name: str) -> bool:
        """A PID file exists (running or stale)."""
        return os.path.exists(self._file(name, "pid"))

    def exited(self, name: str) -> bool:
        """The recorded process is gone (or a zombie). Not the same as not running(): until its wrapper
        (nsenter) has exec'd the binary, a process that is starting does not run the recorded binary yet."""
        pid = (_read(self._file(name, "pid")) or "").strip()
        return pid.isdigit() and _zombie_or_gone(int(pid))

    def pid(self, name: str) -> int:
        st = self.state(name)
        return int(st.pid) if st.state is status.State.RUNNING else 0

    def start(self, spec: ProcessSpec) -> int:
        """Start SPEC detached (own session, output to its log), or keep it running when nothing changed."""
        contents = []
        for path in spec.config_files:
            with open(path, "rb") as fh:
                contents.append(fh.read())
        digest = start_hash(spec, contents)
        if self.running(spec.name):
            if (_read(self._file(spec.name, "hash")) or "").strip() == digest:
                self.log("%s already running (pid %d)" % (spec.name, self.pid(spec.name)))
                return self.pid(spec.name)
            self.log("%s: configuration changed; restarting it" % spec.name)
            self.stop(spec.name)
        if os.path.exists(self._file(spec.name, "pid")):
            self.log("WARNING: stale PID file for %s; removing it" % spec.name)
            for ext in ("pid", "exe"):
                _remove(self._file(spec.name, ext))
        binary = os.path.realpath(spec.argv[0])
        os.makedirs(self.pids, exist_ok=True)
        os.makedirs(self.logs, exist_ok=True)
        log_path = "%s/%s.log" % (self.logs, spec.name)
        with open(log_path, "a", encoding="utf-8") as log:
            now = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
            log.write("\n==== %s start %s\n" % (now, spec.name))
            log.flush()
            proc = subprocess.Popen(  # pylint: disable=consider-using-with  # it outlives this call by design
                [*spec.wrap, binary, *spec.argv[1:]], stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
        for ext, value in (("pid", str(proc.pid)), ("exe", binary), ("hash", digest)):
            with open(self._file(spec.name, ext), "w", encoding="utf-8") as fh:
                fh.write(value + "\n")
        self.log("%s started (pid %d, log %s)" % (spec.name, proc.pid, log_path))
        return proc.pid

    def stop(self, name: str) -> None:
        """TERM, then KILL after the grace period; only the recorded PID, only while it runs the recorded binary."""
        if not os.path.exists(self._file(name, "pid")):
            return
        st = self.state(name)
        if st.state is status.State.RUNNING:
            pid = int(st.pid)
            _signal(pid, signal.SIGTERM)
            deadline = time.monotonic() + self.grace
            while time.monotonic() < deadline and not _zombie_or_gone(pid):
                time.sleep(0.1)
            if not _zombie_or_gone(pid):
                self.log("WARNING: %s (pid %d) did not stop on TERM; killing it" % (name, pid))
                _signal(pid, signal.SIGKILL)
                time.sleep(0.5)
            self.log("stopped %s (pid %d)" % (name, pid))
        else:
            self.log("%s: stale PID file (pid %s not running it); removing" % (name, st.pid))
        for ext in ("pid", "exe", "hash"):
            _remove(self._file(name, ext))

    def read(self, path: str) -> str:
        return _read(path) or ""

    def mkdir(self, path: str, mode: int = 0o755) -> None:
        os.makedirs(path, exist_ok=True)
        os.chmod(path, mode)

    def remove(self, path: str) -> None:
        _remove(path)

    def run(self, argv: Sequence[str], stdin: str = "") -> str:
        """ARGV's output; a failure raises with its stderr (secrets go through STDIN, never argv)."""
        proc = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError("%s failed (exit %d): %s" % (argv[0], proc.returncode, proc.stderr.strip()))
        return proc.stdout

    def ok(self, argv: Sequence[str]) -> bool:
        """Whether ARGV succeeds (a check such as `iptables -C`); its output is dropped."""
        return subprocess.run(list(argv), capture_output=True, check=False).returncode == 0

    def http_status(self, url: str, cafile: str = "", user: str = "", password: str = "",
                    cert: tuple[str, str] = ("", ""), insecure: bool = False) -> int:
        """GET URL (never through a proxy: these are the machine's own addresses); 0 when unreachable.
        CERT: a client certificate and key; INSECURE: a self-signed serving certificate (curl -k)."""
        context = ssl.create_default_context(cafile=cafile) if cafile or insecure or cert[0] else None
        if context is not None and insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if context is not None and cert[0]:
            context.load_cert_chain(cert[0], cert[1])
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                             urllib.request.HTTPSHandler(context=context))
        request = urllib.request.Request(url)
        if user:
            token = base64.b64encode(("%s:%s" % (user, password)).encode()).decode("ascii")
            request.add_header("Authorization", "Basic " + token)
        try:
            with opener.open(request, timeout=5) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except OSError:
            return 0


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:
        pass


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
