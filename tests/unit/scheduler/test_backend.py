"""The backend's wait and rollback, with the scheduler's two observations played by a fake kubelet.

The fake reads the manifest from the temporary root the way the kubelet does:
a new manifest (or a killed process) means a new kube-scheduler process whose
command line is the manifest's. Whether it turns healthy, and whether the
extender answers, are the test's choice. The real ones run in
tests/integration/test_scheduler_extender_cluster.py.
"""
from __future__ import annotations

import os

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.host import HostRoot
from ansible_collections.metax.gpu.plugins.module_utils.scheduler import backend as be
from ansible_collections.metax.gpu.plugins.module_utils.scheduler import config as cfg
from ansible_collections.metax.gpu.plugins.module_utils.scheduler import manifest as mf

from scheduler_support import CONFIG_PATH, URL, manifest

MANIFEST = "/etc/kubernetes/manifests/kube-scheduler.yaml"


class FakeKubelet:
    def __init__(self, root, healthy_with_config=True, extender_up=True):
        self.root = root
        self.healthy_with_config = healthy_with_config
        self.extender_up = extender_up
        self.pid = 100
        self.seen = None
        self.now = 0.0
        self.killed = []

    def _sync(self):
        with open(os.path.join(self.root, MANIFEST.lstrip("/"))) as handle:
            text = handle.read()
        if text != self.seen:
            self.seen = text
            self.pid += 1

    def processes(self):
        self._sync()
        # the runtime starts the manifest's command; a second scheduler of someone else runs too
        argv = ["/usr/local/bin/" + mf.inspect(self.seen).command[0]] + list(mf.inspect(self.seen).command[1:])
        return [(5, ["kube-scheduler", "--config=/etc/hami/scheduler.yaml"]), (self.pid, argv)]

    def health(self, url, pid):
        self._sync()
        assert url == "https://127.0.0.1:10259/healthz"
        return self.healthy_with_config or mf.inspect(self.seen).config_path is None

    def reachable(self, url, pid):
        return self.extender_up

    def kill(self, pid):
        self.killed.append(pid)
        self.pid += 1

    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


@pytest.fixture
def root(tmp_path):
    os.makedirs(str(tmp_path / "etc/kubernetes/manifests"))
    (tmp_path / MANIFEST.lstrip("/")).write_text(manifest("1.28"))
    return str(tmp_path)


def _backend(root, kubelet):
    return be.SchedulerExtender(HostRoot(root), processes=kubelet.processes, health=kubelet.health,
                                reachable=kubelet.reachable, kill=kubelet.kill, clock=kubelet.clock,
                                sleep=kubelet.sleep, stamp="20261123T090000")


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
