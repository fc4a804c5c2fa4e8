# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""One action of a Molecule scenario against the running local cluster.

The cluster scenarios (``default``: GPU Extensions, ``operator``: the GPU
Operator scheme) are driven action by action from the end-to-end modules
(test_e2e_site.py, test_operator_site.py): their install is the scenario's
converge, their second run its idempotence, their uninstall its cleanup. So
``molecule`` is proven on the same install the end-to-end tests inspect, and CI
pays for each scheme's install once instead of twice (about 5 minutes).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from typing import Tuple

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def molecule(cluster, scenario: str, action: str, timeout: float = 1800) -> Tuple[str, float]:
    """Run ``molecule ACTION -s SCENARIO``; fail the test unless molecule reports the action successful.

    Returns the output and the seconds it took.
    """
    exe = shutil.which("molecule") or os.path.join(os.path.dirname(sys.executable), "molecule")
    env = dict(cluster.env)
    env["ANSIBLE_COLLECTIONS_PATH"] = os.path.join(ROOT, ".build", "collections")
    env["K8S_AUTH_KUBECONFIG"] = cluster.kubeconfig
    env["NO_COLOR"] = "1"
    env["ANSIBLE_FORCE_COLOR"] = "false"
    start = time.monotonic()
    proc = subprocess.run([exe, action, "-s", scenario], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
    secs = time.monotonic() - start
    output = proc.stdout + proc.stderr
    print("\nmolecule %s -s %s: %.1fs" % (action, scenario, secs))
    assert proc.returncode == 0, output[-8000:]
    assert "%s: Executed: Successful" % action in output, output[-4000:]
    return output, secs
