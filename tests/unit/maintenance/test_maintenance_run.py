"""The protocol's I/O (maintenance/run.py, nodeside.py) and the node_maintenance module, against an in-memory API.

The API server's part that matters here is kept: a merge patch with a stale resourceVersion is refused with
409, the agents' pods leave a few polls after the pause, evicted pods go. The real API server runs it in
tests/integration/test_set_vfnum_cluster.py and test_driver_upgrade_cluster.py.
"""
from __future__ import annotations

import contextlib
import copy
import json
import os
import sys
from typing import Any, Dict, List

import pytest

from ansible_collections.metax.gpu.plugins.module_utils import maintenance, names as N
from ansible_collections.metax.gpu.plugins.module_utils.errors import MetaxGpuError
from ansible_collections.metax.gpu.plugins.module_utils.kube import client as kube
from ansible_collections.metax.gpu.plugins.module_utils.kube.client import ApiException
from ansible_collections.metax.gpu.plugins.module_utils.maintenance import nodeside
from ansible_collections.metax.gpu.plugins.modules import node_maintenance

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "modules"))
from module_runner import run_module  # noqa: E402

UPGRADE, VFNUM, MANAGER, HEALTH = (N.MAINTENANCE_OWNER_DRIVER_UPGRADE, N.MAINTENANCE_OWNER_SET_VFNUM,
                                   N.MAINTENANCE_OWNER_DRIVER_MANAGER, N.MAINTENANCE_OWNER_HEALTH)


def _merge(have: Dict[str, Any], patch: Dict[str, Any]) -> None:
    for key, value in patch.items():
        if value is None:
            have.pop(key, None)
        elif isinstance(value, dict):
            _merge(have.setdefault(key, {}), value)
        else:
            have[key] = value


def _pods(namespace, *names):
    return {"items": [{"metadata": {"namespace": namespace, "name": name}} for name in names]}


def _raw(obj):
    return type("Raw", (), {"data": json.dumps(obj).encode(), "release_conn": lambda self: None})()


class FakeCore:
    """CoreV1Api's calls the protocol makes, over one Node and its pods."""

    def __init__(self, labels=None, annotations=None, cordoned=False, agents_for=2, gpu_pods=()):
        self.node = {"metadata": {"name": "gpu-1", "resourceVersion": "1", "labels": dict(labels or {}),
                                  "annotations": dict(annotations or {})},
                     "spec": {"unschedulable": True} if cordoned else {}}
        self.api_client = self
        self.patches: List[dict] = []
        self.agents_for = agents_for          # polls the agents' pods stay after the pause
        self.gpu_pods = {name: {"metadata": {"namespace": "ml", "name": name},
                                "spec": {"containers": [{"resources": {"limits": {N.RESOURCE_NAME: "1"}}}]},
                                "status": {"phase": "Running"}} for name in gpu_pods}
        self.evicted: List[str] = []
        self.race = None                      # a write another procedure makes just before ours

    @staticmethod
    def sanitize_for_serialization(obj):
        return copy.deepcopy(obj)

    def read_node(self, name, **kwargs):
        # the raw answer kube/node.py reads (the JSON, not a client model)
        assert name == "gpu-1" and kwargs["_preload_content"] is False
        return _raw(self.node)

    def patch_node(self, name, body, _content_type=None, **kwargs):
        assert _content_type == "application/merge-patch+json" and kwargs["_preload_content"] is False
        if self.race is not None:
            _merge(self.node, self.race)
            self.node["metadata"]["resourceVersion"] = str(int(self.node["metadata"]["resourceVersion"]) + 1)
            self.race = None
        version = (body.get("metadata") or {}).get("resourceVersion")
        if version is not None and version != self.node["metadata"]["resourceVersion"]:
            exc = ApiException()
            exc.status, exc.reason = 409, "Conflict"
            raise exc
        self.patches.append(copy.deepcopy(body))
        body = copy.deepcopy(body)
        body.get("metadata", {}).pop("resourceVersion", None)
        _merge(self.node, body)
        self.node["metadata"]["resourceVersion"] = str(int(self.node["metadata"]["resourceVersion"]) + 1)

    def list_namespaced_pod(self, namespace, label_selector, field_selector):
        assert label_selector == N.NODE_AGENT_POD_SELECTOR and field_selector == "spec.nodeName=gpu-1"
        paused = N.LABEL_AGENTS_PAUSED in self.node["metadata"]["labels"]
        if paused and self.agents_for > 0:
            self.agents_for -= 1
        if paused and self.agents_for == 0:
            return _pods(namespace)
        return _pods(namespace, "metax-gpu-device-x", "metax-gpu-label-y")

    def list_pod_for_all_namespaces(self, field_selector, **kwargs):
        # the raw answer kube/pages.py reads (the JSON, not client models)
        assert field_selector == "spec.nodeName=gpu-1" and kwargs["_preload_content"] is False
        return _raw({"items": list(self.gpu_pods.values()), "metadata": {"resourceVersion": "1"}})

    def create_namespaced_pod_eviction(self, name, namespace, body):
        self.evicted.append("%s/%s" % (namespace, name))
        del self.gpu_pods[name]

    # the labels and annotations as they are now
    def labels(self):
        return self.node["metadata"]["labels"]

    def annotations(self):
        return self.node["metadata"]["annotations"]

    def cordoned(self):
        return bool(self.node["spec"].get("unschedulable"))


