# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The operator's rolling driver upgrade decisions against a real kube-apiserver (issue 25).

A private control plane (controlplane.py: no kubelets, so the shared local
cluster is not needed) holds six GPU Node objects, the operator's CRD and a
ClusterOperator. Each round plays the controller's part with the
controller's own code, ``Cluster.roll_driver`` over the ``kubernetes``
client (read the nodes, apply clusteroperator/driver_rollout.py's patches),
and writes status.driverUpgrade through the status subresource; then the
node agents' part of the contract (docs/operator.md, "driver upgradePolicy"):
upgrade-required -> paused (gpu-label's labels stripped) -> done with the new
version, or failed with a message on one node. Last, the driver component is
switched off in the middle of a third rollout: the controller's cleanup
(``Operator.cleanup_nodes``) hands the started nodes back. The node agents are the
test's; the API server (merge-patch semantics, the CRD's status schema) is real.

Checked after every controller round, on what the API server holds: at most
maxUnavailable nodes cordoned or NotReady, at most maxParallel in flight, the
administrator's cordon never undone, and at the end every node upgraded
except the failed and the NotReady one, nothing of the upgrade left behind.
"""

from __future__ import annotations

import json
import os

import pytest
from controlplane import ControlPlane

from ansible_collections.metax.gpu.plugins.module_utils import names as N
from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator.operator import Operator
from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator.cluster import Cluster
from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator.components import DRIVER
from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator.driver_rollout import driver_rollout
from ansible_collections.metax.gpu.plugins.module_utils.kube.client import api_client

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CHART = os.path.join(ROOT, "files", "charts", "metax-operator")
NS = N.OPERATOR_NAMESPACE
OLD, NEW = "2.14.6", "2.40.1"
VERSION_LABELS = (N.LABEL_DRIVER_MAJOR, N.LABEL_DRIVER_MINOR, N.LABEL_DRIVER_PATCH)
POLICY = {"enableRollout": True, "maxParallel": 2, "maxUnavailable": 4, "maxFailureThreshold": 2, "fallback": "pause",
          "upgradeSteps": [{"replicas": 1, "pauseDuration": 5000}, {"replicas": "100%", "pauseDuration": 0}]}
ADMIN, FAILS, NOT_READY = "gpu-1", "gpu-3", "gpu-5"
T0 = 1_790_000_000.0


def declared(payload, kmd=None):
    """What each node's driver-manager of ``payload`` publishes: the payload and the kernel driver it installs."""
    return {N.ANNOTATION_DRIVER_PAYLOAD_VERSION: payload, N.ANNOTATION_DRIVER_PAYLOAD_DRIVER: kmd or payload}


def gpu_labels(version):
    labels = {N.LABEL_GPU_INSTALLED: "true", N.LABEL_DRIVER_READY: "true", N.LABEL_DRIVER_MODE: "cloud",
              "kubernetes.io/os": "linux"}
    labels.update(zip(VERSION_LABELS, version.split(".")))
    return labels


class Api:
    def __init__(self, cp):
        self.cp = cp

    def ok(self, *args, **kwargs):
        res = self.cp.kubectl(*args, **kwargs)
        assert res.returncode == 0, res.stderr
        return res

    def nodes(self):
        return json.loads(self.ok("get", "nodes", "-o", "json").stdout)["items"]

    def patch_node(self, name, body):
        self.ok("patch", "node", name, "--type=merge", "-p", json.dumps(body))

    def cr(self):
        return json.loads(self.ok("get", "clusteroperator", N.OPERATOR_CR_NAME, "-n", NS, "-o", "json").stdout)


@pytest.fixture(scope="module")
def api():
    cp = ControlPlane().start()
    try:
        a = Api(cp)
        a.ok("apply", "--server-side", "-f", os.path.join(CHART, "crds"))
        a.ok("create", "namespace", NS)
        a.ok("wait", "--for=condition=Established", "crd/clusteroperators.gpu.metax-tech.com", "--timeout=60s")
        cr = {"apiVersion": "gpu.metax-tech.com/v1alpha1", "kind": N.OPERATOR_KIND,
              "metadata": {"name": N.OPERATOR_CR_NAME, "namespace": NS},
              "spec": {"driver": {"deployPolicy": "IfNotPresent",
                                  "payload": {"name": "driver-image", "version": NEW}, "upgradePolicy": POLICY}}}
        a.ok("create", "-f", "-", input=json.dumps(cr))
        for i in range(6):
            name = "gpu-%d" % i
            node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": gpu_labels(OLD),
                                                                     "annotations": declared(NEW)},
                    "spec": {"unschedulable": True} if name == ADMIN else {},
                    "status": {"conditions": [{"type": "Ready", "status": "False" if name == NOT_READY else "True",
                                               "reason": "Test", "message": "set by the test"}]}}
            a.ok("create", "-f", "-", input=json.dumps(node))
        yield a
    finally:
        cp.stop()


