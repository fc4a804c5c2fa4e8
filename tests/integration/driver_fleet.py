# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The local cluster's GPU nodes made ready for metax.gpu.driver_upgrade.

Shared by tests/integration/test_driver_upgrade_cluster.py and
benchmarks/driver_upgrade.py. The nodes' roots are simulated: each gets the
simulator's package tools (dpkg on vm and vm-2, rpm on vm-3: a mixed fleet)
and driver packages in /var/cache/metax-driver; the agents are this
checkout's images and chart. :func:`restore` leaves the cluster as found.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, Iterable, Optional

from ansible_collections.metax.gpu.plugins.module_utils import names as N
from ansible_collections.metax.gpu.plugins.module_utils.host import HostRoot
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator, pkgtool

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
INVENTORY = os.path.join(ROOT, "docs", "examples", "local-cluster-inventory.yml")
SIM_PARENT = "/var/lib/metax-sim"
CACHE = "var/cache/metax-driver"
KINDS = {"vm": "deb", "vm-2": "deb", "vm-3": "rpm"}
DAY_TWO_LABELS = (N.LABEL_DRIVER_UPGRADE_STATE, N.LABEL_AGENTS_PAUSED)
DAY_TWO_ANNOTATIONS = (N.ANNOTATION_PRE_CORDONED, N.PREFIX + "driver.upgrade.message",
                       N.ANNOTATION_MAINTENANCE_OWNER, N.ANNOTATION_MAINTENANCE_CORDON)


class FleetError(RuntimeError):
    """The cluster cannot be prepared (wrong nodes, image build or install failed)."""


@dataclass
class Fleet:
    original: Dict[str, str]                 # node -> driver version before we started
    installed_agents: bool                   # we ran metax.gpu.install (so restore uninstalls)
    extra: Dict[str, object] = field(default_factory=dict)


def host(name: str) -> HostRoot:
    return HostRoot(os.path.join(SIM_PARENT, name))


def loaded(name: str) -> Optional[str]:
    return host(name).read_attribute("sys/module/metax/version", default="") or None


def ansible(cluster, name: str, *extra: str, env: Optional[Dict[str, str]] = None):
    """ansible-playbook metax.gpu.NAME on the local inventory: (CompletedProcess, seconds)."""
    cmd = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", INVENTORY,
           "-e", "metax_gpu_kubeconfig=" + cluster.kubeconfig, "metax.gpu." + name] + list(extra)
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env or cluster.env, timeout=1800, check=False)
    return proc, time.monotonic() - start


def prepare(cluster, versions: Iterable[str], broken: Iterable[tuple] = ()) -> Fleet:
    """Install this checkout's agents when absent, give every node the tools and the packages.

    ``versions``: driver versions to package for every node besides its
    original one; ``broken``: (node, version) pairs whose package installs a
    driver that never comes up (for rollback tests).
    """
    names = [n["name"] for n in cluster.nodes]
    if sorted(names) != sorted(KINDS):
        raise FleetError("needs the three-node cluster vm, vm-2, vm-3 (have %s)" % names)
    installed = cluster.kubectl("get", "daemonset", N.DAEMONSET_GPU_LABEL, "-n", N.NAMESPACE).returncode == 0
    # this checkout's agent images (build.sh pushes them to the cluster's registry) and chart
    build = subprocess.run([os.path.join(ROOT, "files", "images", "agent", "build.sh")], env=cluster.env,
                           capture_output=True, text=True, timeout=1800, stdin=subprocess.DEVNULL, check=False)
    if build.returncode != 0:
        raise FleetError("agent image build failed:\n%s%s" % (build.stdout, build.stderr[-3000:]))
    images = dict(line.split("=", 1) for line in build.stdout.split() if "=" in line)
    tag = images["gpu-device"].rsplit(":", 1)[1]
    proc, _secs = ansible(cluster, "install", "-e", "gpu_extensions_image_tag=" + tag,
                          "-e", "gpu_extensions_deploy_extender_gpu_aware=false")
    if proc.returncode != 0:
        raise FleetError("metax.gpu.install failed:\n%s\n%s" % (proc.stdout[-8000:], proc.stderr[-3000:]))
    original = {name: generator.load_state(host(name))["driver_version"] for name in KINDS}
    bad = set(broken)
    for name, kind in KINDS.items():
        root = host(name)
        pkgtool.install_tools(root.path, kind)
        for version in [original[name]] + [v for v in versions if v != original[name]]:
            pkgtool.make_package(root.join(CACHE), kind, version, broken=(name, version) in bad)
    return Fleet(original=original, installed_agents=not installed)


def settled(cluster) -> bool:
    """Every GPU node validates (labels back, allocatable = healthy devices)."""
    from ansible_collections.metax.gpu.plugins.filter.driver_upgrade import driver_upgrade_validation

    nodes = [n for n in cluster.read_nodes() if n["metadata"]["name"] in KINDS]
    return all(not driver_upgrade_validation(n) for n in nodes)


def restore(cluster, fleet: Fleet) -> None:
    """Original driver loaded, no tools or packages, no marks, no cordon of ours."""
    for name in KINDS:
        root = host(name)
        if loaded(name) != fleet.original[name]:
            generator.unload_driver(root)
            generator.set_driver_version(root, fleet.original[name])
            generator.load_driver(root)
        pkgtool.remove_tools(root.path)
        shutil.rmtree(root.join(CACHE), ignore_errors=True)
        for parent in ("var/cache", "var"):           # made for the cache; leave nothing behind
            if os.path.isdir(root.join(parent)) and not os.listdir(root.join(parent)):
                os.rmdir(root.join(parent))
        cluster.kubectl("uncordon", name)
        cluster.kubectl("label", "node", name, *[key + "-" for key in DAY_TWO_LABELS])
        cluster.kubectl("annotate", "node", name, *[key + "-" for key in DAY_TWO_ANNOTATIONS])
    if fleet.installed_agents:
        ansible(cluster, "uninstall")
