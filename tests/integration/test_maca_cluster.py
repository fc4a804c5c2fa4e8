# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The GPU Operator's MACA component on the local three-node cluster (issue 25, manual 3.1).

One helm install of files/charts/metax-operator with ``maca.deploy: true`` and
two MXMACA payload images built by files/images/maca-payload/build.sh
(``maca-c500``, ``maca-n100``). metax-maca mounts both as image volumes; on
each node maca-manager copies the one of the node's product (vm 8xC500 and
vm-3 2xC550: maca-c500, by family; vm-2 4xN100: maca-n100) to
``/opt/maca-<version>`` and switches ``/opt/maca``; the controller then sets
``maca.ready`` and gpu-device, gated on it, makes the GPUs allocatable.
A second version then switches every node with the first one kept for the
pods that mount it. Each node's /opt is put back as found.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

import pytest
from polling import wait_until
from test_operator_cluster import (  # noqa: F401  # pylint: disable=unused-import  # fixtures shared with the operator's module
    CHART, NS, UNINSTALL_SCRIPT, get_json, helm, no_extensions, nodes, patch_cr, strip_ours)

from ansible_collections.metax.gpu.plugins.module_utils import names as N
from ansible_collections.metax.gpu.plugins.module_utils.host import HostRoot
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator
from ansible_collections.metax.gpu.plugins.module_utils.sim.maca import PRODUCT_FILE

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PAYLOAD_BUILD = os.path.join(ROOT, "files", "images", "maca-payload", "build.sh")
SIM_PARENT = "/var/lib/metax-sim"
VERSIONS = ("2.18.0.3", "2.23.0.4")
PRODUCT = {"vm": "C500", "vm-2": "N100", "vm-3": "C500"}   # the payload each node takes
pytestmark = pytest.mark.cluster


def host(name):
    return HostRoot(os.path.join(SIM_PARENT, name))


@pytest.fixture(scope="module")
def payloads(cluster):
    """version -> the image names (below the agents' registry/project) of both products."""
    out = {}
    for version in VERSIONS:
        res = subprocess.run([PAYLOAD_BUILD, version, "c500", "n100"], env=cluster.env, capture_output=True,
                             text=True, timeout=600, stdin=subprocess.DEVNULL, check=False)
        assert res.returncode == 0, "payload build failed:\n%s%s" % (res.stdout, res.stderr[-3000:])
        out[version] = [line.split("=", 1)[1].rsplit("/", 1)[1] for line in res.stdout.split() if "=" in line]
    return out


@pytest.fixture(scope="module")
def opt_as_found(cluster):
    """Each node's /opt/maca link and maca-* directories put back as found."""
    names = sorted(n["name"] for n in cluster.nodes)
    if names != sorted(PRODUCT):
        pytest.fail("needs the three-node cluster %s (have %s)" % (sorted(PRODUCT), names))
    before = {}
    for name in PRODUCT:
        opt = host(name).join("opt")
        link = os.path.join(opt, "maca")
        before[name] = (os.readlink(link) if os.path.islink(link) else None,
                        set(os.listdir(opt)) if os.path.isdir(opt) else None)
        assert not os.path.isdir(link) or os.path.islink(link), "%s is a directory: not ours to replace" % link
    yield
    for name, (target, entries) in before.items():
        opt = host(name).join("opt")
        if not os.path.isdir(opt):
            continue
        for entry in set(os.listdir(opt)) - (entries or set()):
            path = os.path.join(opt, entry)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        link = os.path.join(opt, "maca")
        if target is not None:
            os.symlink(target, link + ".restore")
            os.replace(link + ".restore", link)
        if entries is None:
            shutil.rmtree(opt, ignore_errors=True)


