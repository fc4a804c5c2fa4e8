# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""`molecule test -s operator` against the running local cluster (issue 24).

The GPU Operator scheme through the playbooks: converge (metax.gpu.site with
metax_gpu_scheme: operator), idempotence (changed=0), verify (metax.gpu.verify
and the ClusterOperator Ready), cleanup (metax.gpu.uninstall + nothing of ours
left). Run the same way as test_molecule.py runs molecule/default.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
pytestmark = pytest.mark.cluster


def test_molecule_operator_scenario(cluster):
    molecule = shutil.which("molecule") or os.path.join(os.path.dirname(sys.executable), "molecule")
    env = dict(cluster.env)
    env["ANSIBLE_COLLECTIONS_PATH"] = os.path.join(ROOT, ".build", "collections")
    env["K8S_AUTH_KUBECONFIG"] = cluster.kubeconfig
    env["NO_COLOR"] = "1"
    env["ANSIBLE_FORCE_COLOR"] = "false"
    start = time.monotonic()
    proc = subprocess.run([molecule, "test", "-s", "operator"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=3600, check=False)
    output = proc.stdout + proc.stderr
    print("\nmolecule test -s operator: %.1fs" % (time.monotonic() - start))
    assert proc.returncode == 0, output[-8000:]
    for action in ("converge", "idempotence", "verify", "cleanup"):
        assert "%s: Executed: Successful" % action in output, action
