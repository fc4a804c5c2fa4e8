# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The container-runtime agent as its own process over a node root: enable CDI, be ready, revert on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from agent_process import agent_env

from ansible_collections.metax.gpu.plugins.module_utils.cdi import runtime_config as rc

MODULE = "ansible_collections.metax.gpu.plugins.module_utils.agents.container_runtime"
VENDOR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cdi", "fixtures",
                      "containerd-config-after-vendor-runtime.toml")


def node(tmp_path):
    root = tmp_path / "node"
    (root / "etc" / "containerd").mkdir(parents=True)
    (root / "var" / "lib").mkdir(parents=True)
    with open(VENDOR, "rb") as handle:
        (root / "etc" / "containerd" / "config.toml").write_bytes(handle.read())
    return root


def files(root):
    out = {}
    for base, _dirs, names in os.walk(root):
        for name in names:
            path = os.path.join(base, name)
            with open(path, "rb") as handle:
                out[os.path.relpath(path, root)] = handle.read()
    return out


def start(root, ready, *extra):
    return subprocess.Popen([sys.executable, "-m", MODULE, "--host-root", str(root), "--log-format", "text",
                             "--ready-file", str(ready), "--restart", "never", "--interval", "0.2"] + list(extra),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=agent_env())


def wait_ready(proc, ready):
    assert wait_long(proc, ready), proc.communicate(timeout=5)


def wait_for_file(proc, path):
    return wait_long(proc, path)


def test_containerd_1_7_enabled_while_running_and_reverted_byte_identical_on_sigterm(tmp_path):
    root = node(tmp_path)
    before = files(root)
    ready = tmp_path / "ready"
    proc = start(root, ready, "--runtime-version", "containerd://1.7.24")
    dropin = root / "etc" / "containerd" / "conf.d" / "99-metax-gpu-cdi.toml"
    try:
        assert wait_for_file(proc, dropin)
        # the restart it needs is not done (--restart never): not ready, so gpu-device does not start on it
        time.sleep(1)
        assert not ready.exists()
        during = files(root)
        assert b"enable_cdi = true" in during["etc/containerd/conf.d/99-metax-gpu-cdi.toml"]
        assert rc.CONTAINERD_DROPIN.encode() in during["etc/containerd/config.toml"]
    finally:
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    # --restart never: the restart it would need is reported, not done
    assert "needs a restart to read CDI (--restart never)" in err and "not ready" in err
    assert files(root) == before and not os.path.exists(root / "etc" / "containerd" / "conf.d")
    assert not ready.exists()


def test_containerd_2_needs_nothing_and_writes_the_spec_when_asked(make_node, tmp_path):
    from ansible_collections.metax.gpu.plugins.module_utils.sim.maca import install_maca
    host = make_node("4xN100")
    install_maca(host, "3.0.0.8")
    os.makedirs(host.join("etc"), exist_ok=True)
    ready = tmp_path / "ready"
    spec_dir = tmp_path / "cdi"
    proc = start(host.path, ready, "--runtime-version", "containerd://2.4.2", "--write-spec",
                 "--cdi-spec-dir", str(spec_dir))
    try:
        wait_ready(proc, ready)
        assert "reads CDI by default" in ready.read_text()
        deadline = time.monotonic() + 60
        while not os.path.exists(spec_dir / "metax-tech.com-gpu.json") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert os.path.exists(spec_dir / "metax-tech.com-gpu.json")
    finally:
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "reverted: nothing to revert" in err


def test_an_unknown_runtime_is_a_usage_error(tmp_path):
    root = node(tmp_path)
    proc = subprocess.run([sys.executable, "-m", MODULE, "--host-root", str(root), "--runtime-version", "nope"],
                          capture_output=True, text=True, env=agent_env(), timeout=120, check=False)
    assert proc.returncode == 2 and "cannot tell the node's container runtime" in proc.stderr


V3_CONFIG = b'''version = 3

[plugins."io.containerd.cri.v1.runtime".containerd]
  default_runtime_name = "runc"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
  SystemdCgroup = true
'''


def wait_long(proc, path, timeout=60.0):
    """``path`` appears, or the process ended, within ``timeout`` s (a loaded machine starts Python slowly)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not os.path.exists(path) and proc.poll() is None:
        time.sleep(0.05)
    return os.path.exists(path)


def test_containerd_2_gets_the_metax_handler_is_ready_without_its_restart_and_reverts_it(tmp_path):
    """containerd 2.x reads CDI already: the handler's restart (not done: --restart never) does not hold
    readiness back; on SIGTERM the config comes back byte-identical and conf.d goes."""
    root = node(tmp_path)
    (root / "etc" / "containerd" / "config.toml").write_bytes(V3_CONFIG)
    os.chmod(root / "etc" / "containerd" / "config.toml", 0o600)
    before = files(root)
    ready = tmp_path / "ready"
    proc = start(root, ready, "--runtime-version", "containerd://2.4.2")
    try:
        assert wait_long(proc, ready), proc.communicate(timeout=5)
        assert "runtime handler metax added" in ready.read_text()
        during = files(root)
        assert b"containerd.runtimes.metax]" in during["etc/containerd/conf.d/99-metax-gpu-cdi.toml"]
        assert rc.CONTAINERD_DROPIN.encode() in during["etc/containerd/config.toml"]
    finally:
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "needs a restart for the runtime handler metax (--restart never)" in err
    assert files(root) == before and not os.path.exists(root / "etc" / "containerd" / "conf.d")
    assert os.stat(root / "etc" / "containerd" / "config.toml").st_mode & 0o777 == 0o600


def test_a_simulated_root_never_restarts_the_hosts_runtime(tmp_path):
    """--host-prefix other than / (the local cluster's simulated roots): the edited files are a copy no running
    runtime reads, so --restart auto restarts nothing (here: systemctl would be called, and fail, otherwise)."""
    root = node(tmp_path)
    ready = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-m", MODULE, "--host-root", str(root), "--host-prefix", "/var/lib/sim/n1",
                             "--log-format", "text", "--ready-file", str(ready), "--restart", "auto",
                             "--interval", "0.2", "--runtime-version", "containerd://1.7.24"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=agent_env())
    try:
        assert wait_long(proc, root / "etc" / "containerd" / "conf.d" / "99-metax-gpu-cdi.toml")
        time.sleep(1)
    finally:
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "the runtime is never restarted for its files" in err and "restarting containerd" not in err
