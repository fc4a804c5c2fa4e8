# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""gpu-device as a process: bad flags exit with a clear message; a good run serves and stops on SIGTERM."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

import pytest

pytest.importorskip("grpc")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "deviceplugin"))

from agent_process import agent_env, run_agent  # noqa: E402
from kubelet_peer import KubeletPeer, pb  # noqa: E402
from ports import free_port  # noqa: E402

MODULE = "ansible_collections.metax.gpu.plugins.module_utils.agents.gpu_device"


def run(*args, timeout=120):
    return run_agent(MODULE, *args, timeout=timeout)


@pytest.mark.parametrize("args, message", [
    (["--healthy-interval", "-1"], "argument --healthy-interval: -1 is negative"),
    (["--healthy-interval", "five"], "argument --healthy-interval: 'five' is not an integer"),
    (["--log-format", "xml"], "invalid choice: 'xml'"),
    (["--metrics-port", "70000"], "is not a TCP port"),
    (["--pod-resources-interval", "0"], "must be positive"),
])
def test_bad_flag_values(args, message, capsys):
    from ansible_collections.metax.gpu.plugins.module_utils.agents.gpu_device import build_parser

    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(args)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["--healthy-interval", "-1"], "argument --healthy-interval: -1 is negative"),
    (["--log-rotation-time", "1y"], "--log-rotation-time: '1y' is not a duration"),
    (["--host-root", "/nonexistent/root"], "--host-root /nonexistent/root: no such directory"),
    (["--host-root", "/tmp"], "sys/bus/pci/devices is missing"),
])
def test_bad_flags(args, message):
    result = run(*args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr.decode(), result.stderr
    assert "Traceback" not in result.stderr.decode()


def test_missing_kubeconfig_is_a_usage_error(make_node):
    host = make_node("1xC500")
    result = run("--host-root", host.path, "--node-name", "n1", "--kubeconfig", "/nonexistent/kubeconfig",
                 "--metrics-port", "0")
    assert result.returncode == 2
    assert "--kubeconfig /nonexistent/kubeconfig: no such file" in result.stderr.decode()


UNREACHABLE_KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:%d", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: not-a-token}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
"""


def test_serves_logs_json_and_stops_on_sigterm(make_node):
    host = make_node("8xC500")
    base = tempfile.mkdtemp(prefix="mxcli-", dir="/tmp")
    peer = KubeletPeer(os.path.join(base, "dp"))
    peer.start()
    port = free_port()
    logdir = os.path.join(base, "logs")
    kubeconfig = os.path.join(base, "kubeconfig")
    with open(kubeconfig, "w") as handle:
        handle.write(UNREACHABLE_KUBECONFIG % free_port())     # nothing listens there: apiserver away
    proc = subprocess.Popen(
        [sys.executable, "-m", MODULE, "--host-root", host.path, "--host-prefix", "/var/lib/metax-sim/root",
         "--device-plugin-dir", peer.dir, "--pod-resources-socket", os.path.join(base, "none.sock"),
         "--healthy-interval", "1", "--metrics-address", "127.0.0.1", "--metrics-port", str(port),
         "--log-dir", logdir, "--log-level", "debug", "--log-format", "json",
         "--node-name", "n1", "--kubeconfig", kubeconfig],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=agent_env())
    try:
        # generous: the process imports grpc and the kubernetes client first, slow on a loaded CI machine
        peer.wait_for_registration(1, timeout=120)
        peer.wait_for_devices(lambda ds: len(ds) == 8)
        deadline = time.monotonic() + 60
        while True:
            try:
                body = urllib.request.urlopen("http://127.0.0.1:%d/healthz" % port, timeout=30).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        assert body == b"ok\n"
        metrics = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=60).read().decode()
        assert "metax_gpu_devices 8.0" in metrics
        # the apiserver is away: the plugin serves the kubelet anyway, annotations are retried.
        # The publisher starts after the API client is built (the kubernetes import): 60 s leaves
        # room for a CI machine whose two cores also run the cluster stream (CI took 10 s + once)
        deadline = time.monotonic() + 60
        while 'metax_gpu_annotation_patches_total{result="error"}' not in metrics:
            assert time.monotonic() < deadline, "no failed annotation patch counted"
            time.sleep(0.3)
            metrics = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=60).read().decode()
        # registered before the Node read (auto mode): an Allocate waits for the mode, which the
        # read's five failed tries (2 s apart) leave at devices (about 10 s idle: generous for a loaded machine)
        peer.stub.Allocate(pb.AllocateRequest(container_requests=[
            pb.ContainerAllocateRequest(devices_ids=["0000:03:00.0"])]), timeout=120)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        stderr = proc.stderr.read().decode()
        records = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
        assert any(r["msg"].startswith("registered metax-tech.com/gpu") for r in records)
        # the start says how long the process took to get there (docs/operator.md's vfnum timeline)
        starting = next(r for r in records if r["msg"].startswith("gpu-device starting"))
        assert starting["since_start"] >= 0 and \
            starting["msg"] == "gpu-device starting, %.2f s after its process began" % starting["since_start"]
        assert any(r["msg"].startswith("cannot patch the node annotations (retrying") for r in records)
        assert any(r["msg"].startswith("Allocate: 0000:03:00.0") for r in records)
        assert any(r["msg"] == "Allocate mode devices: the node's container runtime is unknown" for r in records)
        assert [r["msg"] for r in records].index("ListAndWatch: sending 8 devices (8 healthy)") < \
            [r["msg"] for r in records].index("Allocate mode devices: the node's container runtime is unknown")
        assert all(r["component"] == "gpu-device" for r in records)
        assert os.path.getsize(os.path.join(logdir, "gpu-device.log")) > 0
        assert not [n for n in os.listdir(peer.dir) if n.startswith("metax-gpu")]   # removed on exit
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        peer.stop()
        shutil.rmtree(base, ignore_errors=True)
