# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""LocalHost against real short-lived processes, and hand in hand with the bash version's start/stop.

The interoperability tests run the functions the bash cluster.sh had
(captured in fixtures/bash/process-functions.sh) on the same PID dir: what
one side starts, the other recognises, keeps and stops -- a cluster the bash
version started is taken over without a restart.
"""

from __future__ import annotations

import os
import re
import subprocess
import time

import pytest

from localcluster.component import FileSpec, ProcessSpec, Write
from localcluster.host import LocalHost

SLEEP = ProcessSpec("sleeper", ("/usr/bin/sleep", "300"))


@pytest.fixture
def host(tmp_path):
    h = LocalHost(str(tmp_path / "pids"), str(tmp_path / "logs"), grace=2.0)
    yield h
    for name in os.listdir(h.pids) if os.path.isdir(h.pids) else []:
        if name.endswith(".pid"):
            h.stop(name[:-4])


def _gone(pid: int) -> bool:
    try:
        with open("/proc/%d/stat" % pid, encoding="utf-8") as fh:
            return fh.read().rsplit(")", 1)[-1].split()[0] == "Z"
    except OSError:
        return True


def test_start_keep_stop(host):
    pid = host.start(SLEEP)
    assert host.running("sleeper") and not _gone(pid)
    assert open(host.pids + "/sleeper.exe", encoding="utf-8").read().strip() == os.path.realpath("/usr/bin/sleep")
    assert host.start(SLEEP) == pid  # unchanged: kept
    assert "==== " in open(host.logs + "/sleeper.log", encoding="utf-8").read()
    host.stop("sleeper")
    assert _gone(pid) and not os.path.exists(host.pids + "/sleeper.pid")
    host.stop("sleeper")  # again: nothing to do


def test_changed_config_restarts(host, tmp_path):
    conf = tmp_path / "c.yaml"
    conf.write_text("a: 1\n")
    spec = ProcessSpec("sleeper", SLEEP.argv, config_files=(str(conf),))
    first = host.start(spec)
    assert host.start(spec) == first
    conf.write_text("a: 2\n")
    second = host.start(spec)
    assert second != first and _gone(first) and host.running("sleeper")


def test_stale_pid_file_is_never_signalled(host, tmp_path):
    """A recorded PID now running another program is not ours: not killed, the record is dropped."""
    other = subprocess.Popen(["/usr/bin/tail", "-f", "/dev/null"])
    try:
        os.makedirs(host.pids)
        (tmp_path / "pids" / "sleeper.pid").write_text("%d\n" % other.pid)
        (tmp_path / "pids" / "sleeper.exe").write_text("/usr/bin/sleep\n")
        assert not host.running("sleeper")
        host.stop("sleeper")
        assert other.poll() is None and not os.path.exists(host.pids + "/sleeper.pid")
    finally:
        other.kill()
        other.wait()


def test_term_ignored_then_killed(host, tmp_path):
    ready = tmp_path / "trap-set"
    spec = ProcessSpec("stubborn", ("/usr/bin/bash", "-c", "trap '' TERM; touch %s; while :; do sleep 0.1; done"
                                    % ready))
    lines: list[str] = []
    host.log = lines.append
    pid = host.start(spec)
    deadline = time.monotonic() + 60
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ready.exists()
    host.stop("stubborn")
    assert _gone(pid)
    assert any("did not stop on TERM; killing it" in line for line in lines)


def test_write_policies(host, tmp_path):
    path = str(tmp_path / "d" / "f")
    assert host.write(FileSpec(path, "one\n", 0o600))
    assert oct(os.stat(path).st_mode & 0o777) == oct(0o600)
    assert not host.write(FileSpec(path, "one\n", 0o600))  # same content: untouched
    assert not host.write(FileSpec(path, "two\n", 0o600, Write.IF_ABSENT))
    assert open(path, encoding="utf-8").read() == "one\n"
    before = os.stat(path).st_mtime_ns
    assert not host.write(FileSpec(path, "one\n", 0o600, Write.IF_CHANGED))
    assert os.stat(path).st_mtime_ns == before  # kube-proxy exits when its file is written to
    assert host.write(FileSpec(path, "two\n", 0o600, Write.IF_CHANGED))


# ---------------------------------------------------------------- the bash version's own functions
# pid_of, running, start and stop as cluster.sh had them before the package took over (captured in
# fixtures/bash/process-functions.sh): a cluster the bash version started is adopted and stopped by the package.
FUNCTIONS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "bash", "process-functions.sh")


def _bash_functions() -> str:
    with open(FUNCTIONS, encoding="utf-8") as fh:
        text = fh.read()
    for name in ("pid_of", "running", "start", "stop"):
        assert re.search(r"^%s\(\) \{" % name, text, re.M), "the fixture has no function %s" % name
    return "log() { echo \"$*\" >&2; }\nwarn() { echo \"WARNING: $*\" >&2; }\n" + text


def _bash(host: LocalHost, tmp_path, command: str) -> subprocess.CompletedProcess:
    script = tmp_path / "fns.sh"
    script.write_text(_bash_functions())
    env = {"PATH": os.environ["PATH"], "PIDS": host.pids, "LOGS": host.logs}
    return subprocess.run(["bash", "-c", 'source "$1"; %s' % command, "bash", str(script)], env=env,
                          capture_output=True, text=True, timeout=60, check=True)


def test_bash_started_is_kept_and_stopped_by_python(host, tmp_path):
    os.makedirs(host.pids)
    os.makedirs(host.logs)
    _bash(host, tmp_path, "start sleeper /usr/bin/sleep 300")
    # bash's `setsid ... &` returns before the child has exec'd sleep (cluster.sh waits for each process too)
    deadline = time.monotonic() + 60
    while not host.running("sleeper") and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = host.pid("sleeper")
    assert pid and host.start(SLEEP) == pid  # same hash: adopted, not restarted
    host.stop("sleeper")
    assert _gone(pid)


def test_python_started_is_kept_and_stopped_by_bash(host, tmp_path):
    pid = host.start(SLEEP)
    out = _bash(host, tmp_path, "running sleeper && echo yes; start sleeper /usr/bin/sleep 300; stop sleeper")
    assert out.stdout.strip() == "yes"
    assert "already running (pid %d)" % pid in out.stderr and "stopped sleeper (pid %d)" % pid in out.stderr
    assert _gone(pid) and not os.path.exists(host.pids + "/sleeper.pid")
