"""Switching a node between the device plugin and DRA (dra/switch.py, dra/switch_run.py): never served by both.

The pure part over API objects as dicts; the run against an in-memory cluster that keeps what matters of the
real one: the DaemonSets' affinity (the paused label keeps both agents off, the mode label picks one), agents
that take a few API round trips to come and go, the kubelet zeroing a gone device plugin's allocatable one
node-status update later, gpu-dra publishing only once that allocatable is 0 (agents/gpu_dra.py), and a stale
resourceVersion refused with 409. Every API call is a moment: what serves the node is sampled at each, and
no moment may have both. The real cluster runs it in tests/integration/test_dra_switch_cluster.py.
"""
from __future__ import annotations

import copy
from typing import Any, Dict, List

import pytest

from ansible_collections.metax.gpu.plugins.module_utils import maintenance, names as N
from ansible_collections.metax.gpu.plugins.module_utils.dra import switch as S
from ansible_collections.metax.gpu.plugins.module_utils.dra import switch_run as R
from ansible_collections.metax.gpu.plugins.module_utils.errors import MetaxGpuError

NODE = "gpu-1"
GPUS = 4
DP, DRA = N.DEVICE_MODE_PLUGIN, N.DEVICE_MODE_DRA


def _merge(have: Dict[str, Any], patch: Dict[str, Any]) -> None:
    for key, value in patch.items():
        if value is None:
            have.pop(key, None)
        elif isinstance(value, dict):
            _merge(have.setdefault(key, {}), value)
        else:
            have[key] = value


def gpu_pod(name, phase="Running", node=NODE):
    return {"metadata": {"namespace": "ml", "name": name}, "spec": {"nodeName": node, "containers": [
        {"name": "c", "resources": {"limits": {N.RESOURCE_NAME: "1"}}}]}, "status": {"phase": phase}}


def claim_pod(name, node=NODE):
    return {"metadata": {"namespace": "ml", "name": name}, "spec": {"nodeName": node, "containers": [
        {"name": "c", "resources": {"claims": [{"name": "gpus"}]}}]}, "status": {"phase": "Running"}}


def claim(pod, pool=NODE, driver=N.DRA_DRIVER):
    return {"metadata": {"namespace": "ml", "name": pod + "-gpus"},
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpus", "driver": driver, "pool": pool, "device": "gpu-0000-3b-00-0"}]}},
                "reservedFor": [{"resource": "pods", "name": pod, "uid": "u-" + pod}]}}


def a_slice(node=NODE, generation=1, devices=GPUS, driver=N.DRA_DRIVER, name=None):
    return {"metadata": {"name": name or "%s-%s-%d" % (node, driver, generation)},
            "spec": {"driver": driver, "nodeName": node, "pool": {"name": node, "generation": generation,
                                                                  "resourceSliceCount": 1},
                     "devices": [{"name": "gpu-%d" % i} for i in range(devices)]}}