@pytest.fixture(scope="module")
def installed(cluster, images, payloads, opt_as_found, no_extensions):
    strip_ours(cluster)
    # the MACA component alone (the driver and container-runtime, on by default since issue 38, are off here:
    # the simulated nodes carry their driver)
    args = ["--set", "maca.deploy=true", "--set", "maca.payload.images={%s}" % ",".join(payloads[VERSIONS[0]]),
            "--set", "driver.deploy=false", "--set", "runtime.deploy=false"]
    res = helm(cluster, "install", CHART, "--create-namespace", "-n", NS, "--generate-name", "--wait",
               "--set", "registry=" + images["registry"], "--set-string", "imageTag=" + images["tag"],
               "--set", "hostRoot.path=" + SIM_PARENT, "--set", "hostRoot.subPathExpr=$(NODE_NAME)",
               "--set", "log.dir=", "--set", "gpuDevice.healthyInterval=2", "--set", "nodeAgentPolicy.enabled=true",
               *args)
    assert res.returncode == 0, "helm install failed:\n%s\n%s" % (res.stdout, res.stderr)
    yield
    subprocess.run(["bash", "-c", UNINSTALL_SCRIPT], env=cluster.env, capture_output=True, timeout=600,
                   check=False)
    cluster.kubectl("delete", "namespace", NS, "--wait=true", "--timeout=120s")


def diagnose(cluster):
    out = [cluster.kubectl("get", "pods", "-n", NS, "-o", "wide").stdout]
    pods = (get_json(cluster, "pods", "-n", NS, "-l", "app.kubernetes.io/name=metax-maca") or {"items": []})["items"]
    for pod in pods:
        out.append("--- %s on %s: %s" % (pod["metadata"]["name"], pod["spec"].get("nodeName"),
                                         json.dumps((pod.get("status") or {}).get("containerStatuses"))[:1500]))
        out.append(cluster.kubectl("logs", "-n", NS, pod["metadata"]["name"], "-c", "metax-maca",
                                   "--tail=20").stdout[-3000:])
    for name, node in nodes(cluster).items():
        out.append("%s: %s" % (name, {k: v for k, v in (node["metadata"].get("labels") or {}).items()
                                      if k.startswith(N.PREFIX)}))
    return "\n".join(out)


def wait(cluster, predicate, timeout, what):
    try:
        wait_until(predicate, timeout, what, 1.0)
    except BaseException:
        print(diagnose(cluster))
        raise


def active(name):
    link = host(name).join("opt/maca")
    return os.readlink(link) if os.path.islink(link) else None


def maca_ready_with_devices(cluster):
    found = nodes(cluster)
    for name in PRODUCT:
        node = found[name]
        expected = sum(max(1, g.get("numvfs") or 0) for g in generator.load_state(host(name))["gpus"])
        if (node["metadata"].get("labels") or {}).get(N.LABEL_MACA_READY) != "true":
            return False
        if int(node["status"].get("allocatable", {}).get(N.RESOURCE_NAME, "0")) != expected:
            return False
    return True


def test_each_node_gets_its_products_maca_switched_then_maca_ready_then_gpus(cluster, installed):
    start = time.monotonic()
    wait(cluster, lambda: maca_ready_with_devices(cluster), 240, "maca.ready and allocatable GPUs on every node")
    print("\nmaca.ready and allocatable on 3 nodes %.1f s after the install" % (time.monotonic() - start))
    version = VERSIONS[0]
    for name, product in PRODUCT.items():
        assert active(name) == "maca-" + version, name
        tree = host(name).join("opt/maca-" + version)
        with open(os.path.join(tree, "Version.txt")) as handle:
            assert handle.read() == "Version:%s\n" % version
        with open(os.path.join(tree, PRODUCT_FILE)) as handle:
            assert handle.read() == product + "\n", name
        assert not [e for e in os.listdir(host(name).join("opt")) if e.endswith(".tmp")], name
    # gpu-device runs only where maca.ready is set (the chain)
    device = get_json(cluster, "daemonset", N.DAEMONSET_GPU_DEVICE, "-n", NS)
    assert device["spec"]["template"]["spec"]["nodeSelector"][N.LABEL_MACA_READY] == "true"


def test_a_new_payload_version_switches_every_node_and_keeps_the_previous_one(cluster, installed, payloads):
    old, new = VERSIONS
    assert patch_cr(cluster, {"maca": {"payload": {"images": payloads[new]}}}).returncode == 0
    wait(cluster, lambda: all(active(n) == "maca-" + new for n in PRODUCT), 180, "every node on MXMACA " + new)
    wait(cluster, lambda: maca_ready_with_devices(cluster), 120, "maca.ready again on every node")
    for name in PRODUCT:
        entries = os.listdir(host(name).join("opt"))
        # the version running pods started with stays (keep 1)
        assert {"maca-" + old, "maca-" + new} <= set(entries), (name, entries)
