# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Paged lists against a real kube-apiserver (issue 29): metax.gpu.kube_list and driver_upgrade --check.

A private control plane (controlplane.py: no kubelets, the shared local
cluster is not needed) holds 120 Node objects (Ready, gpu.installed on every
second one) and a GPU pod bound to every fourth node. Then:

- metax.gpu.kube_list reads them 50 a page: 3 requests, every node once,
  label and field selectors as the API server applies them;
- metax.gpu.node_metadata (the uninstall role's) removes the metax-tech.com/
  labels and annotations from the nodes carrying them, and nothing else:
  check mode and diff first, then a second run that changes nothing, and a
  Kubernetes prefix refused with nothing changed;
- the real driver_upgrade playbook with --check and
  driver_upgrade_check_nodes=false (the bastion side only: fake nodes have
  no host) plans every node of gpu_nodes in pages of 25 and prints, for
  each node, exactly the GPU pods bound to it;
- the real verify playbook reads every node in pages of 25 per attempt:
  nodes carrying our agents' real output (the scale profile's) pass, and a
  bare node and one missing from the cluster are each named;
- gpu-aware's node cache and driver-manager's slot watch on kube/watch.py,
  the server's JSON read in pages and followed through watches;
- driver-manager's driver-config watch, run against it with the server
  ending each watch after 1 s: listed once, then resumed from the last
  version seen each time, and woken by an edit;
- metax.gpu.installed_scheme reads the DaemonSets and the ClusterOperator
  objects a page at a time, before and after the ClusterOperator CRD exists.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from controlplane import ControlPlane
from kubernetes import client as k8s_client

from ansible_collections.metax.gpu.plugins.module_utils import names as N
from ansible_collections.metax.gpu.plugins.module_utils.kube.client import api_client, core_v1

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.path.dirname(sys.executable)
COUNT = 120
NAMESPACE = "ml"


def typed(kubeconfig):
    """The client's typed CoreV1Api, for what the tests create and change (the collection's calls: core_v1)."""
    return k8s_client.CoreV1Api(api_client(kubeconfig))


def gpu_pod(index, node):
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train-%03d" % index, "namespace": NAMESPACE},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "registry.invalid/train:1", "resources": {
                "limits": {N.RESOURCE_NAME: "1"}, "requests": {N.RESOURCE_NAME: "1"}}}]}}


@pytest.fixture(scope="module")
def cp():
    plane = ControlPlane().start()
    try:
        nodes = [{"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": "node-%03d" % i, "labels": {N.LABEL_GPU_INSTALLED: "true"} if i % 2 == 0 else {}}}
            for i in range(COUNT)]
        res = plane.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": nodes}))
        assert res.returncode == 0, res.stderr
        # Ready through the status subresource (no kubelet reports it), with the client: a kubectl per node is slow
        core = core_v1(api_client(plane.kubeconfig))
        for node in nodes:
            core.patch_node_status(node["metadata"]["name"],
                                   {"status": {"conditions": [{"type": "Ready", "status": "True"}]}})
        for args in (("create", "namespace", NAMESPACE), ("create", "serviceaccount", "default", "-n", NAMESPACE)):
            assert plane.kubectl(*args).returncode == 0
        pods = [gpu_pod(i, "node-%03d" % i) for i in range(0, COUNT, 4)]
        res = plane.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": pods}))
        assert res.returncode == 0, res.stderr
        yield plane
    finally:
        plane.stop()


def _env():
    return dict(os.environ, ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".build", "collections"),
                ANSIBLE_PYTHON_INTERPRETER=sys.executable, PYTHONWARNINGS="ignore",
                PATH=BIN + os.pathsep + os.environ.get("PATH", ""))


def module(cp, name, args, *flags, ok=True):
    """One ad-hoc module run against the private control plane; its result (and the exit status when ``ok=False``)."""
    args = dict(args, kubeconfig=cp.kubeconfig)
    proc = subprocess.run([os.path.join(BIN, "ansible"), "localhost", "-m", name, "-a", json.dumps(args), "-o",
                           *flags], capture_output=True, text=True, env=_env(), timeout=300, check=False)
    assert (proc.returncode == 0) == ok, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.split("=>", 1)[1])


