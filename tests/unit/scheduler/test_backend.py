"""The backend's wait and rollback, with the scheduler's two observations played by a fake kubelet.

The fake reads the manifest from the temporary root the way the kubelet does:
a new manifest (or a killed process) means a new kube-scheduler process whose
command line is the manifest's; a manifest taken out stops the process, and
``stop_after`` seconds later the pod's cgroup directory goes. Whether it turns
healthy, and whether the extender answers, are the test's choice. The real ones run in
tests/integration/test_scheduler_extender_cluster.py.
"""
from __future__ import annotations

import os
import signal
import subprocess

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.host import HostRoot
from ansible_collections.metax.gpu.plugins.module_utils.scheduler import backend as be
from ansible_collections.metax.gpu.plugins.module_utils.scheduler import config as cfg
from ansible_collections.metax.gpu.plugins.module_utils.scheduler import manifest as mf
from ansible_collections.metax.gpu.plugins.module_utils.scheduler import restart

from scheduler_support import CONFIG_PATH, URL, manifest

MANIFEST = "/etc/kubernetes/manifests/kube-scheduler.yaml"


class FakeKubelet:
    def __init__(self, root, healthy_with_config=True, extender_up=True, stop_after=1.0, crash_with_config=False,
                 foreign=False):
        self.root = root
        self.foreign = foreign      # another cluster's scheduler on the machine runs the same command
        self.crash_with_config = crash_with_config  # that process exits after 1 s, and starts again 10 s later
        self.started_at = 0.0
        self.healthy_with_config = healthy_with_config
        self.extender_up = extender_up
        self.stop_after = stop_after        # None: the pod never stops (no kubelet)
        self.pid = 100
        self.pod = 0                        # pods started from a manifest (a killed process keeps its pod)
        self.seen = None                    # the manifest as last read
        self.running = None                 # the manifest the process runs
        self.stopping_since = None
        self.now = 0.0
        self.killed = []
        self.events = []                    # (time, what) as the kubelet saw it

    def cgroup(self):
        return os.path.join(self.root, "sys/fs/cgroup/kubepods/pod%032x" % self.pod)

    def _sync(self):
        path = os.path.join(self.root, MANIFEST.lstrip("/"))
        text = None
        if os.path.exists(path):
            with open(path) as handle:
                text = handle.read()
        if text is None and self.seen is not None:
            self.events.append((self.now, "manifest out"))
            self.stopping_since = self.now
        if text is not None and text != self.seen:
            if self.seen is not None:
                self.events.append((self.now, "manifest rewritten while its pod runs"))
            self.pid += 1
            self.pod += 1
            self.started_at = self.now
            self.running = text
            self.stopping_since = None
            os.makedirs(self.cgroup())
            self.events.append((self.now, "started %d" % self.pid))
        self.seen = text
        if self.stopping_since is not None and self.stop_after is not None and \
                self.now - self.stopping_since >= self.stop_after and os.path.isdir(self.cgroup()):
            os.rmdir(self.cgroup())
            self.events.append((self.now, "pod of %d gone" % self.pid))

    def processes(self):
        self._sync()
        # the runtime starts the manifest's command; a second scheduler of someone else runs too
        others = [(5, ["kube-scheduler", "--config=/etc/hami/scheduler.yaml"])]
        if self.seen is None and self.stop_after is not None:
            return others               # the process ends at once, its pod's cgroup later
        if self.crash_with_config and mf.inspect(self.running).config_path is not None:
            if self.now - self.started_at >= 11.0:
                self.pid += 1
                self.started_at = self.now
                self.events.append((self.now, "restarted %d" % self.pid))
            if self.now - self.started_at >= 1.0:
                return others
        command = mf.inspect(self.running).command
        if self.foreign:
            others.append((7, ["/usr/local/bin/" + command[0]] + list(command[1:])))
        return others + [(self.pid, ["/usr/local/bin/" + command[0]] + list(command[1:]))]

    def of_this_node(self, pid, argv):
        return pid != 7

    def health(self, url, pid):
        self._sync()
        assert url == "https://127.0.0.1:10259/healthz"
        if self.seen is None:
            return False
        return self.healthy_with_config or mf.inspect(self.seen).config_path is None

    def pod_of(self, pid):
        return self.cgroup() if pid == self.pid and os.path.isdir(self.cgroup()) else None

    def reachable(self, url, pid):
        return self.extender_up

    def kill(self, pid):
        self.killed.append(pid)
        self.pid += 1

    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds
        self._sync()            # the kubelet goes on while the module sleeps


