"""The operator-controller's status round drives the rolling driver upgrade (issue 25).

The controller's own code (Operator.roll_driver and Operator.status, Cluster.roll_driver over
clusteroperator/driver_rollout.py) against a recorded API: the Node objects are held here and the
merge patches the controller sends are applied to them, as the API server would
(tests/integration/test_driver_rollout_apiserver.py does the same against a real API server, and
test_driver_manager_cluster.py with the installed operator on the local cluster).
"""
from __future__ import annotations

import copy
from typing import Any, Dict, List

from ansible_collections.metax.gpu.plugins.module_utils import names as N
from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator.notes import status_patch
from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator.operator import Operator
from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator.cluster import Cluster
from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator.components import DRIVER, REGISTRY

OLD, NEW = "2.14.6", "2.40.1"
T0 = 1_790_000_000.0


def merge(target: Dict[str, Any], patch: Dict[str, Any]) -> None:
    """RFC 7386 merge patch, in place."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict):
            merge(target.setdefault(key, {}), value)
        else:
            target[key] = value


def gpu_node(name: str, version: str = OLD, cordoned: bool = False, payload: str = NEW,
             kmd: str = "") -> Dict[str, Any]:
    """A GPU node whose driver-manager (of ``payload``) declared the kernel driver ``kmd`` (or the same)."""
    labels = {N.LABEL_GPU_INSTALLED: "true", N.LABEL_DRIVER_MODE: "cloud", N.LABEL_DRIVER_READY: "true"}
    labels.update(zip((N.LABEL_DRIVER_MAJOR, N.LABEL_DRIVER_MINOR, N.LABEL_DRIVER_PATCH), version.split(".")))
    annotations = {N.ANNOTATION_DRIVER_PAYLOAD_VERSION: payload, N.ANNOTATION_DRIVER_PAYLOAD_DRIVER: kmd or payload}
    return {"metadata": {"name": name, "labels": labels, "annotations": annotations},
            "spec": {"unschedulable": True} if cordoned else {},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


class _Core:
    def __init__(self, api: "RecordedApi") -> None:
        self.api = api

    def patch_node(self, name: str, body: Dict[str, Any]) -> None:
        self.api.calls.append(("patch_node", name, copy.deepcopy(body)))
        merge(self.api.held[name], body)


class RecordedApi:
    """What Operator.status and Cluster.roll_driver ask of the API server; node patches recorded and applied."""

    roll_driver = Cluster.roll_driver       # the controller's own code, over this recorded API
    hand_back_nodes = Cluster.hand_back_nodes
    strip_nodes = Cluster.strip_nodes
    patch_node_metadata = Cluster.patch_node_metadata
    namespace = N.OPERATOR_NAMESPACE        # the components' (the ClusterOperator is cluster-scoped)

    def __init__(self, nodes: List[Dict[str, Any]]) -> None:
        self.held = {n["metadata"]["name"]: n for n in nodes}
        self.calls: List[tuple] = []
        self.core = _Core(self)

    def nodes(self) -> List[Dict[str, Any]]:
        return [copy.deepcopy(n) for n in self.held.values()]

    def workload(self, component: Any) -> Dict[str, Any]:
        n = len(self.held)
        return {"metadata": {"generation": 1}, "status": {
            "observedGeneration": 1, "desiredNumberScheduled": n, "numberReady": n, "updatedNumberScheduled": n,
            "readyReplicas": 1, "updatedReplicas": 1}}

    def pods(self, uid: str, component: Any = None) -> List[Dict[str, Any]]:
        ready = {"conditions": [{"type": "Ready", "status": "True"}], "phase": "Running"}
        return [{"metadata": {"name": "%s-%s" % (component.name, node)}, "spec": {"nodeName": node},
                 "status": ready} for node in self.held]

    def get(self, obj: Any) -> None:
        return None                       # no driver-config: nothing to say about it

    def patch_node_metadata(self, node: str, metadata: Dict[str, Any]) -> None:
        self.core.patch_node(node, {"metadata": metadata})

    def starts(self) -> List[str]:
        return [name for call, name, body in self.calls
                if call == "patch_node" and body.get("metadata", {}).get("labels", {}).get(
                    N.LABEL_DRIVER_UPGRADE_STATE) == N.DRIVER_UPGRADE_REQUIRED]


def cr(policy: Any, deploy: bool = True, status: Any = None, payload: str = NEW) -> Dict[str, Any]:
    """The CR; ``policy`` is upgradePolicy over a rolling one (enableRollout true, no steps); None: unset."""
    body = {"metadata": {"name": N.OPERATOR_CR_NAME, "uid": "u1", "generation": 3},
            "spec": {"driver": {"deploy": deploy, "deployPolicy": "IfNotPresent", "payload": {"version": payload}}}}
    if policy is not None:
        body["spec"]["driver"]["upgradePolicy"] = dict({"enableRollout": True, "upgradeSteps": []}, **policy)
    if status is not None:
        body["status"] = status
    return body


def round_(operator: Operator, body: Dict[str, Any], now: float) -> Dict[str, Any]:
    """The kopf status timer's work: roll, then the status it would write (kept on the CR)."""
    rollout = operator.roll_driver(body, now)
    body["status"] = operator.status(body, "2026-11-27T04:00:00Z", rollout)
    return body["status"]