def kube_list(cp, **args):
    return module(cp, "metax.gpu.kube_list", args)


def test_every_node_once_in_pages(cp):
    out = kube_list(cp, kind="Node", page_size=50)
    names = [n["metadata"]["name"] for n in out["resources"]]
    assert sorted(names) == ["node-%03d" % i for i in range(COUNT)] and out["pages"] == 3
    assert out["restarts"] == 0 and out["resource_version"] and out["changed"] is False
    gpu = kube_list(cp, kind="Node", page_size=7, label_selectors=[N.LABEL_GPU_INSTALLED + "=true"])
    assert len(gpu["resources"]) == COUNT // 2 and gpu["pages"] >= 9   # a filtered page may hold fewer
    pods = kube_list(cp, kind="Pod", page_size=10, field_selectors=["spec.nodeName=node-004"])
    assert [p["metadata"]["name"] for p in pods["resources"]] == ["train-004"]


def test_driver_upgrade_check_plans_every_node_from_pages(cp, tmp_path):
    hosts = {"node-%03d" % i: {} for i in range(COUNT)}
    inventory = tmp_path / "inventory.json"
    inventory.write_text(json.dumps({"all": {"vars": {"ansible_connection": "local"},
                                             "children": {"gpu_nodes": {"hosts": hosts}}}}))
    proc = subprocess.run(
        [os.path.join(BIN, "ansible-playbook"), "-i", str(inventory), "metax.gpu.driver_upgrade", "--check",
         "-e", "driver_upgrade_version=2.40.1", "-e", "metax_gpu_kubeconfig=" + cp.kubeconfig,
         "-e", "driver_upgrade_check_nodes=false", "-e", "driver_upgrade_page_size=25",
         "-e", "driver_upgrade_serial=10", "-e", "driver_upgrade_max_unavailable=10%"],
        capture_output=True, text=True, env=_env(), timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]
    plan = proc.stdout[proc.stdout.index("Show the plan"):]
    for i in range(COUNT):
        # each node's entry, and in it its own pod only
        entry = plan[plan.index('"node-%03d": {' % i):]
        entry = entry[:entry.index("}")]
        assert ('"%s/train-%03d"' % (NAMESPACE, i) in entry) == (i % 4 == 0), entry
        assert '"from": null' in entry
    assert plan.count('"%s/train-' % NAMESPACE) == COUNT // 4
    assert ": Cordon]" not in proc.stdout


def test_node_metadata_removes_our_keys_from_every_node_and_nothing_else(cp):
    core = core_v1(api_client(cp.kubeconfig))
    ours = {"metax-tech.com/gpu.product": "C500", "metax-tech.com/gpu.count": "8"}
    foreign = {"example.com/team": "ml", "metax-tech.com.example.org/other": "x"}
    marked = ["node-%03d" % i for i in range(3, COUNT, 6)]          # odd nodes: no gpu.installed from the fixture
    labelled = ["node-%03d" % i for i in range(0, COUNT, 2)]        # gpu.installed=true (the fixture)
    for name in marked:
        core.patch_node(name, {"metadata": {"labels": dict(ours, **foreign), "annotations": {
            "metax-tech.com/gpu-topology": "[]", "example.com/note": "keep"}}})

    def carrying_ours():
        nodes = kube_list(cp, kind="Node")["resources"]
        return sorted({n["metadata"]["name"] for n in nodes for k in list(n["metadata"].get("labels") or {}) +
                       list(n["metadata"].get("annotations") or {}) if k.startswith("metax-tech.com/")})

    expected = sorted(marked + labelled)
    try:
        refused = module(cp, "metax.gpu.node_metadata", {"prefix": "node-role.kubernetes.io/"}, ok=False)
        assert "Kubernetes' own" in refused["msg"] and refused["nodes"] == []
        check = module(cp, "metax.gpu.node_metadata", {"prefix": "metax-tech.com/", "page_size": 40},
                       "--check", "--diff")
        assert check["changed"] is True and check["examined"] == COUNT
        assert [n["name"] for n in check["nodes"]] == expected
        first = next(n for n in check["nodes"] if n["name"] == marked[0])
        assert first["labels"] == sorted(ours) and first["annotations"] == ["metax-tech.com/gpu-topology"]
        assert carrying_ours() == expected                  # check mode wrote nothing
        done = module(cp, "metax.gpu.node_metadata", {"prefix": "metax-tech.com/", "page_size": 40})
        assert done["changed"] is True and [n["name"] for n in done["nodes"]] == expected
        assert carrying_ours() == []
        node = core.read_node(marked[0])["metadata"]
        assert {k: node["labels"][k] for k in foreign} == foreign and node["annotations"]["example.com/note"] == "keep"
        again = module(cp, "metax.gpu.node_metadata", {"prefix": "metax-tech.com/"})
        assert again["changed"] is False and again["nodes"] == [] and again["examined"] == COUNT
    finally:   # the fixture's labels back, for whatever runs after
        for name in labelled:
            core.patch_node(name, {"metadata": {"labels": {N.LABEL_GPU_INSTALLED: "true"}}})


