# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""gpu-label: which labels it writes and removes (the apiserver itself is exercised on the local cluster)."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
from polling import wait_until

from ansible_collections.metax.gpu.plugins.module_utils.agents.gpu_label import (
    ApiUnavailable, Labeller, run_loop,
)
from ansible_collections.metax.gpu.plugins.module_utils.host import HostRoot
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator

from agent_process import agent_env, run_agent

P = "metax-tech.com/"
MODULE = "ansible_collections.metax.gpu.plugins.module_utils.agents.gpu_label"


class NodeLabels:
    """The labels of one Node, with merge-patch semantics (None deletes)."""

    def __init__(self, labels):
        self.labels = dict(labels)
        self.patches = []
        self.down = False

    def read(self):
        if self.down:
            raise ApiUnavailable("get node n1: connection refused")
        return dict(self.labels)

    def patch(self, patch):
        if self.down:
            raise ApiUnavailable("patch node n1: connection refused")
        self.patches.append(dict(patch))
        for key, value in patch.items():
            if value is None:
                self.labels.pop(key, None)
            else:
                self.labels[key] = value


def labeller(host, node, mode="native"):
    return Labeller(host, mode, node.read, node.patch)


FOREIGN = {"kubernetes.io/hostname": "n1", P + "gpu.driver.channel": "beta", P + "other": "x"}


def test_labels_written_once_and_foreign_labels_kept(make_node):
    node = NodeLabels(FOREIGN)
    lab = labeller(make_node("8xC500"), node)
    patch = lab.sync()
    assert len(patch) == 12
    assert node.labels[P + "gpu.installed"] == "true" and node.labels[P + "gpu.product"] == "MXC500"
    for key, value in FOREIGN.items():
        assert node.labels[key] == value
    assert lab.sync() == {} and len(node.patches) == 1           # nothing changed: nothing written


def test_wrong_values_corrected_and_stale_keys_removed(make_node):
    host = make_node("8xC500")
    node = NodeLabels(dict(FOREIGN, **{P + "gpu.product": "N100", P + "gpu.vfnum": "8"}))
    lab = labeller(host, node)
    lab.sync()
    assert node.labels[P + "gpu.product"] == "MXC500" and node.labels[P + "gpu.vfnum"] == "0"
    generator.unload_driver(host)
    patch = lab.sync()
    assert patch == {P + "driver.ready": "false", P + "gpu.driver.major": None,
                     P + "gpu.driver.minor": None, P + "gpu.driver.patch": None}
    # the driver unloaded, PCI says only "MXC": the product mx-smi named stays (no selector flaps)
    assert node.labels[P + "gpu.installed"] == "true" and node.labels[P + "gpu.product"] == "MXC500"
    generator.load_driver(host)
    assert lab.sync()[P + "driver.ready"] == "true"


def test_no_gpu_leaves_installed_false_alone(make_node, tmp_path):
    node = NodeLabels(FOREIGN)
    labeller(make_node("4xN100"), node).sync()
    empty = tmp_path / "plain-node"
    (empty / "sys" / "bus" / "pci" / "devices").mkdir(parents=True)
    labeller(HostRoot(str(empty)), node).sync()
    ours = {k: v for k, v in node.labels.items() if k.startswith(P) and k not in FOREIGN}
    assert ours == {P + "gpu.installed": "false"}
    assert all(node.labels[k] == v for k, v in FOREIGN.items())


def test_cloud_mode_and_sriov(make_node):
    host = make_node("2xC550-sriov")
    for gpu in generator.load_state(host)["gpus"]:
        host.write_attribute("sys/bus/pci/devices/%s/sriov_numvfs" % gpu["bdf"], "4")
    node = NodeLabels({})
    labeller(host, node, "cloud").sync()
    assert node.labels[P + "gpu.sriov"] == "on" and node.labels[P + "gpu.vfnum"] == "4"
    assert node.labels[P + "gpu.driver.mode"] == "cloud" and node.labels[P + "gpu.count"] == "2"


def test_apiserver_away_backs_off_and_keeps_running(make_node):
    node = NodeLabels({})
    node.down = True
    lab = labeller(make_node("1xC500"), node)
    stop = threading.Event()
    assert run_loop(lab, 60, stop, once=True) == 1
    thread = threading.Thread(target=run_loop, args=(lab, 0.2, stop), daemon=True)
    thread.start()
    try:
        stop.wait(1.0)
        assert thread.is_alive() and not node.patches
        node.down = False
        wait_until(lambda: node.patches, 60, "a patch once the apiserver is back", interval=0.1)
        assert node.labels[P + "gpu.installed"] == "true"
    finally:
        stop.set()
        thread.join(5)