def driver_condition(status: Dict[str, Any], kind: str) -> Dict[str, Any]:
    entry = next(c for c in status["components"] if c["name"] == "metax-driver")
    return next(c for c in entry["conditions"] if c["type"] == kind)


def node_agents_finish(api: RecordedApi, name: str, kmd: str = NEW) -> None:
    """driver-manager's and gpu-label's part: the new driver verified, its (kernel driver) version published."""
    labels = api.held[name]["metadata"]["labels"]
    labels[N.LABEL_DRIVER_UPGRADE_STATE] = N.DRIVER_UPGRADE_DONE
    labels.update(zip((N.LABEL_DRIVER_MAJOR, N.LABEL_DRIVER_MINOR, N.LABEL_DRIVER_PATCH), kmd.split(".")))


def test_the_status_round_rolls_the_driver_within_max_unavailable_and_reports_it():
    api = RecordedApi([gpu_node("a"), gpu_node("b", cordoned=True), gpu_node("c")])
    operator = Operator(api, "helm", "/nonexistent", REGISTRY)   # type: ignore[arg-type]
    body = cr({"maxParallel": 2, "maxUnavailable": 2})
    status = round_(operator, body, T0)
    # b was cordoned by the administrator (costs nothing, recorded); a takes the one place left
    assert sorted(api.starts()) == ["a", "b"]
    assert api.held["b"]["metadata"]["annotations"][N.ANNOTATION_PRE_CORDONED] == "true"
    assert api.held["a"]["metadata"]["annotations"][N.ANNOTATION_DRIVER_UPGRADE_TARGET] == NEW
    upgrade = status["driverUpgrade"]
    assert upgrade["targetVersion"] == NEW and upgrade["inProgress"] == ["a", "b"] and upgrade["upgraded"] == 0
    assert driver_condition(status, "Degraded")["status"] == "False"
    # nothing moves until the nodes' agents report
    api.calls.clear()
    round_(operator, body, T0 + 5)
    assert api.starts() == []
    for name in ("a", "b"):
        node_agents_finish(api, name)
    status = round_(operator, body, T0 + 10)
    assert api.starts() == ["c"]                             # a's uncordon freed the place in the same round
    assert api.held["a"]["spec"].get("unschedulable") is False
    assert api.held["b"]["spec"]["unschedulable"] is True    # the administrator's cordon is never undone
    for name in ("a", "b"):
        meta = api.held[name]["metadata"]
        assert N.LABEL_DRIVER_UPGRADE_STATE not in meta["labels"]
        assert not {N.ANNOTATION_PRE_CORDONED, N.ANNOTATION_DRIVER_UPGRADE_TARGET} & set(meta["annotations"])
    node_agents_finish(api, "c")
    status = round_(operator, body, T0 + 15)
    assert status["driverUpgrade"]["message"] == "every node is at the target"
    assert status["driverUpgrade"]["upgraded"] == 3
    assert not any(n["spec"].get("unschedulable") for name, n in api.held.items() if name != "b")