def test_verify_reads_every_node_in_pages_and_names_each_problem(cp, tmp_path):
    """metax.gpu.verify waits on one paged list of every node (not a k8s_info per node): nodes with
    the agents' real output pass; a bare node and a node missing from the cluster are each named."""
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if tests not in sys.path:
        sys.path.insert(0, tests)
    from localcluster import fakenodes          # pylint: disable=import-outside-toplevel
    from scale.agent_output import profiles     # pylint: disable=import-outside-toplevel

    core = typed(cp.kubeconfig)
    good = fakenodes.plan(6, profiles(), prefix="gpu-ok-")        # the three presets, free and in use
    daemonsets = [{"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": name, "namespace": "metax-gpu"},
                   "spec": {"selector": {"matchLabels": {"app": name}}, "template": {
                       "metadata": {"labels": {"app": name}},
                       "spec": {"containers": [{"name": name, "image": "registry.invalid/%s:1" % name}]}}}}
                  for name in ("gpu-device", "gpu-label")]
    assert cp.kubectl("create", "namespace", "metax-gpu").returncode == 0
    res = cp.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": daemonsets}))
    assert res.returncode == 0, res.stderr

    def verify(hosts):
        inventory = tmp_path / "inventory.json"
        inventory.write_text(json.dumps({"all": {"vars": {"ansible_connection": "local"},
                                                 "children": {"gpu_nodes": {"hosts": hosts}}}}))
        return subprocess.run(
            [os.path.join(BIN, "ansible-playbook"), "-i", str(inventory), "metax.gpu.verify",
             "-e", "metax_gpu_kubeconfig=" + cp.kubeconfig, "-e", "verify_page_size=25", "-e", "verify_retries=0"],
            capture_output=True, text=True, env=_env(), timeout=600, check=False)
    try:
        for node in good:
            core.create_node(fakenodes.node_manifest(node))
        passed = verify({n.name: {} for n in good})
        assert passed.returncode == 0, passed.stdout[-5000:] + passed.stderr[-3000:]
        assert "6 GPU node(s) verified" in passed.stdout
        failed = verify(dict({n.name: {} for n in good}, bare={"metax_gpu_node_name": "node-001"}, **{"node-gone": {}}))
        assert failed.returncode != 0
        report = failed.stdout[failed.stdout.index("Report what is wrong on each GPU node"):]
        assert "node node-001: missing labels" in report and "node node-gone: not in the cluster" in report
        assert "gpu-ok-" not in report
    finally:
        for node in good:
            core.delete_node(node.name)