def test_process_keeps_running_without_apiserver(make_node, tmp_path):
    """As a process: the apiserver is away, gpu-label logs why, backs off, stays up and stops on SIGTERM."""
    import json
    import signal
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:%d', insecure-skip-tls-verify: true}}]\n"
        "users: [{name: u, user: {token: x}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n"
        "current-context: c\n" % port)
    host = make_node("1xC500")
    proc = subprocess.Popen([sys.executable, "-m", MODULE, "--host-root", host.path, "--node-name", "n1",
                             "--kubeconfig", str(kubeconfig), "--interval", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=agent_env())
    lines = []

    def read_stderr():
        for line in proc.stderr:
            lines.append(line.decode())

    def retries():
        records = [json.loads(line) for line in list(lines) if line.startswith("{")]
        return [r for r in records if r["msg"].startswith("cannot update the node labels (retrying")]

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    try:
        # SIGTERM once it has retried twice, not after a fixed sleep: a loaded
        # machine (the unit tests run on every core) may still be importing then
        wait_until(lambda: len(retries()) >= 2 or proc.poll() is not None, 60, "gpu-label to retry twice")
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        reader.join(60)
        assert len(retries()) >= 2 and "get node n1" in retries()[0]["msg"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def test_unreadable_root_writes_nothing(tmp_path):
    node = NodeLabels({P + "gpu.installed": "true"})
    lab = labeller(HostRoot(str(tmp_path)), node)
    assert run_loop(lab, 60, threading.Event(), once=True) == 1
    assert not node.patches


@pytest.mark.parametrize("args, message", [
    (["--interval", "0"], "argument --interval: 0 must be positive"),
    (["--interval", "soon"], "'soon' is not a number"),
    (["--driver-mode", "both"], "invalid choice: 'both'"),
])
def test_bad_flag_values(args, message, capsys):
    from ansible_collections.metax.gpu.plugins.module_utils.agents.gpu_label import build_parser

    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(args)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    ([], "--node-name is required"),
    (["--node-name", "n1", "--interval", "0"], "argument --interval: 0 must be positive"),
    (["--node-name", "n1", "--host-root", "/nonexistent"], "--host-root /nonexistent: no such directory"),
    (["--node-name", "n1", "--host-root", "/", "--kubeconfig", "/nonexistent/kc"],
     "--kubeconfig /nonexistent/kc: no such file"),
])
def test_bad_flags(args, message):
    result = run_agent(MODULE, *args)
    assert result.returncode == 2
    assert message in result.stderr.decode(), result.stderr
    assert "Traceback" not in result.stderr.decode()


def test_garbage_mx_smi_still_labels_from_pci_and_warns_once(make_node, caplog):
    host = make_node("8xC500")
    path = host.join("usr/bin/mx-smi")
    with open(path, "w") as handle:
        handle.write("#!/bin/sh\necho 'mx-smi 3.0: new layout'; echo '| a | b |'\n")
    node = NodeLabels(FOREIGN)
    lab = labeller(host, node)
    caplog.set_level("WARNING")
    lab.sync()
    lab.sync()
    # the PCI id 0x4001 says only the family (an MXC500 or an MXC550)
    assert node.labels[P + "gpu.product"] == "MXC" and node.labels[P + "gpu.count"] == "8"
    assert node.labels[P + "gpu.memory"] == "64GB" and node.labels[P + "driver.ready"] == "true"
    warned = [r.getMessage() for r in caplog.records if "mx-smi" in r.getMessage()]
    assert len(warned) == 1 and "(line 1: 'mx-smi 3.0: new layout')" in warned[0]
    assert lab.warnings and "no device table header" in lab.warnings[0]


def test_ready_file_after_the_first_labelling_and_removed_on_exit(make_node, tmp_path):
    """The pod's readiness: not ready while the apiserver is away, ready once labelled, gone when it stops."""
    ready = tmp_path / "run" / "ready"
    node = NodeLabels({})
    node.down = True
    lab = labeller(make_node("1xC500"), node)
    stop = threading.Event()
    thread = threading.Thread(target=run_loop, args=(lab, 0.2, stop), kwargs={"ready_file": str(ready)}, daemon=True)
    thread.start()
    try:
        stop.wait(0.5)
        assert not ready.exists()
        node.down = False
        wait_until(ready.exists, 30, "the ready file", interval=0.05)
        assert node.labels[P + "gpu.installed"] == "true"
        node.down = True      # a labelled node stays ready while the apiserver is away
        stop.wait(0.5)
        assert ready.exists()
    finally:
        stop.set()
        thread.join(60)
    assert not thread.is_alive() and not ready.exists()


def test_the_label_access_is_our_node_through_kube_node_with_its_hints(monkeypatch):
    """kube_label_access reads the Node as JSON and merge-patches only the labels given (kube/node.py);
    a refusal is ApiUnavailable naming the RBAC rule (the run loop's backoff retries it)."""
    import json
    from ansible_collections.metax.gpu.plugins.module_utils.agents import gpu_label
    from ansible_collections.metax.gpu.plugins.module_utils.kube.client import ApiException

    calls = []

    class Raw:
        def __init__(self, body):
            self.data = body

        def release_conn(self):
            calls.append("released")

    class Core:
        forbidden = False

        def read_node(self, name, **kwargs):
            calls.append(("read", name, kwargs["_preload_content"]))
            if self.forbidden:
                exc = ApiException()
                exc.status, exc.reason = 403, "Forbidden"
                raise exc
            return Raw(json.dumps({"metadata": {"name": name, "labels": {P + "gpu.count": "8"}}}).encode())

        def patch_node(self, name, body, **kwargs):
            calls.append(("patch", name, body, kwargs["_content_type"]))
            return Raw(b"{}")
    core = Core()
    monkeypatch.setattr(gpu_label, "core_v1", lambda api: core)
    read, patch = gpu_label.kube_label_access(object(), "n1")
    assert read() == {P + "gpu.count": "8"}
    patch({P + "gpu.count": None})
    assert calls == [("read", "n1", False), "released",
                     ("patch", "n1", {"metadata": {"labels": {P + "gpu.count": None}}}, "application/merge-patch+json"),
                     "released"]
    core.forbidden = True
    with pytest.raises(ApiUnavailable, match="RBAC: the service account needs get and patch on nodes"):
        read()
