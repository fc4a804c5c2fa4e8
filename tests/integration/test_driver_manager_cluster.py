# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The GPU Operator's driver component on the local three-node cluster (issue 25, manual 3.1, 3.2.3).

One helm install of files/charts/metax-operator with ``driver.deploy: true``
and the driver payload image built by files/images/driver-payload/build.sh,
shared by the module's tests, in order. The nodes are a mixed fleet: vm keeps
the administrator's driver (deb tools, Debian), vm-2 (deb tools, Ubuntu) and
vm-3 (rpm tools, openEuler) start without any driver:

- IfNotPresent installs the payload on vm-2 and vm-3 with each node's own
  package tool from the one payload (gpu.driver.mode=cloud, driver.ready set by
  the controller, allocatable = devices) and leaves vm's driver alone (native);
- deployPolicy Never rolls driver-manager and touches no driver;
- a driver-config edit takes vm-3 (2xC550-sriov) from vfnum 0 to 4: capacity
  8, only vm-3's gpu-device pod recreated, timed;
- an invalid entry (vfnum 3) and an entry for a node that does not exist give
  an Event and a Degraded condition naming them, and change nothing;
- a pod holding one of vm-3's VFs, guarded by a PodDisruptionBudget: the
  change is refused and named while vfnumPolicy.evictInUse is off; on, the
  budget's 429 keeps it pending and changes nothing; the budget removed, the
  pod is evicted and the change applied;
- the rolling upgrade (deployPolicy Always): a payload version bump rolls all
  three nodes within maxUnavailable, vm-2's administrator's cordon kept, each
  node timed from cordon to finish; then a payload whose deb driver never
  comes up: vm fails validation, is rolled back, left cordoned in ``failed``,
  and the rollout pauses (vm-2 and vm-3 untouched);
- MetaX's own payload as it is: payload 2.29.0.13 whose prebuilt tree (no
  packages) installs kernel driver 2.17.13 finishes a rolling upgrade on all
  three nodes, each on target by its labels 2/17/13, and no node stays
  cordoned;
- the real CR's default (``upgradePolicy`` unset: ``enableRollout: false``):
  the next payload is installed in place, never a cordon or an eviction; vm-3,
  whose GPU a pod holds, says ``pending: in use`` and takes it once the pod
  is gone.

The nodes' roots are put back as found (driver, tools, VFs), the operator
uninstalled, and a GPU Extensions release found at the start installed again.
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
    CHART, NS, UNINSTALL_SCRIPT, cr, get_json, helm, no_extensions, nodes, patch_cr, strip_ours)

from ansible_collections.metax.gpu.plugins.module_utils import names as N
from ansible_collections.metax.gpu.plugins.module_utils.agents import driver_manager
from ansible_collections.metax.gpu.plugins.module_utils.driver import backend, node_upgrade, policy
from ansible_collections.metax.gpu.plugins.module_utils.host import HostRoot
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator, pkgtool

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PAYLOAD_BUILD = os.path.join(ROOT, "files", "images", "driver-payload", "build.sh")
OUTPUT = os.path.join(ROOT, "tests", "output")
SIM_PARENT = "/var/lib/metax-sim"
PAYLOAD_VERSION = "2.15.0"
# node -> (package tool, /etc/os-release, starts without a driver)
FLEET = {"vm": ("deb", "ID=debian\nVERSION_ID=\"12\"\n", False),
         "vm-2": ("deb", "ID=ubuntu\nID_LIKE=debian\nVERSION_ID=\"22.04\"\n", True),
         "vm-3": ("rpm", "NAME=\"openEuler\"\nID=\"openEuler\"\nVERSION_ID=\"22.03\"\n", True)}
SRIOV_NODE = "vm-3"
pytestmark = pytest.mark.cluster


def host(name):
    return HostRoot(os.path.join(SIM_PARENT, name))


def loaded(name):
    return host(name).read_attribute("sys/module/metax/version", default="") or None


def build_payload(cluster, version, broken="", driver="", layouts="deb rpm run"):
    """files/images/driver-payload/build.sh VERSION, pushed: the CR's driver.payload for it. ``driver``: the
    kernel driver it declares (not VERSION); ``layouts``: "prebuilt" for MetaX's own image layout."""
    env = dict(cluster.env, METAX_PAYLOAD_BROKEN=broken, METAX_PAYLOAD_DRIVER_VERSION=driver,
               METAX_PAYLOAD_LAYOUTS=layouts)
    res = subprocess.run([PAYLOAD_BUILD, version], env=env, capture_output=True, text=True,
                         timeout=900, stdin=subprocess.DEVNULL, check=False)
    assert res.returncode == 0, "payload build failed:\n%s%s" % (res.stdout, res.stderr[-3000:])
    ref = res.stdout.strip().splitlines()[-1].split("=", 1)[1]
    registry_project, rest = ref.rsplit("/", 1)
    return {"registry": registry_project, "name": rest.split(":")[0], "version": version}


@pytest.fixture(scope="module")
def payload(cluster):
    return build_payload(cluster, PAYLOAD_VERSION)


