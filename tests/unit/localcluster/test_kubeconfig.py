# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""kubeconfigs: who talks to which apiserver address, with which certificate."""

from __future__ import annotations

import base64

import yaml

from localcluster import kubeconfig
from localcluster.component import Write


def test_render_is_a_kubeconfig():
    doc = yaml.safe_load(kubeconfig.render("https://10.250.0.1:6443", "system:node:vm", b"CA", b"CRT", b"KEY"))
    assert doc["current-context"] == "system:node:vm@kubernetes"
    cluster = doc["clusters"][0]["cluster"]
    assert cluster["server"] == "https://10.250.0.1:6443"
    assert base64.b64decode(cluster["certificate-authority-data"]) == b"CA"
    user = doc["users"][0]
    assert user["name"] == "system:node:vm"
    assert base64.b64decode(user["user"]["client-key-data"]) == b"KEY"
    assert doc["contexts"][0]["context"] == {"cluster": "kubernetes", "user": "system:node:vm"}


def test_host_components_use_loopback_node_side_the_bridge(settings, three):
    servers = {spec.path.rsplit("/", 2)[-1] if "nodes/" in spec.path else spec.path.rsplit("/", 1)[-1]:
               spec.server for spec in kubeconfig.plan(settings, three)}
    assert servers["admin.conf"] == servers["controller-manager.conf"] == "https://127.0.0.1:6443"
    # the scheduler and kube-proxy run in a node's network namespace
    assert servers["scheduler.conf"] == servers["kube-proxy.conf"] == "https://10.250.0.1:6443"
    assert {spec.server for spec in kubeconfig.plan(settings, three) if spec.path.endswith("/kubelet.conf")} == {
        "https://10.250.0.1:6443"}


def test_files(settings, three, inputs):
    files = kubeconfig.files(settings, three, inputs)
    by_path = {f.path: f for f in files}
    assert len(files) == 4 + 3 + 1
    assert all(f.mode == 0o600 and f.write is Write.IF_ABSENT for f in files)
    # kubeadm's /etc/kubernetes/kubelet.conf is the first node's
    assert by_path[settings.kube_etc + "/kubelet.conf"].content == by_path[
        settings.state_dir + "/nodes/vm/kubelet.conf"].content
    node3 = yaml.safe_load(by_path[settings.state_dir + "/nodes/vm-3/kubelet.conf"].content)
    assert base64.b64decode(node3["users"][0]["user"]["client-certificate-data"]) == b"CRT kubelet-client-vm-3"
