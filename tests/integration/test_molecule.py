# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""`molecule test` of the cluster scenarios against the running local cluster.

Run from the integration phase (so `make test` runs it while the cluster is
up): converge (metax.gpu.site), idempotence (changed=0), verify
(metax.gpu.verify), cleanup (metax.gpu.uninstall + nothing of ours left).
``default`` installs GPU Extensions; ``operator`` the GPU Operator scheme
(``metax_gpu_scheme: operator`` in its group_vars; verify also waits for the
ClusterOperator's Ready).
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


@pytest.mark.parametrize("scenario", ["default", "operator"])
def test_molecule_scenario(cluster, scenario):
    molecule = shutil.which("molecule") or os.path.join(os.path.dirname(sys.executable), "molecule")
    env = dict(cluster.env)
    env["ANSIBLE_COLLECTIONS_PATH"] = os.path.join(ROOT, ".build", "collections")
    env["K8S_AUTH_KUBECONFIG"] = cluster.kubeconfig
    env["NO_COLOR"] = "1"
    env["ANSIBLE_FORCE_COLOR"] = "false"
    start = time.monotonic()
    proc = subprocess.run([molecule, "test", "-s", scenario], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=3600, check=False)
    output = proc.stdout + proc.stderr
    print("\nmolecule test -s %s: %.1fs" % (scenario, time.monotonic() - start))
    assert proc.returncode == 0, output[-8000:]
    for action in ("converge", "idempotence", "verify", "cleanup"):
        assert "%s: Executed: Successful" % action in output, action