class Cluster:
    """The API server, the DaemonSet controller, the kubelet and both agents of one node, in memory."""

    def __init__(self, mode=None, lag=2, kubelet_lag=3, kubelet_zeroes=True):
        labels = {N.LABEL_DEVICE_MODE: mode} if mode else {}
        self.node = {"metadata": {"name": NODE, "resourceVersion": "1", "labels": labels, "annotations": {}},
                     "spec": {}, "status": {"allocatable": {}}}
        self.pods: Dict[str, Dict[str, Any]] = {}
        self.claims: List[Dict[str, Any]] = []
        self.slices_: Dict[str, Dict[str, Any]] = {}
        self.lag, self.kubelet_lag, self.kubelet_zeroes = lag, kubelet_lag, kubelet_zeroes
        self.agent = "gpu-dra" if mode == DRA else "gpu-device"   # the agent running on the node
        self.leaving = self.coming = self.zeroing = -1              # countdowns
        self.log: List[str] = []                                    # what happened, in order
        self.samples: List[S.Serving] = []
        self.patches: List[dict] = []
        if self.agent == "gpu-device":
            self.node["status"]["allocatable"][N.RESOURCE_NAME] = str(GPUS)
        else:
            self.node["status"]["allocatable"][N.RESOURCE_NAME] = "0"     # a gone plugin's, kept at 0
            self.slices_["old"] = a_slice(name="old")

    # -- the world moving on: one step per API call ---------------------------
    def desired(self):
        labels = self.node["metadata"]["labels"]
        if N.LABEL_AGENTS_PAUSED in labels:
            return None
        return "gpu-dra" if labels.get(N.LABEL_DEVICE_MODE) == DRA else "gpu-device"

    def tick(self):
        want = self.desired()
        if self.agent is not None and self.agent != want:
            self.leaving = self.lag if self.leaving < 0 else self.leaving - 1
            if self.leaving == 0:
                self.log.append("%s left" % self.agent)
                if self.agent == "gpu-device":
                    self.zeroing = self.kubelet_lag       # the kubelet marks the devices unhealthy
                self.agent, self.leaving = None, -1
        if self.zeroing >= 0:
            self.zeroing -= 1
            if self.zeroing < 0 and self.kubelet_zeroes:
                self.node["status"]["allocatable"][N.RESOURCE_NAME] = "0"
                self.log.append("allocatable 0")
        if self.agent is None and want is not None:
            self.coming = self.lag if self.coming < 0 else self.coming - 1
            if self.coming == 0:
                self.agent, self.coming = want, -1
                self.log.append("%s started" % want)
        if self.agent == "gpu-device" and self.node["status"]["allocatable"].get(N.RESOURCE_NAME) != str(GPUS):
            self.node["status"]["allocatable"][N.RESOURCE_NAME] = str(GPUS)
            self.log.append("device plugin advertises")
        if self.agent == "gpu-dra" and not self.slices_ and S.plugin_allocatable(self.node) == 0:
            # gpu-dra's rule: publish only once the device plugin's allocatable is 0
            self.slices_["new"] = a_slice(name="new", generation=2)
            self.log.append("gpu-dra publishes")
        now = S.serving(self.node, self.slices_.values())
        self.samples.append(now)
        assert not now.both, (now, self.log)

    def settle(self, steps=20):
        for _step in range(steps):
            self.tick()
        return S.serving(self.node, self.slices_.values())

    # -- SwitchApi -------------------------------------------------------------
    def read_node(self, node):
        assert node == NODE
        self.tick()
        return copy.deepcopy(self.node)

    def patch_node(self, node, body):
        self.tick()
        body = copy.deepcopy(body)
        version = (body.get("metadata") or {}).pop("resourceVersion", None)
        if version is not None and version != self.node["metadata"]["resourceVersion"]:
            raise maintenance.run.Stale("409")
        self.patches.append(body)
        _merge(self.node, body)
        self.node["metadata"]["resourceVersion"] = str(int(self.node["metadata"]["resourceVersion"]) + 1)

    def agent_pods(self, node):
        self.tick()
        return ["metax-gpu/" + self.agent] if self.agent else []

    def evict(self, node, request, check_mode):
        self.tick()
        selected = S.holders(self.pods.values(), self.claims, node)
        if not check_mode:
            self.log.append("evicted %s while %s serves" % (",".join(selected), self.agent))
            for key in selected:
                self.pods.pop(key.split("/", 1)[1], None)
            self.claims = [c for c in self.claims if "ml/" + c["status"]["reservedFor"][0]["name"] not in selected]
        return {"selected": selected, "evicted": [] if check_mode else selected, "deleted": []}

    def node_pods(self, node):
        self.tick()
        return copy.deepcopy(list(self.pods.values()))

    def claims_(self):
        self.tick()
        return copy.deepcopy(self.claims)

    def slices(self, node):
        self.tick()
        return copy.deepcopy(list(self.slices_.values()))

    def delete_slice(self, name):
        self.tick()
        self.slices_.pop(name, None)


class Api:
    """Cluster under SwitchApi's method names (``claims`` is the cluster's list there)."""

    def __init__(self, cluster):
        self.c = cluster

    def __getattr__(self, name):
        return getattr(self.c, "claims_" if name == "claims" else name)


def no_sleep(_seconds):
    return None


def run(cluster, target, **kwargs):
    return R.switch(Api(cluster), NODE, target, sleep=no_sleep, **kwargs)


# -- the pure part ------------------------------------------------------------------

@pytest.mark.parametrize("value, mode", [(None, DP), (DP, DP), ("other", DP), (DRA, DRA), ("", DP)])
def test_the_mode_is_dra_only_when_the_label_says_so(value, mode):
    labels = {N.LABEL_DEVICE_MODE: value} if value is not None else {}
    assert S.mode_of({"metadata": {"labels": labels}}) == mode


