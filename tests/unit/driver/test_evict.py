"""Which pods the upgrade evicts, and how a PodDisruptionBudget's refusal is handled.

The eviction API itself is exercised on the real cluster (test_driver_upgrade_cluster.py);
here a minimal in-memory API stands in so the retry/timeout/force paths are covered.
"""
from __future__ import annotations

import json

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.kube.pods import gpu_pods
from ansible_collections.metax.gpu.plugins.module_utils.kube import evict as ev
from ansible_collections.metax.gpu.plugins.module_utils.kube.client import ApiException
from ansible_collections.metax.gpu.plugins.module_utils.names import RESOURCE_NAME


def pod(name, gpu=False, phase="Running", owner=None, mirror=False, init_gpu=False):
    res = {"limits": {RESOURCE_NAME: "1"}} if gpu else {}
    spec = {"containers": [{"name": "c", "resources": res}]}
    if init_gpu:
        spec["initContainers"] = [{"name": "i", "resources": {"requests": {RESOURCE_NAME: "1"}}}]
    meta = {"name": name, "namespace": "ml"}
    if owner:
        meta["ownerReferences"] = [{"kind": owner}]
    if mirror:
        meta["annotations"] = {ev.MIRROR_ANNOTATION: "x"}
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


PODS = [pod("a", gpu=True), pod("b"), pod("c", gpu=True, phase="Succeeded"), pod("d", owner="DaemonSet"),
        pod("e", mirror=True), pod("f", init_gpu=True)]


def test_only_live_gpu_pods_unless_drain():
    assert gpu_pods(PODS) == ["ml/a", "ml/f"]
    assert ev.select(PODS, drain=False) == ["ml/a", "ml/f"]
    assert ev.select(PODS, drain=True) == ["ml/a", "ml/b", "ml/f"]


class FakeCore:
    """Pods vanish when evicted, unless a 'PDB' blocks them."""

    def __init__(self, pods, blocked=()):
        self.pods = {p["metadata"]["name"]: p for p in pods}
        self.blocked = set(blocked)
        self.api_client = self
        self.deleted = []

    @staticmethod
    def sanitize_for_serialization(obj):
        return obj

    def list_pod_for_all_namespaces(self, field_selector, **kwargs):
        assert field_selector == "spec.nodeName=n1" and kwargs["_preload_content"] is False
        body = json.dumps({"items": list(self.pods.values()), "metadata": {"resourceVersion": "1"}}).encode()
        return type("Raw", (), {"data": body, "release_conn": lambda self: None})()

    def create_namespaced_pod_eviction(self, name, namespace, body):
        assert body["kind"] == "Eviction" and namespace == "ml"
        if name in self.blocked:
            exc = ApiException()
            exc.status, exc.reason = 429, "Too Many Requests"
            # what the API server answers (policy/v1 Eviction refused by a PodDisruptionBudget)
            exc.body = ('{"kind":"Status","message":"Cannot evict pod as it would violate the pod\'s disruption '
                        'budget.","reason":"TooManyRequests","details":{"causes":[{"reason":"DisruptionBudget",'
                        '"message":"The disruption budget pdb-a needs 1 healthy pods and has 1 currently"}]},'
                        '"code":429}')
            raise exc
        del self.pods[name]

    def delete_namespaced_pod(self, name, namespace, grace_period_seconds):
        self.deleted.append(name)
        del self.pods[name]


def test_evicts_and_check_mode_does_not():
    core = FakeCore(PODS)
    assert ev.evict(core, "n1", check_mode=True)["selected"] == ["ml/a", "ml/f"] and "a" in core.pods
    result = ev.evict(core, "n1", sleep=lambda s: None)
    assert result["evicted"] == ["ml/a", "ml/f"] and "a" not in core.pods and "b" in core.pods


def test_a_pdb_blocks_until_timeout_then_fails_or_force_deletes():
    with pytest.raises(ev.EvictionError, match="ml/a"):
        ev.evict(FakeCore(PODS, blocked={"a"}), "n1", timeout=0, sleep=lambda s: None)
    core = FakeCore(PODS, blocked={"a"})
    result = ev.evict(core, "n1", timeout=0, force=True, sleep=lambda s: None)
    assert result["evicted"] == ["ml/f"] and result["deleted"] == ["ml/a"] and core.deleted == ["a"]


def test_the_error_names_the_pods_left_and_the_budget_that_refused_them():
    core = FakeCore(PODS, blocked={"a"})
    with pytest.raises(ev.EvictionError) as caught:
        ev.evict(core, "n1", timeout=0, sleep=lambda s: None)
    assert caught.value.remaining == ["ml/a"]
    assert caught.value.refused == {"ml/a": "The disruption budget pdb-a needs 1 healthy pods and has 1 currently"}
    assert "f" not in core.pods                      # the other pod was evicted meanwhile


def test_a_refusal_without_a_status_body_says_the_code():
    exc = ApiException()
    exc.status, exc.reason, exc.body = 429, "Too Many Requests", None
    assert ev.refusal(exc) == "429 Too Many Requests"


def test_without_retry_a_refusal_ends_the_call_at_once_and_the_others_are_still_evicted():
    core = FakeCore(PODS, blocked={"a"})
    slept = []
    with pytest.raises(ev.EvictionError) as caught:
        ev.evict(core, "n1", timeout=300, sleep=slept.append, retry_refused=False)
    assert caught.value.remaining == ["ml/a"] and "pdb-a" in caught.value.refused["ml/a"]
    assert slept == [] and "f" not in core.pods and "a" in core.pods


class NoListCore(FakeCore):
    """driver-manager's view: it may not list pods; the pods holding the GPUs come from the kubelet."""

    def list_pod_for_all_namespaces(self, field_selector):
        raise AssertionError("driver-manager lists no pods (its ClusterRole has no pods list)")

    def holders(self):
        return sorted("ml/" + name for name, p in self.pods.items() if name in ("a", "f"))


def test_holders_replace_the_pod_list_for_selection_and_the_wait():
    core = NoListCore(PODS)
    assert ev.evict(core, "n1", check_mode=True, holders=core.holders)["selected"] == ["ml/a", "ml/f"]
    result = ev.evict(core, "n1", sleep=lambda s: None, holders=core.holders)
    assert result["evicted"] == ["ml/a", "ml/f"] and "a" not in core.pods and "b" in core.pods


def test_holders_with_a_refusal_still_name_the_budget():
    core = NoListCore(PODS, blocked={"a"})
    with pytest.raises(ev.EvictionError) as caught:
        ev.evict(core, "n1", timeout=300, sleep=lambda s: None, retry_refused=False, holders=core.holders)
    assert caught.value.remaining == ["ml/a"] and "pdb-a" in caught.value.refused["ml/a"]


def test_a_guard_denial_is_an_error_naming_the_pod():
    """The eviction guard's 403 (a pod of another node): the call fails naming it, nothing else done."""
    core = NoListCore(PODS)

    def denied(name, namespace, body):
        exc = ApiException()
        exc.status, exc.reason = 403, "Forbidden"
        raise exc
    core.create_namespaced_pod_eviction = denied
    with pytest.raises(ev.EvictionError, match="evicting ml/a: 403"):
        ev.evict(core, "n1", sleep=lambda s: None, holders=core.holders)