def agent_round(api, nodes):
    """The node agents' side of the contract; True when a node moved."""
    moved = False
    for node in nodes:
        name, labels = node["metadata"]["name"], node["metadata"].get("labels") or {}
        state = labels.get(N.LABEL_DRIVER_UPGRADE_STATE)
        assert node["spec"].get("unschedulable") or state is None, "%s is in the procedure uncordoned" % name
        if state == N.DRIVER_UPGRADE_REQUIRED:
            strip = {k: None for k in labels if k.startswith(N.LABEL_PREFIX) and k not in N.DAY_TWO_LABELS}
            api.patch_node(name, {"metadata": {"labels": dict(strip, **{N.LABEL_DRIVER_UPGRADE_STATE: "paused"})}})
        elif state == "paused" and name == FAILS:
            api.patch_node(name, {"metadata": {
                "labels": dict(gpu_labels(OLD), **{N.LABEL_DRIVER_UPGRADE_STATE: "failed"}),
                "annotations": {N.ANNOTATION_DRIVER_UPGRADE_MESSAGE: "validate: driver.ready missing; rolled back"}}})
        elif state == "paused":
            api.patch_node(name, {"metadata": {
                "labels": dict(gpu_labels(NEW), **{N.LABEL_DRIVER_UPGRADE_STATE: N.DRIVER_UPGRADE_DONE})}})
        else:
            continue
        moved = True
    return moved


def test_rollout_rounds_against_the_api_server(api):
    now, status, trace = T0, {}, []
    controller = Cluster(api_client(api.cp.kubeconfig), NS)
    for _round in range(40):
        plan = controller.roll_driver(api.cr()["spec"], now, status)
        assert not plan.error, plan.error
        status = plan.status
        # the CRD's status schema keeps every field (a structural schema would prune unknown ones)
        api.ok("patch", "clusteroperator", N.OPERATOR_CR_NAME, "-n", NS, "--subresource=status", "--type=merge",
               "-p", json.dumps({"status": {"driverUpgrade": status}}))
        assert api.cr()["status"]["driverUpgrade"] == status
        nodes = {n["metadata"]["name"]: n for n in api.nodes()}
        unavailable = sorted(n for n, node in nodes.items() if node["spec"].get("unschedulable") or any(
            c["type"] == "Ready" and c["status"] != "True" for c in node["status"]["conditions"]))
        in_flight = sorted(n for n, node in nodes.items() if (node["metadata"].get("labels") or {}).get(
            N.LABEL_DRIVER_UPGRADE_STATE) not in (None, N.DRIVER_UPGRADE_DONE, "failed"))
        trace.append((now - T0, [p.node + ":" + p.action for p in plan.patches], unavailable, status["message"]))
        assert len(unavailable) <= POLICY["maxUnavailable"], trace
        assert len(in_flight) <= POLICY["maxParallel"], trace
        assert nodes[ADMIN]["spec"].get("unschedulable"), trace
        moved = agent_round(api, list(nodes.values()))
        if not plan.patches and not moved and not status["message"].startswith("between steps"):
            break
        now += 1.0
    else:
        pytest.fail("the rollout did not settle in 40 rounds: %s" % trace)
    print("\n".join("t+%2.0fs %-28s unavailable %-22s %s" % (t, ",".join(p), ",".join(u), m)
                    for t, p, u, m in trace))
    nodes = {n["metadata"]["name"]: n for n in api.nodes()}
    for name, node in nodes.items():
        labels, annotations = node["metadata"].get("labels") or {}, node["metadata"].get("annotations") or {}
        version = ".".join(labels.get(k, "?") for k in VERSION_LABELS)
        if name == FAILS:
            assert labels[N.LABEL_DRIVER_UPGRADE_STATE] == "failed" and node["spec"].get("unschedulable")
            assert version == OLD and "rolled back" in annotations[N.ANNOTATION_DRIVER_UPGRADE_MESSAGE]
            continue
        assert version == (OLD if name == NOT_READY else NEW), name
        assert N.LABEL_DRIVER_UPGRADE_STATE not in labels, name
        assert not [k for k in annotations if k.startswith(N.PREFIX + "driver.upgrade")], name
        assert bool(node["spec"].get("unschedulable")) == (name == ADMIN), name
    assert status["upgraded"] == 4 and status["failed"] == [
        {"node": FAILS, "reason": "validate: driver.ready missing; rolled back"}]
    assert status["message"] == "over; not upgraded: %s (failed), %s (not-ready)" % (FAILS, NOT_READY)
    # the canary step: one node alone, then a 5 s pause before the rest
    first_starts = [t for t, p, _u, _m in trace if any(x.endswith(":start") for x in p)]
    assert first_starts[0] == 0 and first_starts[1] >= 5 + 2, trace


