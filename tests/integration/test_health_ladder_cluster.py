# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The GPU health remediation ladder on the local three-node cluster (issue 42 item 4, docs/health.md
"Remediation"): the real kubelet, API server, node-agent admission policy and eviction guard.

The GPU Operator chart with the driver component, as test_driver_manager_cluster.py installs it (its
fixtures: the payload image, the mixed fleet, the operator release with ``nodeAgentPolicy.enabled``
and ``gpuDevice.healthyInterval=2``), and the health policy through the ClusterOperator's
``spec.devicePlugin.healthPolicy``: an uncorrectable ECC error remediates, quick recovery (hold-off 0,
one clean reading). Checked here:

- the ladder on an uncorrectable-ECC row: driver-manager cordons the node (the maintenance record
  ``ours``, owner ``health``: admitted by the node-agent policy), the GPU pod is evicted through the
  Eviction API, the driver reload succeeds (the simulator's reload zeroes the counters), gpu-device
  reads the node healthy and the ladder uncordons it; every step an Event on the Node and in
  ``MetaXGPURemediation``;
- an administrator's cordon is kept throughout (recorded ``admin``, still cordoned after the recovery);
- two nodes failing with ``maxNodes: 1``: the second waits (``RemediationWaiting``, not cordoned) while
  the first is held at its eviction by a PodDisruptionBudget, and climbs once the first recovers.

The time from the injection to the cordon and to the recovery is written to stderr.
"""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from test_driver_manager_cluster import (  # noqa: E402,F401  # pylint: disable=unused-import  # fixtures
    FLEET, fleet, host, installed, payload, wait)
from test_operator_cluster import (  # noqa: E402,F401  # pylint: disable=unused-import  # fixtures
    NS, cr, get_json, no_extensions, patch_cr)

from ansible_collections.metax.gpu.plugins.module_utils import names as N  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.health import ladder as L  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.sim import signals as sim_signals  # noqa: E402

pytestmark = pytest.mark.cluster

ROW = {"signal": "ecc-dram-uncorrectable", "threshold": 1, "severity": "critical", "action": "device-unhealthy",
       "remediate": True}
POLICY = {"holdOffSeconds": 0, "recoveryReadings": 1,
          "remediation": {"maxNodes": 1, "evictTimeoutSeconds": 300, "settleSeconds": 120},
          "rules": [ROW]}
GPU = 0                    # every node of the fleet has a GPU 0
CLIMB = 90                 # the injection to the cordon: gpu-device's reading (2 s), driver-manager woken by its watch
RECOVER = 180              # the cordon to the recovery: eviction, reload, gpu-device restarted and its first reading
POD_PREFIX = "ladder-gpu-"


def node_json(cluster, name):
    return cluster.read_node(name) or {}


def annotations(cluster, name):
    return (node_json(cluster, name).get("metadata") or {}).get("annotations") or {}


def cordoned(cluster, name):
    return bool((node_json(cluster, name).get("spec") or {}).get("unschedulable"))


def node_condition(cluster, name, kind):
    for cond in (node_json(cluster, name).get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return cond
    return {}


def held(cluster, name):
    return annotations(cluster, name).get(N.ANNOTATION_MAINTENANCE_OWNER) == N.MAINTENANCE_OWNER_HEALTH


def recovered(cluster, name):
    cond = node_condition(cluster, name, N.CONDITION_GPU_REMEDIATION)
    return cond.get("reason") == "Recovered" and not held(cluster, name) \
        and N.ANNOTATION_HEALTH_REMEDIATION not in annotations(cluster, name)


def ladder_events(cluster, name):
    """(reason, message) of driver-manager's ladder Events on Node ``name``, oldest first."""
    out = json.loads(cluster.kubectl("get", "events", "-n", NS, "-o", "json", "--field-selector",
                                     "involvedObject.kind=Node,involvedObject.name=" + name).stdout or '{"items": []}')
    # the timestamps have whole seconds and two steps often share one (the cordon and the first
    # eviction); the API server's resourceVersion, from one etcd, orders creations within it
    items = sorted(out["items"], key=lambda e: (e.get("lastTimestamp") or e.get("eventTime") or "",
                                                int((e.get("metadata") or {}).get("resourceVersion") or 0)))
    return [(e["reason"], e.get("message", "")) for e in items if e.get("reason", "").startswith("GPURemediation")
            and (e.get("source") or {}).get("component") == "driver-manager"]


def gpu_pod(cluster, node, name):
    image = cluster.base_image.replace("localhost/", cluster.registry + "/")
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default",
                                                            "labels": {"app": name}},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": node}, "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "c", "image": image, "command": ["sleep", "3600"],
                                     "resources": {"limits": {N.RESOURCE_NAME: "1"}}}]}}


def pdb_of(name):
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": name + "-pdb", "namespace": "default"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": name}}}}