def api(core):
    return maintenance.KubeMaintenanceApi(core, sleep=lambda s: None)


def no_sleep(_seconds):
    return None


def test_pause_cordons_pauses_waits_for_the_agents_and_evicts_then_resume_undoes_it():
    core = FakeCore(gpu_pods=["train-0"])
    out = maintenance.pause(api(core), "gpu-1", HEALTH, evict=maintenance.Eviction(timeout=60), sleep=no_sleep)
    assert core.cordoned() and core.labels()[N.LABEL_AGENTS_PAUSED] == HEALTH
    assert core.annotations() == {N.ANNOTATION_MAINTENANCE_OWNER: HEALTH,
                                  N.ANNOTATION_MAINTENANCE_CORDON: N.MAINTENANCE_CORDON_OURS}
    assert core.agents_for == 0 and core.evicted == ["ml/train-0"] and out.changed
    # one patch, written against the resourceVersion read
    assert len(core.patches) == 1 and core.patches[0]["metadata"]["resourceVersion"] == "1"
    back = maintenance.resume(api(core), "gpu-1", HEALTH)
    assert not core.cordoned() and core.labels() == {} and core.annotations() == {} and back.changed
    assert not maintenance.resume(api(core), "gpu-1", HEALTH).changed


def test_the_agents_not_leaving_is_a_timeout_naming_their_pods():
    core = FakeCore(agents_for=10 ** 6)
    clock = iter(range(0, 1000, 5))
    with pytest.raises(maintenance.MaintenanceTimeout, match="metax-gpu-device-x.*after 30 s"):
        maintenance.pause(api(core), "gpu-1", UPGRADE, agents_timeout=30, sleep=no_sleep,
                          clock=lambda: float(next(clock)))


def test_another_owner_is_refused_and_nothing_is_written():
    core = FakeCore(labels={N.LABEL_AGENTS_PAUSED: VFNUM})
    for call in (maintenance.pause, maintenance.resume):
        with pytest.raises(maintenance.MaintenanceConflict, match="held by set-vfnum"):
            call(api(core), "gpu-1", UPGRADE)
    assert core.patches == []


def test_a_claim_lost_to_a_concurrent_writer_is_planned_again_and_refused():
    core = FakeCore()
    core.race = {"metadata": {"annotations": {N.ANNOTATION_MAINTENANCE_OWNER: VFNUM}}}
    with pytest.raises(maintenance.MaintenanceConflict, match="held by set-vfnum"):
        maintenance.pause(api(core), "gpu-1", UPGRADE, sleep=no_sleep)
    assert core.patches == [] and not core.cordoned()


def test_check_mode_writes_waits_and_evicts_nothing():
    core = FakeCore(gpu_pods=["train-0"])
    out = maintenance.pause(api(core), "gpu-1", HEALTH, evict=maintenance.Eviction(), check_mode=True)
    assert core.patches == [] and core.evicted == [] and core.agents_for == 2
    assert out.change.changed and out.evicted["selected"] == ["ml/train-0"]


def test_a_bad_node_name_is_refused_before_any_call():
    with pytest.raises(MetaxGpuError, match="not a node name"):
        maintenance.pause(api(FakeCore()), "a,b", HEALTH)