def test_driver_manager_watch_is_resumed_from_its_version_not_listed_again(cp, monkeypatch):
    """driver-manager's driver-config watch (the one every node runs): the first opening lists from
    the cache, every watch the server ends is resumed from the last version seen (bookmarks asked
    for), with no list; an edit still wakes a round. The server here ends a watch after 1 s, not 300."""
    import functools
    import threading
    import time

    from ansible_collections.metax.gpu.plugins.module_utils.agents import driver_manager as dm

    monkeypatch.setattr(dm, "WATCH_SECONDS", 1)
    api = api_client(cp.kubeconfig)
    core = core_v1(api)
    admin = typed(cp.kubeconfig)
    admin.create_namespaced_config_map(NAMESPACE, {"metadata": {"name": "driver-config"}, "data": {"moduleParams": ""}})
    kube = dm.Kube(api, "node-000", NAMESPACE, "driver-config")
    kube.config()                                   # what the node's last round read
    calls = []

    @functools.wraps(core.list_namespaced_config_map)      # the watch reads the return type from its doc
    def lister(*args, **kwargs):
        calls.append(dict(kwargs))
        return core.list_namespaced_config_map(*args, **kwargs)

    wake, stop = threading.Event(), threading.Event()
    thread = threading.Thread(target=dm.watch_objects, daemon=True, args=(
        wake, stop, lister, (NAMESPACE,), {"field_selector": "metadata.name=driver-config"}, dm.ConfigWatched(kube)))
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while sum(1 for c in calls if c.get("watch")) < 4 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not wake.is_set()                    # nothing changed since the round read it
        admin.patch_namespaced_config_map("driver-config", NAMESPACE, {"data": {"moduleParams": "x=1"}})
        assert wake.wait(10), "the edit did not wake a round"
    finally:
        stop.set()
        thread.join(5)
    lists = [c for c in calls if not c.get("watch")]
    watches = [c for c in calls if c.get("watch")]
    assert len(lists) == 1 and lists[0]["resource_version"] == "0"
    assert len(watches) >= 4
    assert all(w["allow_watch_bookmarks"] and w["resource_version"] for w in watches)
    assert int(watches[-1]["resource_version"]) >= int(watches[0]["resource_version"])


def _until(done, limit=30.0):
    import time
    deadline = time.monotonic() + limit
    while not done() and time.monotonic() < deadline:
        time.sleep(0.1)
    return done()


def test_gpu_aware_node_cache_lists_in_pages_and_follows_the_watch(cp):
    """gpu-aware's node cache on kube/watch.py against the real server: the list in pages of 50, then a node
    created and deleted seen through the watch, which the server ends every 2 s and the loop resumes from
    its version (bookmarks asked for) without listing again."""
    import logging

    from ansible_collections.metax.gpu.plugins.module_utils.extender.cache import NodeCache, list_watch
    from ansible_collections.metax.gpu.plugins.module_utils.extender.metrics import ExtenderMetrics
    from ansible_collections.metax.gpu.plugins.module_utils.extender.nodeinfo import StateCache
    from ansible_collections.metax.gpu.plugins.module_utils.kube.watch import RawSource

    core, admin = core_v1(api_client(cp.kubeconfig)), typed(cp.kubeconfig)
    metrics, log = ExtenderMetrics(), logging.getLogger("test")
    cache = NodeCache(StateCache(), metrics, log)
    watch = list_watch("nodes", RawSource(core.list_node, page_size=50), cache, metrics, log, watch_seconds=2).start()
    try:
        assert _until(lambda: len(cache) >= COUNT), len(cache)
        admin.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-watched"}})
        assert _until(lambda: cache.get("node-watched") is not None), "the created node was not seen"
        assert _until(lambda: watch.state.version is not None and watch.lists == 1 and metrics.value("gpu_aware_relists_total", resource="nodes") == 1)
        admin.delete_node("node-watched")
        assert _until(lambda: cache.get("node-watched") is None), "the deleted node is still cached"
        assert watch.lists == 1 and watch.restarts == 0
    finally:
        watch.stop()


