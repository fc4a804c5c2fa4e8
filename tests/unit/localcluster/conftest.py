# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Fixtures of the localcluster unit tests: settings in a temporary root, a three-node plan."""

from __future__ import annotations

import pytest

from localcluster import nodes as nodes_mod
from localcluster.component import Inputs
from localcluster.settings import Settings

PRESETS = ["8xC500", "4xN100", "2xC550-sriov"]


@pytest.fixture
def settings(tmp_path) -> Settings:
    return Settings(state_dir=str(tmp_path / "state"), run_dir=str(tmp_path / "run"),
                    kube_etc=str(tmp_path / "etc-kubernetes"), kubelet_dir=str(tmp_path / "var-lib-kubelet"),
                    sim_root=str(tmp_path / "sim" / "root"), cache_dir=str(tmp_path / "cache"))


@pytest.fixture
def three() -> list[nodes_mod.Node]:
    return nodes_mod.plan(PRESETS, "vm")


@pytest.fixture
def inputs(three) -> Inputs:
    from localcluster import pki
    certs = {c.name: (("CRT " + c.name).encode(), ("KEY " + c.name).encode()) for c in pki.plan(three)}
    return Inputs(ca_crt=b"CA", certs=certs, registry_secret="s1", registry_auth_secret="s2",
                  registry_password="pw", runc="/usr/sbin/runc")
