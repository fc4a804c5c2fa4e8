# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Preflight: another installation's files stop `up`; ours (baseline or marker) do not."""

from __future__ import annotations

from localcluster import preflight


def test_a_kubeadm_machine_is_refused(settings):
    present = {settings.kube_etc + "/admin.conf", settings.kube_etc + "/pki/ca.crt",
               settings.kubelet_dir + "/config.yaml", settings.kube_etc + "/unrelated"}
    found = preflight.foreign_files(settings, present, [settings.manifests + "/etcd.yaml"], False, False)
    assert found == [settings.kube_etc + "/admin.conf", settings.kube_etc + "/pki/ca.crt",
                     settings.manifests + "/etcd.yaml", settings.kubelet_dir + "/config.yaml"]


def test_our_own_files_are_not_foreign(settings):
    present = set(preflight.candidates(settings))
    assert preflight.foreign_files(settings, present, ["x"], baseline_complete=True, marker=False) == []
    assert preflight.foreign_files(settings, present, ["x"], baseline_complete=False, marker=True) == []
    assert preflight.foreign_files(settings, set(), [], False, False) == []


def test_ports_and_presets(settings):
    assert [port for _name, port in preflight.ports(settings)] == [2379, 2380, 6443, 10257, 5000, 5443]
    assert preflight.unknown_presets(["8xC500", "9xZ", "4xN100"], {"8xC500", "4xN100"}) == ["9xZ"]


def test_leftovers():
    assert "metax-br0 exists" in preflight.leftover_bridge(True, False)
    assert preflight.leftover_bridge(True, True) is None and preflight.leftover_bridge(False, False) is None
    assert not preflight.foreign_route(["10.250.0.0/24 dev metax-br0 proto kernel scope link src 10.250.0.1", ""])
    assert preflight.foreign_route(["10.250.0.0/24 dev eth1 proto kernel"])