@pytest.fixture(scope="module")
def fleet(cluster, no_extensions):
    """Package tools, os-release and (on vm-2, vm-3) no driver; everything put back afterwards."""
    names = sorted(n["name"] for n in cluster.nodes)
    if names != sorted(FLEET):
        pytest.fail("needs the three-node cluster %s (have %s)" % (sorted(FLEET), names))
    original = {}
    for name, (kind, release, bare) in FLEET.items():
        root = host(name)
        original[name] = generator.load_state(root)["driver_version"]
        pkgtool.install_tools(root.path, kind)
        os.makedirs(root.join("etc"), exist_ok=True)
        with open(root.join("etc/os-release"), "w") as handle:
            handle.write(release)
        if bare:
            generator.unload_driver(root)
            tool, args = ("dpkg", ["--purge"]) if kind == "deb" else ("rpm", ["-e"])
            assert pkgtool.main(tool, args + ["metax-driver"], root.path) == 0
    yield original
    for name in FLEET:
        # a rollout cut short leaves its cordons (the operator's uninstall strips labels, not cordons)
        cluster.kubectl("uncordon", name)
        root = host(name)
        for gpu in generator.load_state(root)["gpus"]:
            if gpu.get("numvfs"):
                generator.set_numvfs(root, gpu["sysfs"], 0)
        if loaded(name) != original[name]:
            generator.unload_driver(root)
            generator.set_driver_version(root, original[name])
            generator.load_driver(root)
        pkgtool.remove_tools(root.path)
        for rel in ("etc/os-release", policy.OWNER_RECORD, backend.RUN_RECORD, backend.PREBUILT_RECORD,
                    backend.DRIVER_RECORD, node_upgrade.UPGRADE_RECORD):
            if os.path.lexists(root.join(rel)):
                os.unlink(root.join(rel))
        shutil.rmtree(root.join("var/cache/metax-driver"), ignore_errors=True)
        shutil.rmtree(root.join("sys/module/metax/parameters"), ignore_errors=True)
        # what a prebuilt payload's install left (its modules; mx-smi was the node's own and stayed)
        for release in sorted({pkgtool.SIM_KERNEL_RELEASE, os.uname().release}):
            shutil.rmtree(root.join("lib/modules/%s/extra/metax" % release), ignore_errors=True)
        for parent in [r for release in sorted({pkgtool.SIM_KERNEL_RELEASE, os.uname().release})
                       for r in ("lib/modules/%s/extra" % release, "lib/modules/%s" % release)] + [
                "lib/modules", "lib", "etc", "var/lib/metax-gpu", "var/lib", "var/cache", "var"]:
            if os.path.isdir(root.join(parent)) and not os.listdir(root.join(parent)):
                os.rmdir(root.join(parent))


@pytest.fixture(scope="module")
def installed(cluster, images, payload, fleet):
    strip_ours(cluster)
    start = time.monotonic()
    # a failed install (helm timed out) is cleaned up too: the next module finds no release or namespace
    try:
        res = helm(cluster, "install", CHART, "--create-namespace", "-n", NS, "--generate-name", "--wait",
                   "--set", "registry=" + images["registry"], "--set-string", "imageTag=" + images["tag"],
                   "--set", "hostRoot.path=" + SIM_PARENT, "--set", "hostRoot.subPathExpr=$(NODE_NAME)",
                   "--set", "log.dir=", "--set", "gpuDevice.healthyInterval=2", "--set", "nodeAgentPolicy.enabled=true",
                   "--set", "driver.deploy=true", "--set", "driver.deployPolicy=IfNotPresent",
                   "--set", "driver.payload.registry=" + payload["registry"],
                   "--set", "driver.payload.name=" + payload["name"],
                   "--set-string", "driver.payload.version=" + payload["version"],
                   # the driver component alone (MACA and container-runtime are on by default since issue 38)
                   "--set", "maca.deploy=false", "--set", "runtime.deploy=false")
        assert res.returncode == 0, "helm install failed:\n%s\n%s" % (res.stdout, res.stderr)
        yield {"start": start}
    finally:
        subprocess.run(["bash", "-c", UNINSTALL_SCRIPT], env=cluster.env, capture_output=True, timeout=600,
                       check=False)
        cluster.kubectl("delete", "namespace", NS, "--wait=true", "--timeout=120s")


def diagnose(cluster):
    """What the cluster shows when a wait fails: pods, driver-manager's logs, our node keys, the CR status."""
    out = [cluster.kubectl("get", "pods", "-n", NS, "-o", "wide").stdout]
    pods = json.loads(cluster.kubectl("get", "pods", "-n", NS, "-l", "app.kubernetes.io/name=metax-driver",
                                      "-o", "json").stdout or '{"items": []}')["items"]
    for pod in pods:
        out.append("--- %s on %s: %s" % (pod["metadata"]["name"], pod["spec"].get("nodeName"),
                                         json.dumps((pod.get("status") or {}).get("containerStatuses"))[:1500]))
        out.append(cluster.kubectl("logs", "-n", NS, pod["metadata"]["name"], "-c", "metax-driver",
                                   "--tail=30").stdout[-4000:])
    for name, node in nodes(cluster).items():
        meta = node["metadata"]
        out.append("%s: %s alloc=%s" % (name, {k: v for part in ("labels", "annotations")
                                               for k, v in (meta.get(part) or {}).items() if k.startswith(N.PREFIX)},
                                        node["status"].get("allocatable", {}).get(N.RESOURCE_NAME)))
    out.append(json.dumps((cr(cluster) or {}).get("status"))[:3000])
    return "\n".join(out)


def wait(cluster, predicate, timeout, what, interval=1.0):
    try:
        wait_until(predicate, timeout, what, interval)
    except BaseException:
        print(diagnose(cluster))
        raise


def labels(cluster):
    return {name: node["metadata"].get("labels") or {} for name, node in nodes(cluster).items()}


def allocatable(cluster):
    return {name: int(node["status"].get("allocatable", {}).get(N.RESOURCE_NAME, "0"))
            for name, node in nodes(cluster).items()}


def node_allocatable(cluster, name):
    """One node's allocatable GPUs, read alone: the timed wait polls every 0.2 s, and a list of every
    node takes seconds on a shared cluster that also carries another session's fake nodes."""
    node = cluster.read_node(name) or {}
    return int((node.get("status") or {}).get("allocatable", {}).get(N.RESOURCE_NAME, "0"))


def devices(name):
    state = generator.load_state(host(name))
    return sum(max(1, g.get("numvfs") or 0) for g in state["gpus"])


def gpu_device_pods(cluster):
    out = json.loads(cluster.kubectl("get", "pods", "-n", NS, "-l", "app.kubernetes.io/name=" + N.DAEMONSET_GPU_DEVICE,
                                     "-o", "json", check=True).stdout)["items"]
    # a pod not bound yet has no nodeName (another session's short-lived nodes on the shared cluster)
    return {p["spec"]["nodeName"]: p["metadata"]["uid"] for p in out
            if not p["metadata"].get("deletionTimestamp") and p["spec"].get("nodeName") in FLEET}


def condition(body, component, kind):
    entry = next(c for c in body["status"]["components"] if c["name"] == component)
    return next(c for c in entry["conditions"] if c["type"] == kind)


def condition_status(cluster, component, kind):
    """The CR's condition status now, None while the status has no such condition."""
    try:
        return condition(cr(cluster), component, kind)["status"]
    except (KeyError, TypeError, StopIteration):
        return None


