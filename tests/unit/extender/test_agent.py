# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The gpu-aware process: flags, node cache and ConfigMap through a fake API server, no-apiserver mode, SIGTERM."""
from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from extender_support import FakeApiServer, extender_args, gpu_pod, make_node
import polling
from ports import free_port

MODULE = "ansible_collections.metax.gpu.plugins.module_utils.agents.gpu_aware"
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def agent_env(extra=None):
    env = dict(os.environ, **(extra or {}))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.join(_REPO, ".build", "collections"),
                                                    env.get("PYTHONPATH")) if p)
    env.pop("KUBERNETES_SERVICE_HOST", None)
    env.pop("POD_NAMESPACE", None)
    return env


class Agent:
    def __init__(self, *args, env=None):
        self.port = free_port()
        environment = agent_env(env)
        self.proc = subprocess.Popen([sys.executable, "-m", MODULE, "--address", "127.0.0.1", "--port",
                                      str(self.port), "--log-format", "text", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environment)

    def get(self, path):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def post(self, verb, body):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            conn.request("POST", "/" + verb, body=body)
            resp = conn.getresponse()
            return resp.status, json.loads(resp.read())
        finally:
            conn.close()

    # Generous: the agent's start imports the kubernetes client, and on a loaded CI machine that
    # alone can take tens of seconds; only a failing run waits this long.
    def wait(self, path="/healthz", status=200, timeout=120):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError("agent exited: %s" % self.proc.stderr.read().decode())
            try:
                if self.get(path)[0] == status:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError("agent not answering %s with %d" % (path, status))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)         # a graceful stop is asserted (code 0): do not kill it early
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode, self.proc.stderr.read().decode()


@pytest.fixture
def agents():
    started = []

    def start(*args, **kwargs):
        started.append(Agent(*args, **kwargs))
        return started[-1]

    yield start
    for agent in started:
        agent.stop()


def wait_until(predicate, timeout=60):
    return polling.wait_until(predicate, timeout, interval=0.1)


def test_agent_with_a_fake_api_server(agents, tmp_path):
    pytest.importorskip("kubernetes")
    api = FakeApiServer().start()
    try:
        for i, allocated in enumerate(([], [0, 1, 4, 5], [0, 1, 2, 3, 4, 5, 6])):
            api.set("nodes", make_node(i, allocated=list(allocated)))
        agent = agents("--kubeconfig", api.kubeconfig(str(tmp_path / "kc")), "--namespace", "ns",
                       "--score-weight", "1", "--loss-weight", "0", "--resync-seconds", "30")
        agent.wait("/readyz")
        names = ["gpu-node-00000", "gpu-node-00001", "gpu-node-00002"]
        status, result = agent.post("filter", extender_args(gpu_pod(4), names=names))
        assert status == 200 and result["NodeNames"] == names[:2] and list(result["FailedNodes"]) == names[2:]
        body = extender_args(gpu_pod(4), names=names[:2])

        def scores():
            return {h["Host"]: h["Score"] for h in agent.post("prioritize", body)[1]}

        assert scores() == {"gpu-node-00000": 10, "gpu-node-00001": 0}
        api.set("configmaps", {"metadata": {"name": "gpu-aware-plugin", "namespace": "ns"},
                               "data": {"scoreWeight": "0", "lossWeight": "1"}})
        wait_until(lambda: scores() == {"gpu-node-00000": 0, "gpu-node-00001": 10})
        api.set("configmaps", {"metadata": {"name": "gpu-aware-plugin", "namespace": "ns"},
                               "data": {"scoreWeight": "-3", "lossWeight": "1"}})
        wait_until(lambda: b"gpu_aware_config_valid 0" in agent.get("/metrics")[1])
        assert scores() == {"gpu-node-00000": 0, "gpu-node-00001": 10}      # last good weights kept
        api.set("nodes", make_node(2, allocated=[]))                         # a node frees up
        wait_until(lambda: agent.post("filter", extender_args(gpu_pod(4), names=names))[1]["NodeNames"] == names)
        code, log = agent.stop()
        assert code == 0, log
        assert "rejected" in log and "stopped" in log
    finally:
        api.stop()


def test_agent_without_an_api_server(agents, tmp_path):
    """nodeCacheCapable: false requests are answered with the flag weights when no API server is reachable."""
    kubeconfig = tmp_path / "kc"
    dead = FakeApiServer()                       # never started: connection refused
    dead.kubeconfig(str(kubeconfig))
    dead.httpd.server_close()
    agent = agents("--kubeconfig", str(kubeconfig), "--score-weight", "0", "--loss-weight", "2")
    agent.wait("/healthz")
    nodes = [make_node(0, allocated=[]), make_node(1, allocated=[0, 1, 4, 5])]
    status, result = agent.post("prioritize", extender_args(gpu_pod(4), nodes))
    assert status == 200 and {h["Host"]: h["Score"] for h in result} == {"gpu-node-00000": 0, "gpu-node-00001": 10}
    status, result = agent.post("filter", extender_args(gpu_pod(4), nodes))
    assert len(result["Nodes"]["items"]) == 2
    assert agent.get("/readyz")[0] == 503
    code, log = agent.stop()
    assert code == 0 and "retrying" in log


def test_agent_without_any_kubernetes_configuration(agents):
    agent = agents("--no-node-cache", env={"HOME": "/nonexistent"})
    agent.wait("/readyz")
    code, log = agent.stop()
    assert code == 0 and "no Kubernetes API" in log


@pytest.mark.parametrize("args, message", [
    (["--score-weight", "x"], "--score-weight"),
    (["--loss-weight", "-1"], "--loss-weight"),
    (["--kubeconfig", "/nonexistent/kubeconfig"], "no such file"),
    (["--tls-cert", "/x"], "go together"),
    (["--tls-cert", "/nonexistent", "--tls-key", "/nonexistent"], "--tls-cert"),
    (["--max-body-bytes", "10"], "too small"),
    (["--max-connections", "1"], "--max-connections"),
    (["--idle-timeout", "0"], "--idle-timeout"),
    (["--request-timeout", "-1"], "--request-timeout"),
])
def test_usage_errors(args, message):
    proc = subprocess.run([sys.executable, "-m", MODULE, "--port", "0", *args], capture_output=True, text=True,
                          timeout=60, env=agent_env(), check=False)
    assert proc.returncode == 2 and message in proc.stderr
