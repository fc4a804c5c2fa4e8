# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""`molecule test` of molecule/default against the running local cluster.

Run from the integration phase (so `make test` runs it while the cluster is
up): converge (metax.gpu.site), idempotence (changed=0), verify
(metax.gpu.verify), cleanup (metax.gpu.uninstall + nothing of ours left).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
pytestmark = pytest.mark.cluster


def test_molecule_default_scenario(cluster):
    molecule = shutil.which("molecule") or os.path.join(os.path.dirname(sys.executable), "molecule")
    env = dict(cluster.env)
    env["ANSIBLE_COLLECTIONS_PATH"] = os.path.join(ROOT, ".build", "collections")
    env["K8S_AUTH_KUBECONFIG"] = cluster.kubeconfig
    env["NO_COLOR"] = "1"
    env["ANSIBLE_FORCE_COLOR"] = "false"
    proc = subprocess.run([molecule, "test", "-s", "default"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=3600, check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-8000:]
    for action in ("converge", "idempotence", "verify", "cleanup"):
        assert "%s: Executed: Successful" % action in output, action