def set_node_vfnums(cluster, text):
    patch = {"data": {"node-vfnums": text}}
    cluster.kubectl("patch", "configmap", N.DRIVER_CONFIGMAP, "-n", NS, "--type=merge", "-p", json.dumps(patch),
                    check=True)


def driver_rolled_out(cluster):
    ds = get_json(cluster, "daemonset", "metax-driver", "-n", NS) or {}
    st = ds.get("status") or {}
    return (st.get("observedGeneration") == ds.get("metadata", {}).get("generation")
            and st.get("updatedNumberScheduled") == st.get("numberReady") == st.get("desiredNumberScheduled") == 3)


def test_if_not_present_installs_the_payload_where_no_driver_is_and_leaves_the_admins(cluster, installed, fleet):
    def done():
        lab, alloc = labels(cluster), allocatable(cluster)
        return all(lab[n].get(N.LABEL_DRIVER_READY) == "true" and alloc[n] == devices(n) > 0 for n in FLEET)
    wait(cluster, done, 150, "driver.ready and allocatable = devices on every node")
    seconds = time.monotonic() - installed["start"]
    lab = labels(cluster)
    assert {n: lab[n].get(N.LABEL_DRIVER_MODE) for n in FLEET} == {"vm": "native", "vm-2": "cloud", "vm-3": "cloud"}
    assert loaded("vm") == fleet["vm"]                      # the administrator's driver, untouched
    assert loaded("vm-2") == loaded("vm-3") == PAYLOAD_VERSION
    # one payload, each node's own package tool: a mixed fleet
    kinds = {n: json.load(open(host(n).join(pkgtool.PKGDB_FILE)))["metax-driver"]["kind"] for n in ("vm-2", "vm-3")}
    assert kinds == {"vm-2": "deb", "vm-3": "rpm"}
    # driver.ready has one writer: the controller; gpu-label is rendered without it
    args = get_json(cluster, "daemonset", N.DAEMONSET_GPU_LABEL, "-n", NS)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--driver-labels=false" in args
    # the controller writes the labels and the CR status in one round, the status after the labels
    wait(cluster, lambda: condition_status(cluster, "metax-driver", "Ready") == "True", 30,
         "the CR's metax-driver Ready condition True")
    print("\nIfNotPresent install: every node driver.ready and allocatable %.1f s after helm install started" % seconds)
    os.makedirs(OUTPUT, exist_ok=True)
    with open(os.path.join(OUTPUT, "driver-manager.json"), "w") as fh:
        json.dump({"install_seconds": round(seconds, 1)}, fh)


def test_deploy_policy_never_touches_no_driver(cluster, installed, fleet):
    before = {n: loaded(n) for n in FLEET}
    generation = get_json(cluster, "daemonset", "metax-driver", "-n", NS)["metadata"]["generation"]
    assert patch_cr(cluster, {"driver": {"deployPolicy": "Never"}}).returncode == 0
    wait(cluster, lambda: get_json(cluster, "daemonset", "metax-driver", "-n", NS)["metadata"]["generation"] >
         generation and driver_rolled_out(cluster), 120, "metax-driver rolled out with Never")
    args = get_json(cluster, "daemonset", "metax-driver", "-n", NS)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--deploy-policy=Never" in args
    assert {n: loaded(n) for n in FLEET} == before
    lab = labels(cluster)
    assert {n: lab[n].get(N.LABEL_DRIVER_MODE) for n in FLEET} == {"vm": "native", "vm-2": "cloud", "vm-3": "cloud"}
    # the controller puts driver.ready back on its next status round (5 s) once the new pods are Ready
    wait(cluster, lambda: all(labels(cluster)[n].get(N.LABEL_DRIVER_READY) == "true" for n in FLEET), 30,
         "driver.ready on every node after the roll")
    assert {n: loaded(n) for n in FLEET} == before


def pod_on(cluster, app, node):
    """The (not terminating) pod of DaemonSet ``app`` on ``node``, as JSON, or None."""
    out = json.loads(cluster.kubectl("get", "pods", "-n", NS, "-l", "app.kubernetes.io/name=" + app,
                                     "--field-selector", "spec.nodeName=" + node, "-o", "json").stdout
                     or '{"items": []}')["items"]
    return next((p for p in out if not p["metadata"].get("deletionTimestamp")), None)


def stamp(text):
    """RFC 3339 (kubectl logs --timestamps, the API's times) -> seconds since the epoch."""
    import datetime
    head, _dot, frac = text.rstrip("Z").partition(".")
    when = datetime.datetime.strptime(head, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=datetime.timezone.utc)
    return when.timestamp() + (float("0." + frac[:6]) if frac else 0.0)


def vfnum_timeline(cluster, node, edit_wall, old_pod_uid):
    """The steps of a vfnum change from the ConfigMap edit (seconds after it), from driver-manager's and
    the new gpu-device's own logs and the API's pod times: where the time goes (docs/operator.md)."""
    steps = []
    driver = pod_on(cluster, "metax-driver", node)
    device = pod_on(cluster, N.DAEMONSET_GPU_DEVICE, node)
    for pod, container, words in ((driver, "metax-driver", ("",)),
                                  (device, N.DAEMONSET_GPU_DEVICE, ("Allocate mode", "gpu-device starting", "found",
                                                                    "registered", "ListAndWatch"))):
        if pod is None:
            continue
        logs = cluster.kubectl("logs", "-n", NS, pod["metadata"]["name"], "-c", container, "--timestamps",
                               "--since-time=" + time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(edit_wall - 60)))
        for line in logs.stdout.splitlines():
            when, _space, text = line.partition(" ")
            if any(w in text for w in words):
                steps.append((round(stamp(when) - edit_wall, 2), "%s: %s" % (container, text[:200])))
    if device is not None and device["metadata"]["uid"] != old_pod_uid:
        steps.append((round(stamp(device["metadata"]["creationTimestamp"]) - edit_wall, 2),
                      "gpu-device: new pod created (API, whole seconds)"))
        for cond in (device.get("status") or {}).get("conditions") or []:
            steps.append((round(stamp(cond["lastTransitionTime"]) - edit_wall, 2),
                          "gpu-device: pod %s=%s (API, whole seconds)" % (cond["type"], cond["status"])))
        for status in (device.get("status") or {}).get("containerStatuses") or []:
            started = ((status.get("state") or {}).get("running") or {}).get("startedAt")
            if started:
                steps.append((round(stamp(started) - edit_wall, 2),
                              "gpu-device: container %s started (API, whole seconds)" % status["name"]))
    return sorted(steps)