@pytest.fixture
def root(tmp_path):
    os.makedirs(str(tmp_path / "etc/kubernetes/manifests"))
    (tmp_path / MANIFEST.lstrip("/")).write_text(manifest("1.28"))
    return str(tmp_path)


def _backend(root, kubelet):
    return be.SchedulerExtender(HostRoot(root), processes=kubelet.processes, health=kubelet.health,
                                reachable=kubelet.reachable, kill=kubelet.kill, pod_of=kubelet.pod_of,
                                clock=kubelet.clock, sleep=kubelet.sleep, stamp="20261123T090000",
                                of_this_node=kubelet.of_this_node)


def _request(state="present", **extra):
    return be.Request(state=state, manifest_path=MANIFEST, config_path=CONFIG_PATH,
                      backup_dir="/etc/kubernetes/metax-backup",
                      options=cfg.ExtenderOptions(url=URL, **extra) if state == "present" else None,
                      wait_timeout=30.0)


def _read(root, path):
    with open(os.path.join(root, path.lstrip("/"))) as handle:
        return handle.read()


def test_enable_waits_for_a_new_healthy_process(root):
    kubelet = FakeKubelet(root)
    backend = _backend(root, kubelet)
    req = _request()
    outcome = backend.apply(req, backend.plan(req))
    assert outcome.waited and not outcome.warnings
    assert "--config=" + CONFIG_PATH in kubelet.processes()[1][1]
    assert os.listdir(os.path.join(root, "etc/kubernetes/manifests")) == ["kube-scheduler.yaml"]


def test_another_clusters_scheduler_with_the_same_command_is_neither_waited_for_nor_stopped(root):
    kubelet = FakeKubelet(root, foreign=True)
    backend = _backend(root, kubelet)
    req = _request()
    outcome = backend.apply(req, backend.plan(req))
    assert outcome.waited and not outcome.warnings
    assert 7 not in kubelet.killed


def test_a_scheduler_that_reads_another_file_at_the_kubeconfig_path_is_not_the_nodes(tmp_path):
    """The real check: a process in a mount namespace of its own, with another file bound at the path."""
    if os.geteuid() != 0:
        pytest.skip("a mount namespace needs root")
    ours, theirs = tmp_path / "scheduler.conf", tmp_path / "theirs.conf"
    ours.write_text("ours")
    theirs.write_text("theirs")
    argv = ["kube-scheduler", "--kubeconfig=%s" % ours]
    node = HostRoot("/")
    assert be.reads_node_kubeconfig(os.getpid(), argv, node)
    proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                             'mount --bind "$1" "$2" && echo bound && exec sleep 60', "sh", str(theirs), str(ours)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "bound"
        assert not be.reads_node_kubeconfig(proc.pid, argv, node)
        assert not be.reads_node_kubeconfig(proc.pid, ["kube-scheduler", "--kubeconfig", str(ours)], node)
        # unknown counts as the node's, as before: no flag, a relative path, a process gone
        assert be.reads_node_kubeconfig(proc.pid, ["kube-scheduler"], node)
        assert be.reads_node_kubeconfig(proc.pid, ["kube-scheduler", "--kubeconfig=scheduler.conf"], node)
    finally:
        proc.kill()
        proc.wait()
    assert be.reads_node_kubeconfig(proc.pid, argv, node)


