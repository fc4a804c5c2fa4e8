# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Components with their lifecycle, run for real in a temporary state: the PKI (openssl) and etcd."""

from __future__ import annotations

import base64
import os
import subprocess
import time

import yaml
from ports import free_port

from localcluster import etcd, nodes as nodes_mod, pki
from localcluster.component import Inputs
from localcluster.host import LocalHost
from localcluster.settings import Settings


def _settings(tmp_path, **kw) -> Settings:
    return Settings(state_dir=str(tmp_path / "state"), kube_etc=str(tmp_path / "etc"), **kw)


def test_pki_up_makes_the_plan_and_keeps_it(tmp_path):
    s = _settings(tmp_path)
    three = tuple(nodes_mod.plan(["8xC500", "4xN100", "2xC550-sriov"], "vm"))
    host = LocalHost(s.pids, s.logs)
    comp = pki.PkiComponent(s, three, Inputs())
    assert not comp.ready(host)
    comp.up(host)
    assert comp.ready(host)  # every certificate verifies against the CA
    text = subprocess.run(["openssl", "x509", "-in", s.pki + "/kubelet-vm-3.crt", "-noout", "-text"],
                          capture_output=True, text=True, check=True).stdout
    assert "IP Address:10.250.0.13" in text
    assert sorted(f for f in os.listdir(s.pki) if f.endswith((".csr", ".ext"))) == []
    assert all(os.stat(os.path.join(s.pki, f)).st_mode & 0o077 == 0 for f in os.listdir(s.pki) if f.endswith(".key"))
    conf = yaml.safe_load(open(s.state_dir + "/nodes/vm-2/kubelet.conf", encoding="utf-8"))
    crt = base64.b64decode(conf["users"][0]["user"]["client-certificate-data"])
    assert crt == open(s.pki + "/kubelet-client-vm-2.crt", "rb").read()
    assert open(s.kube_etc + "/.metax-gpu-cluster", encoding="utf-8").read() == s.state_dir + "\n"
    # a second up remakes nothing
    before = {f: os.stat(os.path.join(s.pki, f)).st_mtime_ns for f in os.listdir(s.pki)}
    comp.up(host)
    assert {f: os.stat(os.path.join(s.pki, f)).st_mtime_ns for f in os.listdir(s.pki)} == before


def test_etcd_up_ready_down(tmp_path):
    s = _settings(tmp_path, etcd_port=free_port(), etcd_peer_port=free_port())
    host = LocalHost(s.pids, s.logs, grace=5.0)
    comp = etcd.EtcdComponent(s)
    try:
        assert not comp.ready(host)
        comp.up(host)
        deadline = time.monotonic() + 60       # etcd's start: generous for a loaded CI machine
        while not comp.ready(host) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert comp.ready(host), open(s.logs + "/etcd.log", encoding="utf-8").read()
        assert os.stat(s.state_dir + "/etcd").st_mode & 0o777 == 0o700
        pid = host.pid("etcd")
        comp.up(host)
        assert host.pid("etcd") == pid  # running with the same command line: kept
    finally:
        comp.down(host)
    assert not host.running("etcd") and not comp.ready(host)
