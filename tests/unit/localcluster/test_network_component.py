# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The network component for real -- ip and iptables -- inside a network namespace of its own.

A fresh namespace (unshare --net) has its own links, addresses and iptables
tables, so the cluster's fixed names (metax-br0, METAX-GPU-CLUSTER*) cannot
touch the machine's or a running cluster's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DRIVER = r"""
import json, subprocess
from localcluster.host import LocalHost
from localcluster.network import NetworkComponent
from localcluster.settings import Settings

def snapshot():
    return {"links": subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout,
            "lo": subprocess.run(["ip", "-4", "-o", "addr", "show", "dev", "lo"], capture_output=True, text=True).stdout,
            "filter": subprocess.run(["iptables", "-S"], capture_output=True, text=True).stdout,
            "nat": subprocess.run(["iptables", "-t", "nat", "-S"], capture_output=True, text=True).stdout}

host, comp = LocalHost("/nonexistent", "/nonexistent"), NetworkComponent(Settings())
out = {"ready_before": comp.ready(host)}
comp.up(host)
out["ready"] = comp.ready(host)
out["after_up"] = snapshot()
comp.up(host)
out["after_second_up"] = snapshot()
comp.down(host)
out["ready_after_down"] = comp.ready(host)
out["after_down"] = snapshot()
print(json.dumps(out))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="a network namespace of its own needs root")
def test_up_ready_down_in_a_private_network_namespace():
    proc = subprocess.run(["unshare", "--net", sys.executable, "-c", DRIVER], env=dict(os.environ, PYTHONPATH=TESTS),
                          capture_output=True, text=True, timeout=120, check=True)
    out = json.loads(proc.stdout)
    assert (out["ready_before"], out["ready"], out["ready_after_down"]) == (False, True, False)
    up = out["after_up"]
    assert "metax-br0" in up["links"] and " 10.96.0.1/32 " in up["lo"]
    assert "-A INPUT -j METAX-GPU-CLUSTER-IN" in up["filter"].splitlines()
    assert "-A OUTPUT -j METAX-GPU-CLUSTER" in up["nat"].splitlines()
    assert out["after_second_up"] == up  # idempotent: no second jump, no duplicated rule
    down = out["after_down"]
    assert "metax-br0" not in down["links"] and "10.96.0.1" not in down["lo"]
    assert "METAX" not in down["filter"] + down["nat"]