def test_driver_config_vfnum_0_to_4_reaches_capacity_8_recreating_only_that_nodes_gpu_device(cluster, installed):
    wait(cluster, lambda: len(gpu_device_pods(cluster)) == 3 and allocatable(cluster)[SRIOV_NODE] == 2, 60,
         "gpu-device on every node, %s at 2 GPUs" % SRIOV_NODE)
    pods_before = gpu_device_pods(cluster)
    generations = {ds["metadata"]["name"]: ds["metadata"]["generation"] for ds in json.loads(
        cluster.kubectl("get", "daemonsets", "-n", NS, "-o", "json", check=True).stdout)["items"]}
    start, edit_wall = time.monotonic(), time.time()
    set_node_vfnums(cluster, "nodes:\n  %s:\n    vfnum: 4\n" % SRIOV_NODE)
    wait(cluster, lambda: node_allocatable(cluster, SRIOV_NODE) == 8, 60, "%s allocatable 8" % SRIOV_NODE,
         interval=0.2)
    seconds = time.monotonic() - start
    print("\nvfnum 0 -> 4 on %s: capacity 8 after %.1f s (target 15 s)" % (SRIOV_NODE, seconds))
    # The old pod may still be terminating when capacity reaches 8; the DaemonSet creates the new one only
    # after it is gone, so wait for the replacement before reading pods (the assertions below stay as they were).
    wait(cluster, lambda: gpu_device_pods(cluster).get(SRIOV_NODE) not in (None, pods_before[SRIOV_NODE]), 60,
         "a new gpu-device pod on %s" % SRIOV_NODE)
    timeline = vfnum_timeline(cluster, SRIOV_NODE, edit_wall, pods_before[SRIOV_NODE])
    print("\n".join("  %+7.2f s  %s" % step for step in timeline))
    assert labels(cluster)[SRIOV_NODE].get(N.LABEL_VFNUM_STATE) == "success"
    pods_after = gpu_device_pods(cluster)
    assert pods_after[SRIOV_NODE] != pods_before[SRIOV_NODE]
    assert {n: u for n, u in pods_after.items() if n != SRIOV_NODE} == \
        {n: u for n, u in pods_before.items() if n != SRIOV_NODE}
    assert {ds["metadata"]["name"]: ds["metadata"]["generation"] for ds in json.loads(
        cluster.kubectl("get", "daemonsets", "-n", NS, "-o", "json", check=True).stdout)["items"]} == generations
    assert allocatable(cluster)["vm"] == devices("vm") and allocatable(cluster)["vm-2"] == devices("vm-2")
    path = os.path.join(OUTPUT, "driver-manager.json")
    record = json.load(open(path)) if os.path.exists(path) else {}
    record["vfnum_0_to_4_seconds"] = round(seconds, 1)
    record["vfnum_0_to_4_timeline"] = timeline
    with open(path, "w") as fh:
        json.dump(record, fh)
    # The target, held since gpu-device registers before its API side and the images carry
    # bytecode: 3.9 s with a core kept busy (the new pod's process 0.73 s to its start line, 2.4-4.5 s
    # before); 12.6 s and 12.0 s were the worst loaded runs before (docs/operator.md "driver-config").
    # On a miss the message says where the time went.
    assert seconds <= 15, "vfnum 0 -> 4 took %.1f s, over the 15 s target; from the edit:\n%s" % (
        seconds, "\n".join("  %+7.2f s  %s" % step for step in timeline))


def test_an_invalid_entry_gives_an_event_and_a_degraded_condition_and_changes_nothing(cluster, installed):
    set_node_vfnums(cluster, "nodes:\n  %s:\n    vfnum: 3\n  ghost-node:\n    vfnum: 2\n" % SRIOV_NODE)

    def degraded():
        body = cr(cluster) or {}
        cond = condition(body, "metax-driver", "Degraded") if body.get("status") else {}
        return cond.get("status") == "True" and SRIOV_NODE in cond.get("message", "") \
            and "ghost-node" in cond.get("message", "") and cond
    wait(cluster, degraded, 30, "the Degraded condition naming %s and ghost-node" % SRIOV_NODE)
    message = degraded()["message"]
    assert "vfnum 3" in message and "does not exist" in message
    events = json.loads(cluster.kubectl("get", "events", "-n", NS, "-o", "json", check=True).stdout)["items"]
    assert any(e["reason"] == "VfnumRejected" and SRIOV_NODE in e["message"]
               and e["involvedObject"]["kind"] == N.OPERATOR_KIND for e in events)
    assert allocatable(cluster)[SRIOV_NODE] == 8
    assert [g["numvfs"] for g in generator.load_state(host(SRIOV_NODE))["gpus"]] == [4, 4]
    # back to 0 through driver-config: the condition clears
    set_node_vfnums(cluster, "nodes:\n  %s:\n    vfnum: 0\n" % SRIOV_NODE)
    wait(cluster, lambda: allocatable(cluster)[SRIOV_NODE] == 2, 60, "%s back at 2" % SRIOV_NODE)
    wait(cluster, lambda: condition(cr(cluster), "metax-driver", "Degraded")["status"] == "False", 30,
         "Degraded cleared")


HOLDER = "vfnum-holder"


def holder_objects(cluster):
    """A bare pod (nothing recreates it once evicted) holding one of vm-3's GPUs, and a budget keeping it."""
    image = cluster.base_image.replace("localhost/", cluster.registry + "/")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": HOLDER, "namespace": "default",
                                                           "labels": {"app": HOLDER}},
           "spec": {"nodeSelector": {"kubernetes.io/hostname": SRIOV_NODE}, "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "c", "image": image, "command": ["sleep", "3600"],
                                    "resources": {"limits": {N.RESOURCE_NAME: "1"}}}]}}
    pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
           "metadata": {"name": HOLDER + "-pdb", "namespace": "default"},
           "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": HOLDER}}}}
    return pod, pdb


def holder_phase(cluster):
    pod = get_json(cluster, "pod", HOLDER, "-n", "default")
    return None if pod is None or pod["metadata"].get("deletionTimestamp") else pod["status"].get("phase")