def test_a_changed_manifest_is_written_once_the_old_pod_has_stopped(root):
    kubelet = FakeKubelet(root, stop_after=1.4)
    backend = _backend(root, kubelet)
    req = _request()
    outcome = backend.apply(req, backend.plan(req))
    assert outcome.waited and not outcome.warnings
    started = [e for e in kubelet.events if e[1].startswith("started")]
    assert [e[1] for e in kubelet.events] == ["started 101", "manifest out", "pod of 101 gone", "started 102"]
    out, gone = kubelet.events[1][0], kubelet.events[2][0]
    assert gone - out >= 1.4 and started[-1][0] - gone < 0.5      # written right after, not a settle later
    assert os.listdir(os.path.join(root, "etc/kubernetes/manifests")) == ["kube-scheduler.yaml"]


def test_without_a_cgroup_to_watch_the_manifest_follows_the_process_after_a_settle(root):
    kubelet = FakeKubelet(root, stop_after=0.0)
    kubelet.pod_of = lambda pid: None
    backend = _backend(root, kubelet)
    req = _request()
    backend.apply(req, backend.plan(req))
    out = [t for t, what in kubelet.events if what == "manifest out"][0]
    started = [t for t, what in kubelet.events if what == "started 102"][0]
    assert restart.SETTLE_WITHOUT_CGROUP <= started - out < restart.SETTLE_WITHOUT_CGROUP + 1


def test_a_pod_that_does_not_stop_still_gets_its_new_manifest(root):
    kubelet = FakeKubelet(root, stop_after=None)
    backend = _backend(root, kubelet)
    req = _request()
    outcome = backend.apply(req, backend.plan(req))
    assert any("had not stopped 15s after its manifest was taken out" in w for w in outcome.warnings)
    assert "--config=" + CONFIG_PATH in _read(root, MANIFEST)


def test_the_manifest_keeps_its_mode(root):
    os.chmod(os.path.join(root, MANIFEST.lstrip("/")), 0o600)       # as kubeadm writes it
    kubelet = FakeKubelet(root)
    backend = _backend(root, kubelet)
    req = _request()
    backend.apply(req, backend.plan(req))
    assert os.stat(os.path.join(root, MANIFEST.lstrip("/"))).st_mode & 0o7777 == 0o600


def test_a_sigterm_while_the_manifest_is_out_still_writes_it(root):
    kubelet = FakeKubelet(root, stop_after=5.0)
    backend = _backend(root, kubelet)
    req = _request()
    outcome = backend.plan(req)

    def sleep(seconds):
        kubelet.sleep(seconds)
        if not os.path.exists(os.path.join(root, MANIFEST.lstrip("/"))):
            os.kill(os.getpid(), signal.SIGTERM)      # an Ansible timeout, say
    backend.sleep = sleep
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(restart.RestartInterrupted) as err:
        backend.apply(req, outcome)
    assert "signal %d" % signal.SIGTERM in str(err.value) and "the new manifest was written" in str(err.value)
    assert _read(root, MANIFEST) == outcome.manifest_after
    assert signal.getsignal(signal.SIGTERM) == before


def test_a_manifest_that_cannot_be_written_back_names_the_backup(root):
    kubelet = FakeKubelet(root)
    backend = _backend(root, kubelet)
    req = _request()
    outcome = backend.plan(req)
    real_write = backend._write

    def write(path, text, mode=None):
        if path == MANIFEST and text is not None:
            raise OSError(28, "No space left on device")
        return real_write(path, text, mode)
    backend._write = write
    with pytest.raises(restart.ManifestLostError) as err:
        backend.apply(req, outcome)
    assert "could not be written back" in str(err.value) and "metax-backup/20261123T090000-" in str(err.value)


def test_the_new_manifest_is_written_whatever_happens_while_it_is_out(root):
    kubelet = FakeKubelet(root)
    backend = _backend(root, kubelet)
    req = _request()
    outcome = backend.plan(req)
    calls = []

    def fails_while_out():
        calls.append(1)
        if len(calls) > 1:
            raise KeyboardInterrupt
        return kubelet.processes()
    backend.processes = fails_while_out
    with pytest.raises(KeyboardInterrupt):
        backend.apply(req, outcome)
    assert _read(root, MANIFEST) == outcome.manifest_after