def test_failure_threshold_pauses_the_next_rollout(api):
    """A second bump with maxFailureThreshold 1: the failed node from before pauses it at once."""
    api.ok("patch", "clusteroperator", N.OPERATOR_CR_NAME, "-n", NS, "--type=merge", "-p", json.dumps(
        {"spec": {"driver": {"payload": {"version": "2.41.0"}, "upgradePolicy": {"maxFailureThreshold": 1}}}}))
    plan = driver_rollout(api.cr()["spec"], api.nodes(), T0 + 100, {})
    assert plan.patches == () and plan.status["paused"]
    assert plan.status["message"].startswith("paused: 1 node(s) failed (%s)" % FAILS)


def test_the_driver_switched_off_mid_rollout_hands_the_started_nodes_back(api):
    api.ok("patch", "clusteroperator", N.OPERATOR_CR_NAME, "-n", NS, "--type=merge", "-p", json.dumps(
        {"spec": {"driver": {"payload": {"version": "2.42.0"}, "upgradePolicy": {
            "maxFailureThreshold": 5, "upgradeSteps": [{"replicas": "100%", "pauseDuration": 0}]}}}}))
    for node in api.nodes():         # the new payload's driver-manager pods have run a round
        api.patch_node(node["metadata"]["name"], {"metadata": {"annotations": declared("2.42.0")}})
    cluster = Cluster(api_client(api.cp.kubeconfig), NS)
    plan = cluster.roll_driver(api.cr()["spec"], T0 + 200, {})
    started = sorted(p.node for p in plan.patches if p.action == "start")
    assert started and FAILS not in started, plan
    ours = [n for n in started if n != ADMIN]
    assert ours, plan          # at least one cordon of ours to lift
    assert all(n["spec"].get("unschedulable") for n in api.nodes() if n["metadata"]["name"] in ours)
    # deploy: false with the driver-manager pods gone (there are none here): the controller's cleanup
    Operator(cluster, "helm", "/nonexistent").cleanup_nodes([DRIVER], api.cr()["metadata"]["uid"])
    nodes = {n["metadata"]["name"]: n for n in api.nodes()}
    for name in started:
        meta = nodes[name]["metadata"]
        assert bool(nodes[name]["spec"].get("unschedulable")) == (name == ADMIN), name   # ours lifted only
        assert N.LABEL_DRIVER_UPGRADE_STATE not in (meta.get("labels") or {}), name
        assert not [k for k in meta.get("annotations") or {} if k.startswith(N.PREFIX + "driver.upgrade")], name
    failed = nodes[FAILS]
    assert failed["spec"]["unschedulable"] and failed["metadata"]["labels"][N.LABEL_DRIVER_UPGRADE_STATE] == "failed"
    assert "rolled back" in failed["metadata"]["annotations"][N.ANNOTATION_DRIVER_UPGRADE_MESSAGE]
