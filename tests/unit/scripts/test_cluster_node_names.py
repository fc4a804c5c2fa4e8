# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The local cluster's node names do not depend on the machine it runs on.

Regression guard: nodes were named after the hostname (when it resolved to
127.0.0.1, else ``localhost``), while the example inventory that ``make demo``,
Molecule and the e2e tests use names ``vm``, ``vm-2``, ``vm-3``: on a machine
with another hostname all of them failed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
CLUSTER_SH = os.path.join(REPO, "scripts", "cluster", "cluster.sh")
INVENTORY = os.path.join(REPO, "docs", "examples", "local-cluster-inventory.yml")


def _demo_nodes() -> str:
    with open(os.path.join(REPO, "scripts", "demo.sh"), encoding="utf-8") as f:
        match = re.search(r"^export NODES=\$\{NODES:-([^}]+)\}$", f.read(), re.M)
    assert match, "scripts/demo.sh no longer sets its default NODES"
    return match.group(1)


def _plan(tmp_path, nodes: str, hostname: str = "") -> list[list[str]]:
    env = dict(os.environ, NODES=nodes, METAX_CLUSTER_DIR=str(tmp_path / "state"),
               METAX_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("METAX_NODE_NAME", None)
    argv = [CLUSTER_SH, "plan"]
    if hostname:
        # a UTS namespace of its own: the machine's hostname stays as it is
        argv = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', hostname] + argv
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    return [line.split() for line in proc.stdout.splitlines()]


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="a UTS namespace needs root and unshare")
@pytest.mark.parametrize("hostname", ["ci-runner-7f3a", "localhost", "VM"])
def test_names_do_not_follow_the_hostname(tmp_path, hostname):
    assert _plan(tmp_path, "8xC500 4xN100 2xC550-sriov", hostname) == [
        ["1", "vm", "8xC500"], ["2", "vm-2", "4xN100"], ["3", "vm-3", "2xC550-sriov"]]


def test_example_inventory_names_the_nodes_make_demo_starts(tmp_path):
    rows = _plan(tmp_path, _demo_nodes())
    planned = {row[1]: row[2] for row in rows}
    with open(INVENTORY, encoding="utf-8") as f:
        groups = yaml.safe_load(f)["all"]["children"]
    gpu_nodes = groups["gpu_nodes"]["hosts"]
    assert sorted(gpu_nodes) == sorted(planned)
    for name, host_vars in gpu_nodes.items():
        assert host_vars["metax_gpu_host_root"] == "/var/lib/metax-sim/" + name
    # the control plane is the first node: it carries the static kube-scheduler
    assert list(groups["kube_control_plane"]["hosts"]) == [rows[0][1]]