def apply(cluster, obj):
    cluster.kubectl("apply", "-f", "-", input=json.dumps(obj), check=True)


def pod_phase(cluster, name):
    pod = get_json(cluster, "pod", name, "-n", "default")
    return None if pod is None or pod["metadata"].get("deletionTimestamp") else pod["status"].get("phase")


def inject(name):
    sim_signals.inject_signals(host(name), GPU, ecc={"dram_uncorrectable": 1})


def restart_gpu_device(cluster):
    """gpu-device reads the policy now, not after the kubelet's refresh of the mounted ConfigMap."""
    cluster.kubectl("delete", "pods", "-n", NS, "-l", "app.kubernetes.io/name=" + N.DAEMONSET_GPU_DEVICE,
                    "--wait=true", "--timeout=60s")

    def ready():
        pods = json.loads(cluster.kubectl("get", "pods", "-n", NS, "-l", "app.kubernetes.io/name="
                                          + N.DAEMONSET_GPU_DEVICE, "-o", "json").stdout or '{"items": []}')["items"]
        up = {p["spec"].get("nodeName") for p in pods if not p["metadata"].get("deletionTimestamp")
              and any(c.get("ready") for c in (p.get("status") or {}).get("containerStatuses") or [])}
        return set(FLEET) <= up
    wait(cluster, ready, 120, "gpu-device Ready on every node again")


def clean_node(cluster, name):
    """What an incident left: signals, the cordon, the ladder's keys and condition."""
    root = host(name)
    for gpu in generator.load_state(root)["gpus"]:
        sim_signals.clear_signals(root, gpu["index"])
    cluster.kubectl("uncordon", name)
    keys = (N.ANNOTATION_MAINTENANCE_OWNER, N.ANNOTATION_MAINTENANCE_CORDON, N.ANNOTATION_HEALTH_REMEDIATION,
            N.ANNOTATION_REBOOT_REQUIRED)
    cluster.kubectl("annotate", "node", name, *["%s-" % k for k in keys])
    conds = [c.get("type") for c in (node_json(cluster, name).get("status") or {}).get("conditions") or []]
    if N.CONDITION_GPU_REMEDIATION in conds:
        cluster.kubectl("patch", "node", name, "--subresource=status", "--type=json", "-p", json.dumps(
            [{"op": "remove", "path": "/status/conditions/%d" % conds.index(N.CONDITION_GPU_REMEDIATION)}]))


@pytest.fixture(scope="module")
def ladder(cluster, installed, fleet):
    def ready():
        lab = {n: (node_json(cluster, n).get("metadata") or {}).get("labels") or {} for n in FLEET}
        return all(lab[n].get(N.LABEL_DRIVER_READY) == "true" for n in FLEET)
    wait(cluster, ready, 180, "driver.ready on every node")
    for name in FLEET:
        generator.reinstall_mx_smi(host(name))     # the simulator's mx-smi: --count-ecc, -j, injected signals
        clean_node(cluster, name)
    assert patch_cr(cluster, {"devicePlugin": {"healthPolicy": POLICY}}).returncode == 0
    wait(cluster, lambda: "remediate" in ((get_json(cluster, "configmap", N.HEALTH_POLICY_CONFIGMAP, "-n", NS) or {})
                                          .get("data") or {}).get("policy.json", ""), 60,
         "the controller rendered the policy into %s" % N.HEALTH_POLICY_CONFIGMAP)
    restart_gpu_device(cluster)
    try:
        yield
    finally:
        for name in FLEET:
            clean_node(cluster, name)
        patch_cr(cluster, {"devicePlugin": {"healthPolicy": None}})


def cleanup_pods(cluster, *names):
    for name in names:
        cluster.kubectl("delete", "pdb", name + "-pdb", "-n", "default", "--ignore-not-found")
        cluster.kubectl("delete", "pod", name, "-n", "default", "--ignore-not-found", "--grace-period=1")