class NodeApiFake:
    """nodeapi.NodeApi's metadata calls, as driver-manager's Kube answers them."""

    def __init__(self, labels=None, annotations=None):
        self.meta = {"labels": dict(labels or {}), "annotations": dict(annotations or {})}
        self.patches: List[tuple] = []

    def node_metadata(self):
        return copy.deepcopy(self.meta)

    def patch_node(self, labels, annotations):
        self.patches.append((dict(labels), dict(annotations)))
        _merge(self.meta["labels"], dict(labels))
        _merge(self.meta["annotations"], dict(annotations))


def test_an_agents_hold_records_the_owner_only_and_is_refused_while_another_holds_the_node():
    fake = NodeApiFake()
    nodeside.hold(fake, MANAGER)
    assert fake.patches == [({}, {N.ANNOTATION_MAINTENANCE_OWNER: MANAGER})] and nodeside.holder(fake) == MANAGER
    nodeside.release(fake, MANAGER)
    assert fake.meta == {"labels": {}, "annotations": {}} and nodeside.holder(fake) is None
    busy = NodeApiFake(labels={N.LABEL_AGENTS_PAUSED: VFNUM})
    with pytest.raises(maintenance.MaintenanceConflict):
        nodeside.hold(busy, MANAGER)
    assert busy.patches == []


# -- the module ---------------------------------------------------------------------------

@pytest.fixture
def fake_kube(monkeypatch):
    holder: Dict[str, FakeCore] = {}

    def install(core):
        holder["core"] = core
        monkeypatch.setattr(kube, "module_client", lambda module: (object(), None))
        monkeypatch.setattr(kube, "core_v1", lambda client: core)
        monkeypatch.setattr(kube, "reaching", lambda client, auth=None: contextlib.nullcontext())
        monkeypatch.setattr(maintenance.run.time, "sleep", no_sleep)
        return core
    return install


def test_module_pause_and_resume_with_diff(fake_kube):
    core = fake_kube(FakeCore(cordoned=True))
    failed, result = run_module(node_maintenance, {"node_name": "gpu-1", "owner": "set-vfnum", "cordon": True,
                                                   "procedure_state": "pending", "procedure_message": ""}, diff=True)
    assert not failed and result["changed"] and result["held_by"] is None and result["cordon_kept"]
    assert core.labels() == {N.LABEL_AGENTS_PAUSED: VFNUM, N.LABEL_VFNUM_STATE: "pending"}
    assert result["diff"]["after"]["labels"][N.LABEL_VFNUM_STATE] == "pending"
    failed, result = run_module(node_maintenance, {"node_name": "gpu-1", "owner": "set-vfnum", "state": "resumed",
                                                   "procedure_state": "success"})
    assert not failed and core.cordoned() and result["cordon_kept"]      # the administrator's cordon stays
    assert core.labels() == {N.LABEL_VFNUM_STATE: "success"} and core.annotations() == {}


def test_module_refuses_another_owner_with_the_holder_named(fake_kube):
    core = fake_kube(FakeCore(labels={N.LABEL_AGENTS_PAUSED: "true"}))
    failed, result = run_module(node_maintenance, {"node_name": "gpu-1", "owner": "set-vfnum"}, check_mode=True)
    assert failed and "held by driver-upgrade's maintenance" in result["msg"] and core.patches == []


def test_module_check_mode_changes_nothing_and_reports_the_plan(fake_kube):
    core = fake_kube(FakeCore(gpu_pods=["train-0"]))
    failed, result = run_module(node_maintenance, {"node_name": "gpu-1", "owner": "health", "evict": True},
                                check_mode=True)
    assert not failed and result["changed"] and result["selected"] == ["ml/train-0"]
    assert result["patch"]["spec"] == {"unschedulable": True} and core.patches == [] and core.evicted == []


@pytest.mark.parametrize("args, words", [
    ({"node_name": ""}, "not a node name"),
    ({"agents_timeout": -1}, "agents_timeout must not be negative"),
    ({"poll_delay": 0}, "poll_delay must be at least 1"),
    ({"owner": "health", "procedure_state": "x"}, "health has no procedure_state"),
])
def test_module_bad_input_is_one_clear_message_and_nothing_changed(fake_kube, args, words):
    core = fake_kube(FakeCore())
    failed, result = run_module(node_maintenance, dict({"node_name": "gpu-1", "owner": "set-vfnum"}, **args))
    assert failed and words in result["msg"] and core.patches == []