def driver_degraded(cluster, *words):
    body = cr(cluster) or {}
    cond = condition(body, "metax-driver", "Degraded") if body.get("status") else {}
    return cond.get("status") == "True" and all(w in cond.get("message", "") for w in words) and cond


def test_a_vfnum_change_under_a_pod_is_refused_or_with_evict_in_use_waits_for_its_budget_then_evicts(
        cluster, installed):
    pod, pdb = holder_objects(cluster)
    who = "default/" + HOLDER
    # run alone, the install has just begun: vm-3's driver first
    wait(cluster, lambda: labels(cluster)[SRIOV_NODE].get(N.LABEL_DRIVER_READY) == "true" and
         allocatable(cluster)[SRIOV_NODE] == 2, 150, "%s driver.ready at 2 GPUs" % SRIOV_NODE)
    start = time.monotonic()
    try:
        set_node_vfnums(cluster, "nodes:\n  %s:\n    vfnum: 4\n" % SRIOV_NODE)
        wait(cluster, lambda: allocatable(cluster)[SRIOV_NODE] == 8, 60, "%s allocatable 8" % SRIOV_NODE)
        for obj in (pdb, pod):
            cluster.kubectl("apply", "-f", "-", input=json.dumps(obj), check=True)
        wait(cluster, lambda: holder_phase(cluster) == "Running", 60, "the holder pod running on %s" % SRIOV_NODE)
        assert get_json(cluster, "pod", HOLDER, "-n", "default")["spec"]["nodeName"] == SRIOV_NODE

        # off (the default): refused, the pod named, nothing changed
        set_node_vfnums(cluster, "nodes:\n  %s:\n    vfnum: 2\n" % SRIOV_NODE)
        wait(cluster, lambda: driver_degraded(cluster, SRIOV_NODE, "pod " + who, "evictInUse"), 30,
             "Degraded naming the holder pod")
        assert labels(cluster)[SRIOV_NODE].get(N.LABEL_VFNUM_STATE) == "success"
        assert [g["numvfs"] for g in generator.load_state(host(SRIOV_NODE))["gpus"]] == [4, 4]
        refused_at = time.monotonic() - start

        # on, with the budget in place: the eviction is refused (429), pending, nothing changed
        generation = get_json(cluster, "daemonset", "metax-driver", "-n", NS)["metadata"]["generation"]
        assert patch_cr(cluster, {"driver": {"vfnumPolicy": {"evictInUse": True}}}).returncode == 0
        wait(cluster, lambda: get_json(cluster, "daemonset", "metax-driver", "-n", NS)["metadata"]["generation"] >
             generation and driver_rolled_out(cluster), 120, "metax-driver rolled out with evictInUse")
        rolled_at = time.monotonic() - start
        wait(cluster, lambda: driver_degraded(cluster, SRIOV_NODE, "eviction of " + who + " refused",
                                              HOLDER + "-pdb"), 45, "Degraded naming the budget's refusal")
        assert labels(cluster)[SRIOV_NODE].get(N.LABEL_VFNUM_STATE) == "pending"
        assert [g["numvfs"] for g in generator.load_state(host(SRIOV_NODE))["gpus"]] == [4, 4]
        assert holder_phase(cluster) == "Running" and allocatable(cluster)[SRIOV_NODE] == 8
        events = json.loads(cluster.kubectl("get", "events", "-n", NS, "-o", "json", check=True).stdout)["items"]
        assert any(e["reason"] == "VfnumEvictionRefused" and who in e["message"] for e in events)
        pending_at = time.monotonic() - start

        # the budget removed: evicted at the next retry (the round's backoff), then applied
        cluster.kubectl("delete", "pdb", HOLDER + "-pdb", "-n", "default", check=True)
        removed = time.monotonic()
        wait(cluster, lambda: allocatable(cluster)[SRIOV_NODE] == 4 and holder_phase(cluster) is None, 60,
             "the holder evicted and %s at vfnum 2 (capacity 4)" % SRIOV_NODE, interval=0.5)
        applied_after = time.monotonic() - removed
        assert [g["numvfs"] for g in generator.load_state(host(SRIOV_NODE))["gpus"]] == [2, 2]
        assert labels(cluster)[SRIOV_NODE].get(N.LABEL_VFNUM_STATE) == "success"
        wait(cluster, lambda: condition(cr(cluster), "metax-driver", "Degraded")["status"] == "False", 30,
             "Degraded cleared")
        slots = json.loads(cluster.kubectl("get", "leases", "-n", NS, "-o", "json", check=True).stdout)["items"]
        assert [s["metadata"]["name"] for s in slots if s["metadata"]["name"].startswith(
            driver_manager.VFNUM_SLOT_PREFIX)] == []                       # the slot given back
        print("\nvfnum under a pod: refused %.1f s, evictInUse rolled %.1f s, pending %.1f s into the test; "
              "applied %.1f s after the budget was removed" % (refused_at, rolled_at, pending_at, applied_after))
        path = os.path.join(OUTPUT, "driver-manager.json")
        record = json.load(open(path)) if os.path.exists(path) else {}
        record["vfnum_evict"] = {"refused_s": round(refused_at, 1), "evict_in_use_rolled_s": round(rolled_at, 1),
                                 "pending_s": round(pending_at, 1), "applied_after_pdb_removed_s": round(applied_after, 1)}
        os.makedirs(OUTPUT, exist_ok=True)
        with open(path, "w") as fh:
            json.dump(record, fh)
    finally:
        cluster.kubectl("delete", "pod", HOLDER, "-n", "default", "--ignore-not-found", "--grace-period=0",
                        "--force")
        cluster.kubectl("delete", "pdb", HOLDER + "-pdb", "-n", "default", "--ignore-not-found")
    set_node_vfnums(cluster, "nodes:\n  %s:\n    vfnum: 0\n" % SRIOV_NODE)
    wait(cluster, lambda: allocatable(cluster)[SRIOV_NODE] == 2, 60, "%s back at 2" % SRIOV_NODE)
    print("vfnum under a pod: %.1f s in all" % (time.monotonic() - start))