def test_an_upgrade_policy_the_planner_refuses_is_degraded_and_starts_nothing():
    api = RecordedApi([gpu_node("a"), gpu_node("b")])
    operator = Operator(api, "helm", "/nonexistent", REGISTRY)   # type: ignore[arg-type]
    status = round_(operator, cr({"maxParallel": 0}), T0)
    assert api.starts() == [] and not any(n["spec"].get("unschedulable") for n in api.held.values())
    degraded = driver_condition(status, "Degraded")
    assert degraded["status"] == "True" and "upgradePolicy" in degraded["message"]
    assert "maxParallel must be at least 1" in degraded["message"]
    assert "maxParallel must be at least 1" in status["driverUpgrade"]["message"]


def test_without_the_driver_component_there_is_no_rollout():
    api = RecordedApi([gpu_node("a")])
    operator = Operator(api, "helm", "/nonexistent", REGISTRY)   # type: ignore[arg-type]
    status = round_(operator, cr({}, deploy=False), T0)
    assert api.starts() == [] and "driverUpgrade" not in status


def test_a_failed_node_stays_cordoned_pauses_the_rollout_and_is_degraded():
    api = RecordedApi([gpu_node("a"), gpu_node("b")])
    operator = Operator(api, "helm", "/nonexistent", REGISTRY)   # type: ignore[arg-type]
    body = cr({"maxParallel": 1, "maxUnavailable": 1, "maxFailureThreshold": 1})
    round_(operator, body, T0)
    assert api.starts() == ["a"]
    meta = api.held["a"]["metadata"]
    meta["labels"][N.LABEL_DRIVER_UPGRADE_STATE] = "failed"           # driver-manager's report
    meta["annotations"][N.ANNOTATION_DRIVER_UPGRADE_MESSAGE] = "driver verification failed; rolled back to " + OLD
    api.calls.clear()
    status = round_(operator, body, T0 + 5)
    assert api.starts() == [] and api.held["a"]["spec"]["unschedulable"] is True
    assert status["driverUpgrade"]["paused"] is True
    assert status["driverUpgrade"]["failed"] == [{"node": "a", "reason": meta["annotations"][
        N.ANNOTATION_DRIVER_UPGRADE_MESSAGE]}]
    degraded = driver_condition(status, "Degraded")
    assert degraded["status"] == "True" and "a: driver verification failed" in degraded["message"]


def test_the_status_patch_removes_what_the_rollout_no_longer_says():
    old = {"driverUpgrade": {"targetVersion": NEW, "step": 1, "stepPause": {"step": 0, "until": "x"}, "paused": False}}
    new = {"driverUpgrade": {"targetVersion": NEW, "paused": False}, "components": []}
    patched: Dict[str, Any] = copy.deepcopy(old)
    merge(patched, status_patch(old, new))
    assert patched == new                                   # a merge patch of new alone would keep step
    # the driver component switched off: the rollout's status goes
    patched = copy.deepcopy(old)
    merge(patched, status_patch(old, {"components": []}))
    assert patched == {"components": []}
    assert status_patch({}, new) == new