def test_serving_counts_allocatable_and_the_newest_generation_of_our_pool_on_this_node():
    node = {"metadata": {"name": NODE}, "status": {"allocatable": {N.RESOURCE_NAME: "8"}}}
    slices = [a_slice(generation=1, devices=8, name="a"), a_slice(generation=2, devices=7, name="b"),
              a_slice(node="gpu-2", name="c"), a_slice(driver="gpu.example.com", name="d")]
    now = S.serving(node, slices)
    assert now == S.Serving(8, 7) and now.both and now.by == "both"
    assert S.serving({"metadata": {"name": NODE}}, []).by is None
    assert S.serving(node, []).by == DP
    assert S.serving({"metadata": {"name": NODE}, "status": {"allocatable": {N.RESOURCE_NAME: "0"}}}, slices).by == DRA


def test_a_malformed_allocatable_is_an_error_not_a_guess():
    with pytest.raises(MetaxGpuError, match="not a count"):
        S.plugin_allocatable({"metadata": {"name": NODE}, "status": {"allocatable": {N.RESOURCE_NAME: "lots"}}})


def test_holders_are_gpu_pods_and_pods_reserved_on_a_claim_of_this_nodes_pool():
    pods = [gpu_pod("dp"), gpu_pod("done", phase="Succeeded"), claim_pod("dra"), claim_pod("other-pool"),
            {"metadata": {"namespace": "ml", "name": "web"}, "spec": {"containers": [{"name": "c"}]},
             "status": {"phase": "Running"}}]
    claims = [claim("dra"), claim("other-pool", pool="gpu-2"), claim("gone"),
              claim("other-driver", driver="gpu.example.com")]
    assert S.claim_holders(claims, NODE) == ["ml/dra", "ml/gone"]
    # a claim still reserved for a pod that is no longer on the node holds nothing
    assert S.holders(pods, claims, NODE) == ["ml/dp", "ml/dra"]


def test_a_switch_in_use_is_refused_unless_evicting_and_a_node_in_its_mode_is_no_change():
    node = {"metadata": {"name": NODE, "labels": {}}}
    with pytest.raises(S.SwitchRefused, match="in use by ml/a.*evict=true") as info:
        S.plan_switch(node, DRA, ["ml/a"], evict=False)
    assert info.value.holders == ["ml/a"]
    plan = S.plan_switch(node, DRA, ["ml/a"], evict=True)
    assert plan.changed and plan.label_patch() == {"metadata": {"labels": {N.LABEL_DEVICE_MODE: DRA}}}
    assert plan.diff() == {"before": {"mode": DP}, "after": {"mode": DRA}}
    assert not S.plan_switch(node, DP, ["ml/a"], evict=False).changed
    with pytest.raises(MetaxGpuError, match="expected one of"):
        S.plan_switch(node, "both", [], evict=False)


# -- the run ----------------------------------------------------------------------

def test_device_plugin_to_dra_and_back_is_never_served_by_both():
    cluster = Cluster()
    assert cluster.settle().by == DP
    out = run(cluster, DRA)
    assert out.changed and out.plan.before == DP and out.plan.after == DRA
    assert cluster.node["metadata"]["labels"] == {N.LABEL_DEVICE_MODE: DRA}
    assert cluster.node["metadata"]["annotations"] == {} and not cluster.node["spec"].get("unschedulable")
    now = cluster.settle()
    assert now.by == DRA and now.dra == GPUS
    # the device plugin was gone (allocatable 0) before the label changed, and gpu-dra published after that
    log = cluster.log
    assert log.index("gpu-device left") < log.index("allocatable 0") < log.index("gpu-dra started")
    back = run(cluster, DP)
    assert back.changed and back.slices_deleted == ["new"]
    assert cluster.settle().by == DP
    assert cluster.node["metadata"]["labels"] == {N.LABEL_DEVICE_MODE: DP}
    # every moment sampled: one mode or none, never both (tick asserts it); both modes were seen
    assert {s.by for s in cluster.samples} == {DP, DRA, None}


def test_a_switch_while_a_pod_holds_a_gpu_is_refused_and_changes_nothing():
    cluster = Cluster()
    cluster.pods["train"] = gpu_pod("train")
    with pytest.raises(S.SwitchRefused, match="ml/train"):
        run(cluster, DRA)
    assert cluster.patches == [] and cluster.agent == "gpu-device" and "train" in cluster.pods


