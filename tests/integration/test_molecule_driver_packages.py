# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""`molecule test -s driver_packages`: metax.gpu.driver on a dpkg and an rpm node.

Two podman containers stand in for nodes with different package tools; the
scenario builds real .deb and .rpm test packages and proves install, upgrade,
removal and idempotence per package kind (molecule/driver_packages/molecule.yml).
It does not use the Kubernetes cluster, so it is not marked ``cluster``; it
runs in the integration phase because it needs root and podman. Without root
it skips; as root a missing podman is a failure (scripts/cluster/packages.sh
installs it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ACTIONS = ("dependency", "create", "prepare", "converge", "idempotence", "verify", "destroy")


def test_molecule_driver_packages_scenario():
    if os.geteuid() != 0:
        pytest.skip("the driver_packages scenario runs root podman containers")
    assert shutil.which("podman"), "podman is missing: run scripts/cluster/packages.sh"
    molecule = shutil.which("molecule") or os.path.join(os.path.dirname(sys.executable), "molecule")
    env = dict(os.environ)
    env["ANSIBLE_COLLECTIONS_PATH"] = os.path.join(ROOT, ".build", "collections")
    env["NO_COLOR"] = "1"
    env["ANSIBLE_FORCE_COLOR"] = "false"
    proc = subprocess.run([molecule, "test", "-s", "driver_packages"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=1800, check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-8000:]
    for action in ACTIONS:
        assert "driver_packages > %s: Executed: Successful" % action in output, action
    # Both package kinds went through the module (the nodes' own tools chose them).
    for node in ("metax-molecule-deb-node", "metax-molecule-rpm-node"):
        assert "changed: [%s]" % node in output, node