def test_the_driver_component_switched_off_mid_rollout_hands_the_nodes_back():
    api = RecordedApi([gpu_node("a"), gpu_node("b", cordoned=True), gpu_node("c"), gpu_node("d")])
    operator = Operator(api, "helm", "/nonexistent", REGISTRY)   # type: ignore[arg-type]
    round_(operator, cr({"maxParallel": 3, "maxUnavailable": 3}), T0)
    assert sorted(api.starts()) == ["a", "b", "c"]
    failed = api.held["c"]["metadata"]
    failed["labels"][N.LABEL_DRIVER_UPGRADE_STATE] = "failed"           # driver-manager's report
    failed["annotations"][N.ANNOTATION_DRIVER_UPGRADE_MESSAGE] = "driver verification failed"
    api.calls.clear()
    # deploy: false, its pods gone: what _apply_all does for a component that is off
    api.pods = lambda uid, component=None: []              # type: ignore[method-assign]
    operator.cleanup_nodes([DRIVER], "u1")
    assert api.held["a"]["spec"]["unschedulable"] is False              # our cordon lifted
    assert api.held["b"]["spec"]["unschedulable"] is True               # the administrator's kept
    for name in ("a", "b"):
        meta = api.held[name]["metadata"]
        assert N.LABEL_DRIVER_UPGRADE_STATE not in meta["labels"]
        assert not {N.ANNOTATION_PRE_CORDONED, N.ANNOTATION_DRIVER_UPGRADE_TARGET} & set(meta["annotations"])
    # the failed node: left as after any failure, for the administrator
    assert api.held["c"]["spec"]["unschedulable"] is True
    assert failed["labels"][N.LABEL_DRIVER_UPGRADE_STATE] == "failed"
    assert failed["annotations"][N.ANNOTATION_DRIVER_UPGRADE_MESSAGE] == "driver verification failed"
    assert "c" not in [name for _call, name, _body in api.calls]
    # a node outside the rollout: only the component's own keys go (driver.mode, driver.ready, its
    # driver-manager's payload declaration), never its cordon
    assert [body for _call, name, body in api.calls if name == "d"] == [
        {"metadata": {"labels": {N.LABEL_DRIVER_MODE: None, N.LABEL_DRIVER_READY: None},
                      "annotations": {N.ANNOTATION_DRIVER_PAYLOAD_VERSION: None,
                                      N.ANNOTATION_DRIVER_PAYLOAD_DRIVER: None}}}]


def test_an_unset_upgrade_policy_upgrades_in_place_and_never_cordons():
    """The real CR's defaults: a new payload version reaches every node in place, never a cordon, and
    the vendor's numbering (payload 2.29.0.13, kernel driver 2.12.13) finishes."""
    payload, kmd = "2.29.0.13", "2.12.13"
    api = RecordedApi([gpu_node(n, version="2.12.11", payload=payload, kmd=kmd) for n in ("a", "b", "c")]
                      + [gpu_node("d", version="2.12.11", cordoned=True, payload=payload, kmd=kmd)])
    operator = Operator(api, "helm", "/nonexistent", REGISTRY)   # type: ignore[arg-type]
    body = cr(None, payload=payload)
    status = round_(operator, body, T0)
    assert sorted(api.starts()) == ["a", "b", "c", "d"]
    assert all("spec" not in body_ for _call, _name, body_ in api.calls)       # not one cordon
    assert all(n["metadata"]["annotations"][N.ANNOTATION_DRIVER_UPGRADE_IN_PLACE] == "true" for n in api.held.values())
    assert status["driverUpgrade"]["message"].startswith("in place")
    for name in ("a", "b", "c", "d"):
        node_agents_finish(api, name, kmd)
    api.calls.clear()
    status = round_(operator, body, T0 + 5)
    assert all("spec" not in body_ for _call, _name, body_ in api.calls)       # nor an uncordon
    assert api.held["d"]["spec"]["unschedulable"] is True                        # the administrator's, kept
    assert not any(n["spec"].get("unschedulable") for name, n in api.held.items() if name != "d")
    assert status["driverUpgrade"]["upgraded"] == 4 and status["driverUpgrade"]["inProgress"] == []
    for node in api.held.values():
        assert N.LABEL_DRIVER_UPGRADE_STATE not in node["metadata"]["labels"]
        assert N.ANNOTATION_DRIVER_UPGRADE_IN_PLACE not in node["metadata"]["annotations"]