def test_with_evict_the_holders_go_first_while_their_agent_still_serves():
    cluster = Cluster(mode=DRA)
    cluster.settle()
    cluster.pods["claimer"] = claim_pod("claimer")
    cluster.claims.append(claim("claimer"))
    with pytest.raises(S.SwitchRefused, match="ml/claimer"):
        run(cluster, DP)
    assert cluster.patches == []
    out = run(cluster, DP, evict=maintenance.Eviction(timeout=60))
    assert out.evicted["evicted"] == ["ml/claimer"] and out.plan.holders == ["ml/claimer"]
    # gpu-dra was still there to unprepare the claim when its pod was evicted
    assert "evicted ml/claimer while gpu-dra serves" in cluster.log
    assert cluster.settle().by == DP


def test_check_mode_writes_nothing_and_names_what_it_would_evict():
    cluster = Cluster()
    cluster.pods["train"] = gpu_pod("train")
    out = run(cluster, DRA, evict=maintenance.Eviction(), check_mode=True)
    assert out.changed and out.evicted["selected"] == ["ml/train"] and out.evicted["evicted"] == []
    assert cluster.patches == [] and "train" in cluster.pods


def test_a_node_another_procedure_holds_is_refused_and_nothing_is_written():
    cluster = Cluster()
    cluster.node["metadata"]["annotations"][N.ANNOTATION_MAINTENANCE_OWNER] = N.MAINTENANCE_OWNER_SET_VFNUM
    for check_mode in (True, False):
        with pytest.raises(maintenance.MaintenanceConflict, match="held by set-vfnum"):
            run(cluster, DRA, check_mode=check_mode)
    assert cluster.patches == []


def test_a_node_in_its_mode_is_left_alone_and_a_failed_runs_hold_released():
    cluster = Cluster(mode=DRA)
    assert not run(cluster, DRA).changed and cluster.patches == []
    cluster.node["metadata"]["annotations"][N.ANNOTATION_MAINTENANCE_OWNER] = N.MAINTENANCE_OWNER_DEVICE_MODE
    cluster.node["metadata"]["labels"][N.LABEL_AGENTS_PAUSED] = N.MAINTENANCE_OWNER_DEVICE_MODE
    out = run(cluster, DRA)
    assert out.changed and out.resumed
    assert N.LABEL_AGENTS_PAUSED not in cluster.node["metadata"]["labels"]
    assert cluster.node["metadata"]["annotations"] == {}


def test_an_old_mode_still_serving_at_the_timeout_leaves_the_node_held_in_its_old_mode():
    cluster = Cluster(kubelet_zeroes=False)
    clock = iter(range(0, 10 ** 6, 5))
    with pytest.raises(R.SwitchTimeout, match="still served.*device plugin: 4 allocatable.*run the switch again"):
        R.switch(Api(cluster), NODE, DRA, timeout=60, sleep=no_sleep, clock=lambda: float(next(clock)))
    meta = cluster.node["metadata"]
    assert meta["annotations"][N.ANNOTATION_MAINTENANCE_OWNER] == N.MAINTENANCE_OWNER_DEVICE_MODE
    assert N.LABEL_DEVICE_MODE not in meta["labels"] and cluster.node["spec"]["unschedulable"]
    # the kubelet catches up: running again finishes the switch
    cluster.kubelet_zeroes, cluster.zeroing = True, 0
    assert run(cluster, DRA).changed and cluster.settle().by == DRA


def test_a_pod_landing_before_the_cordon_is_caught_after_it():
    cluster = Cluster()
    real = cluster.patch_node

    def patch_and_race(node, body):
        real(node, body)
        if not cluster.pods:
            cluster.pods["late"] = gpu_pod("late")      # scheduled just before the cordon took
    cluster.patch_node = patch_and_race
    with pytest.raises(S.SwitchRefused, match="ml/late"):
        run(cluster, DRA)
    # the hold taken is released again: the node is as it was, but for the new pod
    meta = cluster.node["metadata"]
    assert meta["annotations"] == {} and N.LABEL_DEVICE_MODE not in meta["labels"]
    assert not cluster.node["spec"].get("unschedulable")


def test_a_bad_node_name_or_mode_is_refused_before_any_write():
    cluster = Cluster()
    with pytest.raises(MetaxGpuError, match="not a node name"):
        R.switch(Api(cluster), "a,b", DRA)
    with pytest.raises(MetaxGpuError, match="expected one of"):
        run(cluster, "gpu")
    assert cluster.patches == []