def test_the_protocol_sits_below_the_procedures_that_use_it():
    """maintenance/ imports names, errors, kube/ and nodeapi only: driver/, vfnum/, the agents and the
    operator import it (the health ladder will too), never the reverse; standard library only."""
    import ast
    package = os.path.dirname(maintenance.__file__)
    for name in sorted(os.listdir(package)):
        if not name.endswith(".py"):
            continue
        tree = ast.parse(open(os.path.join(package, name)).read())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level >= 2:
                top = (node.module or "").split(".")[0]
                assert top in ("names", "errors", "kube", "nodeapi", ""), (name, node.module)
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                assert node.module.split(".")[0] in sys.stdlib_module_names | {"__future__"}, (name, node.module)
            elif isinstance(node, ast.Import):
                assert all(a.name.split(".")[0] in sys.stdlib_module_names for a in node.names), name


def _batch_calls():
    """batch.yml's node_maintenance runs up to the label removal, their arguments rendered for gpu-1."""
    import yaml
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "roles", "driver_upgrade",
                        "tasks", "batch.yml")
    with open(path) as handle:
        block = yaml.safe_load(handle)[0]["block"]
    values = {"{{ item }}": "gpu-1", "{{ driver_upgrade_kubeconfig }}": None, "{{ driver_upgrade_namespace }}": "metax-gpu",
              "{{ driver_upgrade_agents_timeout }}": 120, "{{ driver_upgrade_poll_delay }}": 1}
    calls = []
    for task in block:
        if "metax.gpu.node_maintenance" not in task:
            continue
        args = {key: values.get(value, value) if isinstance(value, str) else value
                for key, value in task["metax.gpu.node_maintenance"].items()}
        calls.append((task["name"], {key: value for key, value in args.items() if value is not None}))
        if args.get("remove_agent_labels"):
            return calls
    raise AssertionError("batch.yml removes no agent labels")


def test_the_driver_upgrade_batch_holds_cordons_and_pauses_in_one_patch_then_waits_then_removes_the_labels(fake_kube):
    """An administrator's cordon and gpu-label's labels on the node: the first run writes one patch (hold,
    the cordon recorded as the administrator's, the pause, state paused) and does not wait; the second waits
    for the agents and writes nothing; the third removes gpu-label's labels and keeps the day-two ones."""
    core = fake_kube(FakeCore(cordoned=True, labels={N.PREFIX + "gpu.product": "C500", N.LABEL_DRIVER_UPGRADE_SKIP: "x"}))
    (hold_name, hold), (_wait_name, wait), (_remove_name, remove) = _batch_calls()
    failed, result = run_module(node_maintenance, hold, diff=True)
    assert not failed and result["changed"] and result["cordon_kept"] and result["agents_wait"] == 0, result
    assert core.agents_for == 2                                         # not one look at the agents' pods
    assert len(core.patches) == 1 and core.patches[0]["metadata"]["labels"] == {
        N.LABEL_AGENTS_PAUSED: UPGRADE, N.LABEL_DRIVER_UPGRADE_STATE: "paused"}
    assert core.patches[0]["metadata"]["annotations"] == {
        N.ANNOTATION_MAINTENANCE_OWNER: UPGRADE, N.ANNOTATION_MAINTENANCE_CORDON: N.MAINTENANCE_CORDON_ADMIN}
    assert "spec" not in core.patches[0]                                # cordoned already: the administrator's
    failed, result = run_module(node_maintenance, wait)
    assert not failed and not result["changed"] and core.agents_for == 0 and len(core.patches) == 1
    assert core.labels()[N.PREFIX + "gpu.product"] == "C500"           # still there while the agents were
    failed, result = run_module(node_maintenance, remove)
    assert not failed and result["changed"] and len(core.patches) == 2
    assert core.labels() == {N.LABEL_AGENTS_PAUSED: UPGRADE, N.LABEL_DRIVER_UPGRADE_STATE: "paused",
                             N.LABEL_DRIVER_UPGRADE_SKIP: "x"}
    assert core.cordoned() and core.annotations()[N.ANNOTATION_MAINTENANCE_CORDON] == N.MAINTENANCE_CORDON_ADMIN
    assert hold_name == "Cordon"
