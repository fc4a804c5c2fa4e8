# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Node networks for real: namespaces, veths on the bridge, pod CIDR routes -- in a private network and
mount namespace (its own links, iptables and /run/netns), so the fixed names touch nothing outside."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DRIVER = r"""
import json, subprocess, sys, time
from localcluster import nodes as nodes_mod
from localcluster.host import LocalHost
from localcluster.network import NetworkComponent
from localcluster.node import NodeNetworkComponent
from localcluster.settings import Settings

settings = Settings(state_dir=sys.argv[1])
host = LocalHost(settings.pids, settings.logs)
plan = tuple(nodes_mod.plan(["8xC500", "4xN100"], "vm"))
NetworkComponent(settings).up(host)
comps = [NodeNetworkComponent(settings, n, plan) for n in plan]
out = {"ready_before": [c.ready(host) for c in comps]}
for c in comps:
    c.up(host)
out["ready"] = [c.ready(host) for c in comps]
for c in comps:
    c.up(host)  # again
out["ready_again"] = [c.ready(host) for c in comps]
out["route_get"] = subprocess.run(["ip", "netns", "exec", "metax-gpu-vm", "ip", "route", "get", "10.244.1.7"],
                                  capture_output=True, text=True).stdout
# a TCP connection from the first node's namespace to the second node's address, over the bridge
server = subprocess.Popen(["ip", "netns", "exec", "metax-gpu-vm-2", sys.executable, "-c",
    "import socket; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
    "s.bind(('10.250.0.12', 18080)); s.listen(1); c, a = s.accept(); c.sendall(a[0].encode()); c.close()"])
client = ("import socket, time\nfor i in range(600):\n    try:\n"
          "        s = socket.create_connection(('10.250.0.12', 18080), 2); break\n"
          "    except OSError:\n        time.sleep(0.1)\nprint(s.recv(64).decode())")
out["peer_seen_by_server"] = subprocess.run(["ip", "netns", "exec", "metax-gpu-vm", sys.executable, "-c", client],
                                            capture_output=True, text=True, timeout=120).stdout.strip()
server.wait(timeout=120)
for c in comps:
    c.down(host)
out["ready_after_down"] = [c.ready(host) for c in comps]
out["netns_after_down"] = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
out["links_after_down"] = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
print(json.dumps(out))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="network and mount namespaces of its own need root")
def test_node_networks_in_private_namespaces(tmp_path):
    script = 'mkdir -p /run/netns && mount -t tmpfs tmpfs /run/netns && exec "$@"'
    proc = subprocess.run(["unshare", "--net", "--mount", "sh", "-c", script, "sh", sys.executable, "-c", DRIVER,
                           str(tmp_path / "state")], env=dict(os.environ, PYTHONPATH=TESTS), capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["ready_before"] == [False, False]
    assert out["ready"] == out["ready_again"] == [True, True]
    assert "via 10.250.0.12 dev eth0" in out["route_get"]  # the second node's pod CIDR, through it
    assert out["peer_seen_by_server"] == "10.250.0.11"
    assert out["ready_after_down"] == [False, False]
    assert "metax-gpu" not in out["netns_after_down"] and "metax-v" not in out["links_after_down"]
    with open(tmp_path / "state" / "nodes" / "vm-2" / "cni" / "net.d" / "10-metax-gpu-cluster.conflist",
              encoding="utf-8") as fh:
        assert '"subnet": "10.244.1.0/24"' in fh.read()
