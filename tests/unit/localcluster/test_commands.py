# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The pure and local parts of phase 2: phases, cluster.env parsing, tools, waiting, the baseline record."""

from __future__ import annotations

import io
import os

import pytest

from localcluster import commands, envfile, output, runtime, teardown
from localcluster.component import ProcessSpec
from localcluster.host import LocalHost
from localcluster.output import ClusterError
from localcluster.waiting import wait_for


def test_phases_table_from_a_clock():
    ticks = iter([0.0, 2.4, 2.4, 9.9])
    lines: list[str] = []
    p = output.Phases(clock=lambda: next(ticks), emit=lines.append)
    p.start("deps")
    p.start("etcd")
    report = p.report("cluster up")
    assert lines == ["== deps", "== etcd"]
    assert report.splitlines()[1:] == ["Phase timings (cluster up):", "  %-38s %5ss" % ("deps", 2),
                                       "  %-38s %5ss" % ("etcd", 7), "  %-38s %5ss" % ("total", 9)]


def test_no_phase_no_report():
    assert output.Phases().report("x") == ""


def test_log_lines_carry_a_timestamp():
    out = io.StringIO()
    output.warn("careful", out)
    text = out.getvalue()
    assert text.startswith("[") and text[9:] == "] WARNING: careful\n"


def test_parse_env_reads_cluster_env_as_the_shell(settings, three):
    tools = envfile.Tools("/k/bin", "/c/bin", "/h/bin", "/h/plugins", "/r/containers.conf", "/r/registries.conf")
    env = commands.parse_env(envfile.cluster_env(settings, three, tools))
    assert env["METAX_NODES"] == "vm vm-2 vm-3"  # the shell drops the quotes
    assert env["KUBECONFIG"] == settings.admin_conf
    assert env["PATH"] == "/k/bin:/h/bin:/c/bin:${PATH}"


def test_tools_from_the_entry_point_or_derived(settings):
    env = {"METAX_LC_KUBE_BIN": "/k", "METAX_LC_CONTAINERD_BIN": "/c", "CONTAINERS_CONF": "/x.conf"}
    t = runtime.tools_from_env(settings, env, repo="/repo")
    assert (t.kube_bin, t.containerd_bin, t.containers_conf) == ("/k", "/c", "/x.conf")
    assert t.helm_bin == settings.cache_dir + "/helm/%s/bin" % settings.helm_version
    assert t.containers_registries_conf == "/repo/scripts/cluster/containers/registries.conf"


def test_podman_env_needs_no_cluster(settings):
    rt = runtime.Runtime(settings, runtime.tools_from_env(settings, {"METAX_LC_KUBE_BIN": "/k"}, "/repo"), {})
    out = io.StringIO()
    assert commands.podman_env_command(rt, out) == 0
    assert out.getvalue() == ("export CONTAINERS_CONF=/repo/scripts/cluster/containers/containers.conf\n"
                              "export CONTAINERS_REGISTRIES_CONF=/repo/scripts/cluster/containers/registries.conf\n")


def test_status_and_env_without_a_cluster(settings):
    rt = runtime.Runtime(settings, runtime.tools_from_env(settings, {"METAX_LC_KUBE_BIN": "/k"}, "/repo"), {})
    out = io.StringIO()
    assert commands.status_command(rt, out) == 3
    assert out.getvalue() == "cluster: down (no state in %s)\n" % settings.state_dir
    with pytest.raises(ClusterError, match="run 'make cluster-up' first"):
        commands.env_command(rt, out)


# ---------------------------------------------------------------- waiting, with real processes
@pytest.fixture
def host(tmp_path):
    h = LocalHost(str(tmp_path / "pids"), str(tmp_path / "logs"), grace=2.0)
    yield h
    for name in os.listdir(h.pids) if os.path.isdir(h.pids) else []:
        if name.endswith(".pid"):
            h.stop(name[:-4])


def test_wait_returns_once_the_check_passes(host, tmp_path):
    flag = tmp_path / "ready"
    host.start(ProcessSpec("maker", ("/bin/sh", "-c", "sleep 0.3; touch %s; exec sleep 60" % flag)))
    wait_for(host, "the flag", 60, "maker", flag.exists, interval=0.05)
    assert flag.exists()


def test_wait_fails_early_when_the_process_died(host):
    host.start(ProcessSpec("dies", ("/bin/sh", "-c", "echo cannot bind >&2; exit 3")))
    with pytest.raises(ClusterError, match="dies exited while waiting for its port"):
        wait_for(host, "its port", 60, "dies", lambda: False, interval=0.05)


def test_wait_times_out_with_what_to_do(host):
    host.start(ProcessSpec("idle", ("/usr/bin/sleep", "60")))
    with pytest.raises(ClusterError, match=r"timed out after 0s waiting for nothing\.\n  Logs: .*make cluster-down"):
        wait_for(host, "nothing", 0, "idle", lambda: False)


def test_a_failing_check_counts_as_not_yet(host):
    calls = []

    def check() -> bool:
        calls.append(1)
        if len(calls) < 3:
            raise RuntimeError("connection refused")
        return True

    wait_for(host, "a flaky check", 60, "", check, interval=0.01)
    assert len(calls) == 3


# ---------------------------------------------------------------- the baseline record
def test_baseline_is_recorded_once(settings):
    """What the machine had before is recorded (read-only on the machine) and never rewritten."""
    assert teardown.record_baseline(settings)
    b = teardown.read_baseline(settings)
    assert b is not None and b.complete and b.ip_forward in ("0", "1")
    with open(os.path.join(settings.baseline_dir, "existed"), "w", encoding="utf-8") as fh:
        fh.write("/marker-of-the-first-record\n")
    assert not teardown.record_baseline(settings)
    assert "/marker-of-the-first-record" in teardown.read_baseline(settings).existed