def test_pod_cgroup_finds_the_pod_of_a_process(tmp_path):
    uid = "6c3f9a1e2b7d4e8f9a0b1c2d3e4f5a6b"
    v2 = tmp_path / ("cg2/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod%s.slice" % uid)
    v1 = tmp_path / "cg1/pids/kubepods/besteffort/pod12345678-1234-1234-1234-123456789abc"
    for path in (v2, v1):
        os.makedirs(str(path / "cri-containerd-abc.scope"))
    (tmp_path / "proc/10").mkdir(parents=True)
    (tmp_path / "proc/10/cgroup").write_text(
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod%s.slice/cri-containerd-abc.scope\n" % uid)
    (tmp_path / "proc/11").mkdir()
    (tmp_path / "proc/11/cgroup").write_text(
        "12:memory:/x\n5:pids:/kubepods/besteffort/pod12345678-1234-1234-1234-123456789abc/cri-containerd-abc.scope\n")
    (tmp_path / "proc/12").mkdir()
    (tmp_path / "proc/12/cgroup").write_text("0::/system.slice/kubelet.service\n")
    proc = str(tmp_path / "proc")
    assert restart.pod_cgroup(10, proc, str(tmp_path / "cg2")) == str(v2)
    assert restart.pod_cgroup(11, proc, str(tmp_path / "cg1")) == str(v1)
    assert restart.pod_cgroup(12, proc, str(tmp_path / "cg2")) is None       # not in a pod
    assert restart.pod_cgroup(13, proc, str(tmp_path / "cg2")) is None       # gone
    os.rmdir(str(v2 / "cri-containerd-abc.scope"))
    os.rmdir(str(v2))
    assert restart.pod_cgroup(10, proc, str(tmp_path / "cg2")) is None       # its cgroup already removed
    # a hybrid host: the unified line first, the pod's cgroup only in a v1 hierarchy
    (tmp_path / "proc/14").mkdir()
    (tmp_path / "proc/14/cgroup").write_text(
        "0::/kubepods/besteffort/pod12345678-1234-1234-1234-123456789abc/cri-containerd-abc.scope\n"
        "5:pids:/kubepods/besteffort/pod12345678-1234-1234-1234-123456789abc/cri-containerd-abc.scope\n")
    assert restart.pod_cgroup(14, proc, str(tmp_path / "cg1")) == str(v1)
    # in a cgroup namespace of its own the path climbs out: never followed outside the cgroup root
    os.makedirs(str(tmp_path / ("pod%s" % uid)))
    (tmp_path / "proc/15").mkdir()
    (tmp_path / "proc/15/cgroup").write_text("0::/../pod%s/cri-containerd-abc.scope\n" % uid)
    assert restart.pod_cgroup(15, proc, str(tmp_path / "cg2")) is None


def test_rejected_configuration_is_rolled_back(root):
    kubelet = FakeKubelet(root, healthy_with_config=False)
    backend = _backend(root, kubelet)
    req = _request()
    with pytest.raises(be.ExtenderApplyError) as err:
        backend.apply(req, backend.plan(req))
    message = str(err.value)
    assert "does not answer 200" in message and "healthy again" in message
    assert os.path.join(root, "etc/kubernetes/metax-backup/20261123T090000-") in message
    assert _read(root, MANIFEST) == manifest("1.28")
    assert not os.path.exists(os.path.join(root, CONFIG_PATH.lstrip("/")))
    assert "--config=" + CONFIG_PATH not in kubelet.processes()[1][1]


def test_a_crash_looping_scheduler_is_rolled_back_with_its_pod_stopped_first(root):
    kubelet = FakeKubelet(root, healthy_with_config=False, crash_with_config=True)
    backend = _backend(root, kubelet)
    req = _request()
    with pytest.raises(be.ExtenderApplyError) as err:
        backend.apply(req, backend.plan(req))
    assert "no kube-scheduler process started from the new manifest" in str(err.value)
    assert "healthy again" in str(err.value)
    assert _read(root, MANIFEST) == manifest("1.28")
    # no process of the failed pod ran at the roll back: its cgroup, seen while waiting, was waited for
    assert not [what for _t, what in kubelet.events if what.startswith("manifest rewritten")]
    assert [what for _t, what in kubelet.events].count("manifest out") == 2


def test_unreachable_extender_is_rolled_back_unless_ignorable(root):
    kubelet = FakeKubelet(root, extender_up=False)
    backend = _backend(root, kubelet)
    req = _request()
    with pytest.raises(be.ExtenderApplyError) as err:
        backend.apply(req, backend.plan(req))
    assert "not reachable from the scheduler's network" in str(err.value)
    assert _read(root, MANIFEST) == manifest("1.28")
    req = _request(ignorable=True)
    outcome = backend.apply(req, backend.plan(req))
    assert outcome.waited and "--config=" + CONFIG_PATH in _read(root, MANIFEST)


def test_configuration_only_change_restarts_the_process(root):
    kubelet = FakeKubelet(root)
    backend = _backend(root, kubelet)
    req = _request()
    backend.apply(req, backend.plan(req))
    pid = kubelet.pid
    req = _request(weight=9)
    outcome = backend.apply(req, backend.plan(req))
    assert outcome.restarted and kubelet.killed == [pid] and outcome.waited    # the other scheduler is left alone


def test_disable_waits_for_the_process_without_the_config(root):
    kubelet = FakeKubelet(root)
    backend = _backend(root, kubelet)
    req = _request()
    backend.apply(req, backend.plan(req))
    off = _request("absent")
    outcome = backend.apply(off, backend.plan(off))
    assert outcome.waited and _read(root, MANIFEST) == manifest("1.28")
    assert not os.path.exists(os.path.join(root, CONFIG_PATH.lstrip("/")))


def test_probe_url_follows_the_version():
    info = mf.inspect(manifest("1.32"))
    assert be.probe_url(info, (1, 32)) == "https://127.0.0.1:10259/readyz"
    info = mf.inspect(manifest("1.28"))
    assert be.probe_url(info, (1, 28)) == "https://127.0.0.1:10259/healthz"


def test_no_scheduler_visible_does_not_wait(root):
    backend = be.SchedulerExtender(HostRoot(root), processes=lambda: [], health=lambda url, pid: False,
                                   reachable=lambda url, pid: False, kill=lambda pid: None,
                                   clock=lambda: 0.0, sleep=lambda s: None)
    req = _request()
    outcome = backend.apply(req, backend.plan(req))
    assert not outcome.waited and "check it yourself" in outcome.warnings[0]


def test_scheduler_processes_reads_command_lines(tmp_path):
    for pid, argv in ((12, [b"/usr/local/bin/kube-scheduler", b"--config=/etc/metax/extender.yaml"]),
                      (7, [b"kube-apiserver", b"--secure-port=6443"]),
                      (30, [b"kube-scheduler"])):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cmdline").write_bytes(b"\0".join(argv) + b"\0")
    (tmp_path / "self").mkdir()
    (tmp_path / "99").mkdir()           # exited while listing: no cmdline
    assert be.scheduler_processes(str(tmp_path)) == [
        (12, ["/usr/local/bin/kube-scheduler", "--config=/etc/metax/extender.yaml"]), (30, ["kube-scheduler"])]


def test_checks_run_here_when_the_scheduler_shares_our_network():
    assert be.in_network_of(None, lambda: True) is True
    assert be.in_network_of(os.getpid(), lambda: True) is True      # same namespace: no fork
    assert be.in_network_of(os.getpid(), lambda: False) is False


def test_health_and_extender_probes_against_a_real_local_server():
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the stdlib's name
            self.send_response(200 if self.path == "/readyz" else 500)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = "http://127.0.0.1:%d" % server.server_address[1]
        assert be.http_healthy(base + "/readyz")
        assert not be.http_healthy(base + "/livez")
        assert be.extender_reachable(base)
    finally:
        server.shutdown()
        server.server_close()
    assert not be.http_healthy(base + "/readyz", timeout=1.0)
    assert not be.extender_reachable(base, timeout=1.0)