def test_the_ladder_cordons_evicts_reloads_and_recovery_uncordons(cluster, ladder):
    node = "vm-3"
    pod = POD_PREFIX + "a"
    apply(cluster, gpu_pod(cluster, node, pod))
    try:
        wait(cluster, lambda: pod_phase(cluster, pod) == "Running", 90, "the GPU pod running on %s" % node)
        assert not cordoned(cluster, node)
        start = time.monotonic()
        inject(node)
        wait(cluster, lambda: L.remediating(node_condition(cluster, node, N.CONDITION_GPU_HEALTHY)), 30,
             "gpu-device marks the finding remediate")
        wait(cluster, lambda: held(cluster, node) and cordoned(cluster, node), CLIMB,
             "%s cordoned and held for health" % node)
        to_cordon = time.monotonic() - start
        assert annotations(cluster, node)[N.ANNOTATION_MAINTENANCE_CORDON] == N.MAINTENANCE_CORDON_OURS
        wait(cluster, lambda: pod_phase(cluster, pod) is None, 90, "the GPU pod evicted")
        wait(cluster, lambda: recovered(cluster, node), RECOVER, "%s recovered" % node)
        to_recovery = time.monotonic() - start
        assert not cordoned(cluster, node)
        assert node_condition(cluster, node, N.CONDITION_GPU_HEALTHY).get("status") == "True"
        # the reload zeroed the counters, and no reboot was asked for
        assert not (generator.load_state(host(node))["gpus"][GPU].get("ecc") or {}).get("dram_uncorrectable")
        assert N.ANNOTATION_REBOOT_REQUIRED not in annotations(cluster, node)
        reasons = [r for r, _m in ladder_events(cluster, node)]
        for step in ("GPURemediationCordon", "GPURemediationEvict", "GPURemediationDriverReload",
                     "GPURemediationRecovered"):
            assert step in reasons, reasons
        assert reasons.index("GPURemediationCordon") < reasons.index("GPURemediationEvict") \
            < reasons.index("GPURemediationDriverReload") < reasons.index("GPURemediationRecovered")
        reload_message = next(m for r, m in ladder_events(cluster, node) if r == "GPURemediationDriverReload")
        assert "reloaded, verified" in reload_message, reload_message
        assert "uncordoned" in node_condition(cluster, node, N.CONDITION_GPU_REMEDIATION)["message"]
        sys.stderr.write("\nremediation ladder on %s: cordoned %.1f s after the injection, recovered and "
                         "uncordoned after %.1f s\n" % (node, to_cordon, to_recovery))
    finally:
        cleanup_pods(cluster, pod)
        clean_node(cluster, node)


def test_an_administrators_cordon_is_kept_throughout(cluster, ladder):
    node = "vm"
    cluster.kubectl("cordon", node, check=True)
    try:
        inject(node)
        wait(cluster, lambda: held(cluster, node), CLIMB, "%s held for health" % node)
        assert annotations(cluster, node)[N.ANNOTATION_MAINTENANCE_CORDON] == N.MAINTENANCE_CORDON_ADMIN
        wait(cluster, lambda: recovered(cluster, node), RECOVER, "%s recovered" % node)
        assert cordoned(cluster, node)                   # the administrator's, never lifted
        assert "the administrator's cordon kept" in node_condition(cluster, node, N.CONDITION_GPU_REMEDIATION)["message"]
    finally:
        clean_node(cluster, node)


def test_two_nodes_failing_with_a_budget_of_one_the_second_waits(cluster, ladder):
    first, second = "vm-2", "vm-3"
    pod = POD_PREFIX + "b"
    apply(cluster, pdb_of(pod))
    apply(cluster, gpu_pod(cluster, first, pod))
    try:
        wait(cluster, lambda: pod_phase(cluster, pod) == "Running", 90, "the guarded GPU pod running on %s" % first)
        inject(first)
        wait(cluster, lambda: held(cluster, first) and cordoned(cluster, first), CLIMB, "%s held" % first)
        # the first stays at its eviction (the budget keeps its pod): the second fails meanwhile
        wait(cluster, lambda: node_condition(cluster, first, N.CONDITION_GPU_REMEDIATION).get("reason")
             == "EvictingGPUPods", 60, "%s at its eviction" % first)
        inject(second)
        wait(cluster, lambda: node_condition(cluster, second, N.CONDITION_GPU_REMEDIATION).get("reason")
             == "RemediationWaiting", CLIMB, "%s waits for the budget" % second)
        time.sleep(10)
        assert not cordoned(cluster, second) and not held(cluster, second)
        assert first in node_condition(cluster, second, N.CONDITION_GPU_REMEDIATION)["message"]
        lease = get_json(cluster, "lease", N.HEALTH_SLOT_PREFIX + "-0", "-n", NS)
        assert lease is not None and lease["spec"]["holderIdentity"] == first
        # the budget lifted: the first is evicted, reloaded, recovers; then the second climbs
        cluster.kubectl("delete", "pdb", pod + "-pdb", "-n", "default", check=True)
        wait(cluster, lambda: recovered(cluster, first), RECOVER + 60, "%s recovered" % first)
        assert not cordoned(cluster, first)
        wait(cluster, lambda: held(cluster, second) or recovered(cluster, second), CLIMB + 60,
             "%s climbs once a slot is free" % second)
        wait(cluster, lambda: recovered(cluster, second), RECOVER, "%s recovered" % second)
        assert not cordoned(cluster, second)
        assert "GPURemediationCordon" in [r for r, _m in ladder_events(cluster, second)]
    finally:
        cleanup_pods(cluster, pod)
        clean_node(cluster, first)
        clean_node(cluster, second)
