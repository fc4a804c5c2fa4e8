# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""`status` from PID files: the package renders what cluster.sh prints, checked with real processes."""

from __future__ import annotations

import os
import subprocess

import pytest

from localcluster import binaries, edge, nodes as nodes_mod, status
from localcluster.envfile import Tools
from localcluster.settings import from_env
from localcluster.status import ProcessState, State

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def test_process_state():
    assert status.process_state(None, False, None, None) == ProcessState(State.STOPPED)
    assert status.process_state("42\n", True, "/usr/bin/etcd\n", "/usr/bin/etcd") == ProcessState(State.RUNNING, "42")
    # the binary was replaced on disk while it runs: still ours
    assert status.process_state("42", True, "/usr/bin/etcd", "/usr/bin/etcd (deleted)").state is State.RUNNING
    # the PID was reused by another program, or the process is gone
    assert status.process_state("42", True, "/usr/bin/etcd", "/usr/bin/bash").state is State.STALE
    assert status.process_state("42", False, "/usr/bin/etcd", None) == ProcessState(State.STALE, "42")
    assert status.process_state("", False, None, None).state is State.STALE


def test_verdict(settings, three):
    names = status.components(three)
    assert len(names) == 5 + 4 * 3
    up = {n: ProcessState(State.RUNNING, "1") for n in names}
    assert status.verdict(settings, three, up) == ("cluster: up", 0)
    assert status.verdict(settings, three, {})[1] == 3
    line, rc = status.verdict(settings, three, dict(up, etcd=ProcessState(State.STALE, "9")))
    assert rc == 1 and "PARTIAL (16/17 components running)" in line


@pytest.fixture
def sleeper():
    proc = subprocess.Popen(["/usr/bin/sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def test_same_as_cluster_sh_status(tmp_path, sleeper):
    """A state dir with one real running process, one stale PID file, the rest stopped: bash and Python agree."""
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "GO": "/bin/false",
           "METAX_CLUSTER_DIR": str(tmp_path / "state"), "METAX_CACHE_DIR": str(tmp_path / "cache"),
           "METAX_KUBE_ETC": str(tmp_path / "etc")}
    settings = from_env(env)
    plan = nodes_mod.plan(["8xC500", "4xN100"], "vm")
    os.makedirs(settings.pids)
    with open(settings.state_dir + "/node-table", "w", encoding="utf-8") as fh:
        fh.write(nodes_mod.render_table(plan))
    for name, pid, exe in (("registry", sleeper.pid, "/usr/bin/sleep"), ("kubelet-vm-2", 999999999, "/k/kubelet"),
                           ("etcd", sleeper.pid, "/usr/bin/etcd")):
        with open("%s/%s.pid" % (settings.pids, name), "w", encoding="utf-8") as fh:
            fh.write("%d\n" % pid)
        with open("%s/%s.exe" % (settings.pids, name), "w", encoding="utf-8") as fh:
            fh.write(exe + "\n")
    bash = subprocess.run(["bash", os.path.join(REPO, "scripts", "cluster", "cluster.sh"), "status"], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    states = edge.process_states(settings, status.components(plan))
    assert states["registry"] == ProcessState(State.RUNNING, str(sleeper.pid))
    assert states["etcd"].state is State.STALE  # a live PID, but not the recorded binary
    tools = Tools(binaries.k8s_bin_dir(settings, "unknown"), binaries.containerd_bin_dir(settings),
                  binaries.helm_bin_dir(settings), binaries.helm_plugins_dir(settings), "", "")
    last, rc = status.verdict(settings, plan, states)
    assert bash.stdout == status.render_head(settings, plan, states, tools) + last + "\n"
    assert (bash.returncode, rc) == (1, 1)


def test_no_state(tmp_path):
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "GO": "/bin/false",
           "METAX_CLUSTER_DIR": str(tmp_path / "none"), "METAX_CACHE_DIR": str(tmp_path / "cache")}
    bash = subprocess.run(["bash", os.path.join(REPO, "scripts", "cluster", "cluster.sh"), "status"], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert (bash.stdout.rstrip("\n"), bash.returncode) == status.no_state(from_env(env))
