# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The role metax.gpu.maca_host (module maca) with the real ansible-playbook over a node root."""

from __future__ import annotations

import os
import role_runner

from .test_maca_install import maca_layers, payload, tree

IMAGE = "cr.metax-tech.com/library/maca-c500:%s-ubuntu18.04-amd64"


def run_role(tmp_path, **extra):
    return role_runner.run_role(tmp_path, "maca_host", **extra)[0]


def test_install_upgrade_switch_back_and_remove(tmp_path):
    root = tmp_path / "node"
    (root / "opt").mkdir(parents=True)
    remote = str(tmp_path / "payload-on-node")
    common = {"maca_host_host_root": str(root), "maca_host_remote_payload": remote}
    first = payload(tmp_path / "a.xz", "2.23.0.4", maca_layers("2.23.0.4"))
    second = payload(tmp_path / "b.xz", "3.0.0.8", maca_layers("3.0.0.8"))
    # install: copy + extract + switch, the copy removed again
    assert run_role(tmp_path, maca_host_payload=first, maca_host_image=IMAGE % "2.23.0.4", **common) == 3
    assert os.readlink(root / "opt" / "maca") == "maca-2.23.0.4" and not os.path.exists(remote)
    # the same again: nothing copied, nothing changed
    assert run_role(tmp_path, maca_host_payload=first, maca_host_image=IMAGE % "2.23.0.4", **common) == 0
    assert run_role(tmp_path, maca_host_payload=second, maca_host_image=IMAGE % "3.0.0.8", **common) == 3
    assert sorted(os.listdir(root / "opt")) == ["maca", "maca-2.23.0.4", "maca-3.0.0.8"]
    assert tree(root / "opt" / "maca-3.0.0.8")["Version.txt"] == b"Version:3.0.0.8\n"
    # back to the previous version: no payload needed
    assert run_role(tmp_path, maca_host_version="2.23.0.4", **common) == 1
    assert os.readlink(root / "opt" / "maca") == "maca-2.23.0.4"
    assert run_role(tmp_path, maca_host_state="absent", **common) == 1
    assert os.listdir(root / "opt") == []