UPGRADE_VERSION = "2.16.0"      # rolled to every node
BROKEN_VERSION = "2.16.1"       # its deb driver loads but never comes up: vm (Debian, first by name) fails
ADMIN_CORDONED = "vm-2"
UPGRADE_KEYS = (N.LABEL_DRIVER_UPGRADE_STATE, N.ANNOTATION_DRIVER_UPGRADE_MESSAGE, N.ANNOTATION_PRE_CORDONED,
                N.ANNOTATION_DRIVER_UPGRADE_TARGET, N.ANNOTATION_DRIVER_UPGRADE_IN_PLACE)


def upgrade_marks(node):
    meta = node["metadata"]
    return {k: v for part in ("labels", "annotations") for k, v in (meta.get(part) or {}).items() if k in UPGRADE_KEYS}


def upgrade_state(node):
    return (node["metadata"].get("labels") or {}).get(N.LABEL_DRIVER_UPGRADE_STATE)


def cordoned(node):
    return bool(node["spec"].get("unschedulable"))


def driver_upgrade_status(cluster):
    return ((cr(cluster) or {}).get("status") or {}).get("driverUpgrade") or {}


def follow_rollout(cluster, done, timeout, what):
    """Poll the nodes every 0.5 s until ``done(nodes)``: per node when its upgrade state appeared and
    when it went, the most nodes cordoned and in the procedure at once."""
    start = time.monotonic()
    track = {"started": {}, "finished": {}, "max_cordoned": 0, "max_in_flight": 0}
    while True:
        now = time.monotonic() - start
        current = {n: node for n, node in nodes(cluster).items() if n in FLEET}
        track["max_cordoned"] = max(track["max_cordoned"], sum(cordoned(node) for node in current.values()))
        track["max_in_flight"] = max(track["max_in_flight"], sum(
            upgrade_state(node) in N.DRIVER_UPGRADE_IN_FLIGHT_STATES for node in current.values()))
        for name, node in current.items():
            if upgrade_state(node) and name not in track["started"]:
                track["started"][name] = now
            elif not upgrade_state(node) and name in track["started"] and name not in track["finished"]:
                track["finished"][name] = now
        if done(current):
            return track
        if now > timeout:
            print(diagnose(cluster))
            pytest.fail("timed out after %.0f s waiting for %s; %s" % (timeout, what, track))
        time.sleep(0.5)


def upgrade_events(cluster, reason):
    items = json.loads(cluster.kubectl("get", "events", "-n", NS, "-o", "json", check=True).stdout)["items"]
    return [e["message"] for e in items if e["reason"] == reason]


def test_a_payload_version_bump_rolls_every_node_within_max_unavailable_keeping_the_admins_cordon(
        cluster, installed, fleet):
    build_payload(cluster, UPGRADE_VERSION)
    # every node on a verified driver whose version gpu-label published: a rollout, not an install
    wait(cluster, lambda: all(lab.get(N.LABEL_DRIVER_READY) == "true" and lab.get(N.LABEL_DRIVER_MAJOR)
                              for lab in (labels(cluster)[n] for n in FLEET)), 150, "driver.ready everywhere")
    wait(cluster, lambda: allocatable(cluster) == {n: devices(n) for n in FLEET}, 60, "allocatable = devices")
    cluster.kubectl("cordon", ADMIN_CORDONED, check=True)
    # the rolling upgrade asked for (the default, enableRollout false, upgrades in place), no canary step
    policy_ = {"enableRollout": True, "maxParallel": 2, "maxUnavailable": 2, "maxFailureThreshold": 1,
               "fallback": "pause", "upgradeSteps": []}
    try:
        # Always: the administrator's driver on vm is rolled too (IfNotPresent would roll only vm-2, vm-3)
        assert patch_cr(cluster, {"driver": {"deployPolicy": "Always", "payload": {"version": UPGRADE_VERSION},
                                             "upgradePolicy": policy_}}).returncode == 0

        def rolled(current):
            return all(loaded(n) == UPGRADE_VERSION and not upgrade_marks(current[n]) for n in FLEET)
        track = follow_rollout(cluster, rolled, 180, "every node at %s, nothing left behind" % UPGRADE_VERSION)
        wait(cluster, lambda: driver_upgrade_status(cluster).get("message") == "every node is at the target",
             15, "status.driverUpgrade: every node at the target")
        current = nodes(cluster)
        # maxUnavailable counts the administrator's cordon: vm-2 plus at most one node of ours at a time
        assert track["max_cordoned"] <= 2 and track["max_in_flight"] <= 2, track
        assert sorted(track["started"]) == sorted(FLEET) and sorted(track["finished"]) == sorted(FLEET), track
        assert cordoned(current[ADMIN_CORDONED])                       # the administrator's cordon stays
        assert not cordoned(current["vm"]) and not cordoned(current["vm-3"])
        lab = labels(cluster)
        for name in FLEET:
            assert [lab[name][N.LABEL_DRIVER_MAJOR], lab[name][N.LABEL_DRIVER_MINOR],
                    lab[name][N.LABEL_DRIVER_PATCH]] == UPGRADE_VERSION.split("."), name
            assert lab[name].get(N.LABEL_DRIVER_MODE) == "cloud"
        status = driver_upgrade_status(cluster)
        assert status["targetVersion"] == UPGRADE_VERSION and status["upgraded"] == 3 and status["failed"] == []
        wait(cluster, lambda: allocatable(cluster) == {n: devices(n) for n in FLEET}, 60,
             "allocatable = devices after the upgrade")
        # per node: cordon (the controller's start) to the finish, minus driver-manager's package install
        installs = {}
        for message in upgrade_events(cluster, "DriverUpgraded"):
            node, _sep, rest = message.partition(": ")
            if "-> %s," % UPGRADE_VERSION in rest:
                installs[node] = float(rest.split("installed in ", 1)[1].split(" s", 1)[0])
        assert sorted(installs) == sorted(FLEET), installs
        per_node = {n: round(track["finished"][n] - track["started"][n], 1) for n in FLEET}
        overhead = {n: round(per_node[n] - installs[n], 1) for n in FLEET}
        whole = max(track["finished"].values()) - min(track["started"].values())
        print("\nrolling upgrade to %s: %s per node from cordon to finish, package install %s, overhead %s; "
              "all three in %.1f s" % (UPGRADE_VERSION, per_node, installs, overhead, whole))
        path = os.path.join(OUTPUT, "driver-manager.json")
        record = json.load(open(path)) if os.path.exists(path) else {}
        record["rollout"] = {"node_seconds": per_node, "install_seconds": installs, "overhead_seconds": overhead,
                             "all_seconds": round(whole, 1), "max_cordoned": track["max_cordoned"]}
        os.makedirs(OUTPUT, exist_ok=True)
        with open(path, "w") as fh:
            json.dump(record, fh)
    finally:
        cluster.kubectl("uncordon", ADMIN_CORDONED)