def test_driver_manager_slot_watch_keeps_the_view_from_the_servers_json(cp, monkeypatch):
    """driver-manager's watch of the vfnum slot Leases (kube/watch.py over the server's JSON): the view shows a
    slot taken by another node and freed again, from the real server's Lease JSON (its MicroTime stamps)."""
    import threading

    from ansible_collections.metax.gpu.plugins.module_utils.agents import driver_manager as dm
    from ansible_collections.metax.gpu.plugins.module_utils.kube.client import coordination_v1
    from ansible_collections.metax.gpu.plugins.module_utils.kube.slots import Slots

    monkeypatch.setattr(dm, "WATCH_SECONDS", 1)
    api = api_client(cp.kubeconfig)
    kube = dm.Kube(api, "node-000", NAMESPACE, "driver-config")
    mine = kube.vfnum_slots(1)
    other = Slots(coordination_v1(api), NAMESPACE, dm.VFNUM_SLOT_PREFIX, 1, "node-001")
    stop = threading.Event()
    thread = threading.Thread(target=kube.watch_slots, args=(mine, stop), daemon=True)
    thread.start()
    slot = "%s-0" % dm.VFNUM_SLOT_PREFIX
    try:
        assert _until(lambda: mine.view is not None and mine.free() == [slot]), mine.view
        assert other.take() == slot
        assert _until(lambda: mine.free() == []), mine.view          # held by node-001, seen through the watch
        assert mine.view[slot].holder == "node-001" and mine.view[slot].renewed > 0
        other.release()
        assert _until(lambda: mine.free() == [slot]), mine.view
    finally:
        stop.set()
        thread.join(10)


def _daemonset(name, namespace, labels=None):
    match = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
            "spec": {"selector": {"matchLabels": match}, "template": {
                "metadata": {"labels": match},
                "spec": {"containers": [{"name": "c", "image": "registry.invalid/agent:1"}]}}}}


def test_installed_scheme_reads_the_daemonsets_and_the_cluster_operators_in_pages(cp):
    """The scheme_check role's one read (metax.gpu.installed_scheme): DaemonSets of every namespace and the
    ClusterOperator objects, 1 a page; no CRD is no ClusterOperator, not an error."""
    ours = "scheme-check"      # a namespace of this test's own (the scheme does not depend on it)
    before = module(cp, "metax.gpu.installed_scheme", {})["found"]    # the other tests' DaemonSets
    assert before["operator"] == []
    assert cp.kubectl("create", "namespace", ours).returncode == 0
    sets = [_daemonset(N.DAEMONSET_GPU_DEVICE, ours), _daemonset("node-exporter", NAMESPACE),
            _daemonset("kube-proxy", NAMESPACE)]
    res = cp.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": sets}))
    assert res.returncode == 0, res.stderr
    out = module(cp, "metax.gpu.installed_scheme", {"wanted": "operator", "page_size": 1})
    assert out["found"]["operator"] == [] and len(out["found"]["extensions"]) == len(before["extensions"]) + 1
    assert set(out["found"]["extensions"]) == set(before["extensions"]) | {
        "DaemonSet %s/%s" % (ours, N.DAEMONSET_GPU_DEVICE)}
    assert "Refusing to install the GPU Operator scheme" in out["refusal"] and out["changed"] is False
    assert module(cp, "metax.gpu.installed_scheme", {"wanted": "extensions"})["refusal"] == ""

    crd = os.path.join(ROOT, "files", "charts", "metax-operator", "crds", "clusteroperator.yaml")
    assert cp.kubectl("apply", "-f", crd).returncode == 0
    assert cp.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                      "crd/%s.%s" % (N.OPERATOR_PLURAL, N.OPERATOR_GROUP)).returncode == 0
    operators = [{"apiVersion": "%s/%s" % (N.OPERATOR_GROUP, N.OPERATOR_VERSION), "kind": N.OPERATOR_KIND,
                  "metadata": {"name": name}, "spec": {}} for name in ("cluster-operator", "second")]
    res = cp.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": operators}))
    assert res.returncode == 0, res.stderr
    releases = [{"name": "metax-operator-1", "namespace": N.OPERATOR_NAMESPACE, "chart": "metax-operator-0.1.0",
                 "status": "deployed", "app_version": "0.1.0"}]
    out = module(cp, "metax.gpu.installed_scheme", {"wanted": "extensions", "page_size": 1, "releases": releases})
    assert out["found"]["operator"] == [
        "helm release %s/metax-operator-1 (chart metax-operator, deployed)" % N.OPERATOR_NAMESPACE,
        "%s /cluster-operator" % N.OPERATOR_KIND, "%s /second" % N.OPERATOR_KIND]
    assert "Refusing to install the GPU Extensions scheme" in out["refusal"]
    assert "Refusing" in module(cp, "metax.gpu.installed_scheme", {"wanted": "operator"})["refusal"]  # both found
    assert module(cp, "metax.gpu.installed_scheme", {})["refusal"] == ""