def test_a_node_whose_new_driver_fails_validation_is_rolled_back_left_cordoned_failed_and_the_rollout_pauses(
        cluster, installed, fleet):
    build_payload(cluster, BROKEN_VERSION, broken="deb")
    before = {n: loaded(n) for n in FLEET}
    assert before == {n: UPGRADE_VERSION for n in FLEET}, before
    # budget for two, one at a time: only the pause keeps vm-2 from starting once vm has failed
    policy_ = {"enableRollout": True, "maxParallel": 1, "maxUnavailable": 2, "maxFailureThreshold": 1,
               "fallback": "pause", "upgradeSteps": [], "pause": True}
    assert patch_cr(cluster, {"driver": {"payload": {"version": BROKEN_VERSION},
                                         "upgradePolicy": policy_}}).returncode == 0
    try:
        # held until every node's driver-manager of the new payload has declared it: the planner takes
        # the nodes by name only among the declared ones, and the DaemonSet replaces its pods in its own
        # order (vm-3's pod first: vm-3 started alone and finished on BROKEN_VERSION before vm started)
        wait(cluster, lambda: all(
            (node["metadata"].get("annotations") or {}).get(N.ANNOTATION_DRIVER_PAYLOAD_VERSION) == BROKEN_VERSION
            for name, node in nodes(cluster).items() if name in FLEET), 150,
            "every node's driver-manager on the %s payload" % BROKEN_VERSION)
        assert not any(upgrade_state(node) for name, node in nodes(cluster).items() if name in FLEET)
        assert patch_cr(cluster, {"driver": {"upgradePolicy": {"pause": False}}}).returncode == 0
        follow_rollout(cluster, lambda current: upgrade_state(current["vm"]) == "failed", 150, "vm failed")
        wait(cluster, lambda: driver_upgrade_status(cluster).get("paused") is True, 15, "the rollout paused")
        # two more status rounds (5 s each): nothing else starts
        hold_until = time.monotonic() + 11
        track = follow_rollout(cluster, lambda current: time.monotonic() >= hold_until, 30, "the hold")
        current = nodes(cluster)
        assert loaded("vm") == UPGRADE_VERSION                           # rolled back
        assert cordoned(current["vm"]) and upgrade_state(current["vm"]) == "failed"
        message = current["vm"]["metadata"]["annotations"][N.ANNOTATION_DRIVER_UPGRADE_MESSAGE]
        assert "/dev/mxcd missing" in message and "rolled back to " + UPGRADE_VERSION in message
        for name in ("vm-2", "vm-3"):
            assert name not in track["started"] and not cordoned(current[name]), (name, track)
            assert loaded(name) == UPGRADE_VERSION
        status = driver_upgrade_status(cluster)
        assert status["paused"] is True and status["failed"][0]["node"] == "vm"
        assert "maxFailureThreshold 1" in status["message"]
        degraded = condition(cr(cluster), "metax-driver", "Degraded")
        assert degraded["status"] == "True" and "vm: " in degraded["message"] and "rolled back" in degraded["message"]
        assert any(m.startswith("vm: ") for m in upgrade_events(cluster, "DriverUpgradeFailed"))
        # the old driver validates again: devices registered, driver.ready back (the node stays cordoned)
        wait(cluster, lambda: allocatable(cluster)["vm"] == devices("vm") and
             labels(cluster)["vm"].get(N.LABEL_DRIVER_READY) == "true", 60, "vm back on its old driver")
    finally:
        # the administrator: back to the good payload, then (once the controller has seen it, so that it
        # does not start vm again for the broken one) clears the node and uncordons it
        patch_cr(cluster, {"driver": {"payload": {"version": UPGRADE_VERSION}, "upgradePolicy": {"pause": False}}})
        try:
            wait_until(lambda: driver_upgrade_status(cluster).get("targetVersion") == UPGRADE_VERSION, 30,
                       "the controller to see the good payload")
        finally:
            cluster.kubectl("label", "node", "vm", N.LABEL_DRIVER_UPGRADE_STATE + "-")
            cluster.kubectl("annotate", "node", "vm", *[key + "-" for key in UPGRADE_KEYS[1:]])
            cluster.kubectl("uncordon", "vm")


VENDOR_VERSION = "2.29.0.13"    # MetaX's numbering: the payload's own version ...
VENDOR_KMD = "2.17.13"          # ... and the kernel driver it installs (a real node: 2.29.0.13 -> 2.12.13)


def test_a_payload_whose_version_differs_from_its_kernel_drivers_finishes_a_rolling_upgrade_and_no_node_stays_cordoned(
        cluster, installed, fleet):
    """MetaX's driver image as it is: a prebuilt tree (modules for the node's kernel, mx-smi, the
    declaration), payload 2.29.0.13 installing kernel driver 2.17.13. On target is the loaded module
    (the gpu.driver.* labels) against the declared version: every node finishes and is uncordoned."""
    build_payload(cluster, VENDOR_VERSION, driver=VENDOR_KMD, layouts="prebuilt")
    wait(cluster, lambda: all(loaded(n) == UPGRADE_VERSION for n in FLEET) and not any(
        upgrade_marks(node) or cordoned(node) for name, node in nodes(cluster).items() if name in FLEET),
        120, "every node on %s, nothing of the previous rollout left" % UPGRADE_VERSION)
    policy_ = {"enableRollout": True, "maxParallel": 2, "maxUnavailable": 2, "maxFailureThreshold": 1,
               "fallback": "pause", "upgradeSteps": []}
    assert patch_cr(cluster, {"driver": {"deployPolicy": "Always", "payload": {"version": VENDOR_VERSION},
                                         "upgradePolicy": policy_}}).returncode == 0

    def rolled(current):
        return all(loaded(n) == VENDOR_KMD and not upgrade_marks(current[n]) and not cordoned(current[n])
                   for n in FLEET)
    track = follow_rollout(cluster, rolled, 240, "every node on kernel driver %s (payload %s), uncordoned"
                           % (VENDOR_KMD, VENDOR_VERSION))
    wait(cluster, lambda: driver_upgrade_status(cluster).get("message") == "every node is at the target",
         30, "status.driverUpgrade: every node at the target")
    assert sorted(track["started"]) == sorted(FLEET) and track["max_cordoned"] <= 2, track
    current = nodes(cluster)
    lab = labels(cluster)
    for name in FLEET:
        assert not cordoned(current[name]) and not upgrade_marks(current[name]), name
        assert [lab[name][N.LABEL_DRIVER_MAJOR], lab[name][N.LABEL_DRIVER_MINOR],
                lab[name][N.LABEL_DRIVER_PATCH]] == VENDOR_KMD.split("."), name
        assert lab[name].get(N.LABEL_DRIVER_READY) == "true", name
        annotations = current[name]["metadata"].get("annotations") or {}
        assert annotations.get(N.ANNOTATION_DRIVER_PAYLOAD_VERSION) == VENDOR_VERSION, name
        assert annotations.get(N.ANNOTATION_DRIVER_PAYLOAD_DRIVER) == VENDOR_KMD, name
        # installed from the prebuilt tree: recorded as such, its module where modprobe finds it
        record = json.loads(host(name).read_text(backend.PREBUILT_RECORD))
        assert record["version"] == VENDOR_VERSION and record["driver_version"] == VENDOR_KMD, name
    status = driver_upgrade_status(cluster)
    assert status["targetVersion"] == VENDOR_VERSION and status["upgraded"] == 3 and status["failed"] == []
    wait(cluster, lambda: allocatable(cluster) == {n: devices(n) for n in FLEET}, 60,
         "allocatable = devices on the vendor payload's driver")
    # at rest: the next status rounds start nothing again (the payload's number is never compared)
    hold_until = time.monotonic() + 11
    quiet = follow_rollout(cluster, lambda _current: time.monotonic() >= hold_until, 30, "two quiet status rounds")
    assert quiet["started"] == {}, quiet
    assert all(loaded(n) == VENDOR_KMD for n in FLEET)


IN_PLACE_VERSION, IN_PLACE_KMD = "2.29.0.14", "2.17.14"
IN_PLACE_HOLDER = "upgrade-holder"


def test_an_unset_upgrade_policy_upgrades_in_place_never_cordons_and_a_busy_node_waits_saying_so(
        cluster, installed, fleet):
    """The real CR's default (enableRollout false): a new payload reaches every node without a cordon or
    an eviction; vm-3, whose GPU a pod holds, says "pending: in use" and takes it once the pod is gone."""
    build_payload(cluster, IN_PLACE_VERSION, driver=IN_PLACE_KMD, layouts="prebuilt")
    wait(cluster, lambda: all(loaded(n) == VENDOR_KMD for n in FLEET) and not any(
        upgrade_marks(node) or cordoned(node) for name, node in nodes(cluster).items() if name in FLEET),
        120, "every node on %s, nothing of the previous rollout left" % VENDOR_KMD)
    pod, _pdb = holder_objects(cluster)
    pod["metadata"]["name"] = IN_PLACE_HOLDER
    pod["metadata"]["labels"] = {"app": IN_PLACE_HOLDER}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(pod), check=True)
    try:
        wait(cluster, lambda: ((get_json(cluster, "pod", IN_PLACE_HOLDER, "-n", "default") or {}).get("status") or {})
             .get("phase") == "Running", 60, "the holder pod running on %s" % SRIOV_NODE)
        # upgradePolicy removed from the CR: its defaults, the real CR's
        assert patch_cr(cluster, {"driver": {"payload": {"version": IN_PLACE_VERSION},
                                             "upgradePolicy": None}}).returncode == 0
        idle = [n for n in FLEET if n != SRIOV_NODE]

        def idle_done(current):
            return all(loaded(n) == IN_PLACE_KMD and not upgrade_marks(current[n]) for n in idle) and \
                (current[SRIOV_NODE]["metadata"].get("annotations") or {}).get(
                    N.ANNOTATION_DRIVER_UPGRADE_MESSAGE, "").startswith("pending: in use (pod default/" + IN_PLACE_HOLDER)
        track = follow_rollout(cluster, idle_done, 240, "the idle nodes upgraded in place, %s pending" % SRIOV_NODE)
        assert track["max_cordoned"] == 0, track                    # never a cordon
        current = nodes(cluster)
        assert upgrade_state(current[SRIOV_NODE]) == N.DRIVER_UPGRADE_REQUIRED and not cordoned(current[SRIOV_NODE])
        assert loaded(SRIOV_NODE) == VENDOR_KMD                     # untouched while in use
        assert (get_json(cluster, "pod", IN_PLACE_HOLDER, "-n", "default") or {}).get("status", {}).get(
            "phase") == "Running"                                    # never evicted
        assert driver_upgrade_status(cluster).get("message", "").startswith("in place (enableRollout false")
        cluster.kubectl("delete", "pod", IN_PLACE_HOLDER, "-n", "default", "--wait=true", "--timeout=60s", check=True)

        def all_done(current):
            return all(loaded(n) == IN_PLACE_KMD and not upgrade_marks(current[n]) for n in FLEET)
        after = follow_rollout(cluster, all_done, 120, "%s upgraded once idle" % SRIOV_NODE)
        assert after["max_cordoned"] == 0, after
        wait(cluster, lambda: driver_upgrade_status(cluster).get("message", "").endswith("every node is at the target"),
             30, "status.driverUpgrade: every node at the target")
        lab = labels(cluster)
        for name in FLEET:
            assert [lab[name][N.LABEL_DRIVER_MAJOR], lab[name][N.LABEL_DRIVER_MINOR],
                    lab[name][N.LABEL_DRIVER_PATCH]] == IN_PLACE_KMD.split("."), name
            assert N.ANNOTATION_DRIVER_UPGRADE_IN_PLACE not in (nodes(cluster)[name]["metadata"].get("annotations") or {})
    finally:
        cluster.kubectl("delete", "pod", IN_PLACE_HOLDER, "-n", "default", "--ignore-not-found", "--grace-period=0",
                        "--force")
