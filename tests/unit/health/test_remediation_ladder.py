"""The remediation ladder (issue 42 item 4, docs/health.md "Remediation"): its pure decisions and
driver-manager's procedure against an in-memory API server that applies the patches as the real one
does (merge patch with a resourceVersion precondition, conditions merged by type) and admits only
what the node-agent policy admits for driver-manager (its keys; a cordon only beside the maintenance
record "ours"). The driver reload is the real one on a simulated node root; the budget is
kube/slots.py over the fake Lease API. tests/integration/test_health_ladder_cluster.py runs it on the
local cluster.
"""
from __future__ import annotations

import copy
import json
import os

import pytest
from fake_leases import FakeLeaseApi

from ansible_collections.metax.gpu.plugins.module_utils import names as N
from ansible_collections.metax.gpu.plugins.module_utils.agents import driver_manager as dm
from ansible_collections.metax.gpu.plugins.module_utils.driver import backend
from ansible_collections.metax.gpu.plugins.module_utils.driver.errors import DriverInUseError
from ansible_collections.metax.gpu.plugins.module_utils.driver.reload import reload_driver
from ansible_collections.metax.gpu.plugins.module_utils.health import ladder as L
from ansible_collections.metax.gpu.plugins.module_utils.health import policy as P
from ansible_collections.metax.gpu.plugins.module_utils.health.evaluate import Decision, Finding
from ansible_collections.metax.gpu.plugins.module_utils.health.node import condition as health_condition
from ansible_collections.metax.gpu.plugins.module_utils.health.remediation import Ladder
from ansible_collections.metax.gpu.plugins.module_utils.kube.evict import EvictionError
from ansible_collections.metax.gpu.plugins.module_utils.kube.slots import Slots
from ansible_collections.metax.gpu.plugins.module_utils.maintenance.run import Stale
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator, pkgtool
from ansible_collections.metax.gpu.plugins.module_utils.sim.spec import preset

BDF = "0000:0f:00.0"
ECC_ROW = P.Rule("ecc-dram-uncorrectable", "critical", "device-unhealthy", threshold=1, remediate=True)
OBSERVED_ROW = P.Rule("pci-aer-ce", "info", "observe", rate=1)
OWNED = N.NODE_AGENT_KEYS["driver-manager"]


class Clock:
    def __init__(self, now=1000.0):
        self.now = now

    def __call__(self):
        return self.now


class FakeNodeApi:
    """RemediationApi of one node over a shared dict of Nodes (the API server)."""

    def __init__(self, nodes, name, policy=None):
        self.nodes = nodes
        self.node = name
        self.policy = policy
        self.pods = []
        self.refusals = {}
        self.events = []
        self.restarted = []
        self.requests = 0

    @property
    def obj(self):
        return self.nodes[self.node]

    def _bump(self):
        meta = self.obj["metadata"]
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)

    def read_node(self):
        self.requests += 1
        return copy.deepcopy(self.obj)

    def node_metadata(self):
        return copy.deepcopy(self.obj["metadata"])

    def patch_node(self, labels, annotations):
        self.requests += 1
        self.merge_patch_node({"metadata": {"labels": dict(labels), "annotations": dict(annotations)}})

    def merge_patch_node(self, body):
        """The merge patch, after the node-agent policy's checks for driver-manager."""
        self.requests += 1
        meta, old = body.get("metadata") or {}, copy.deepcopy(self.obj)
        version = meta.get("resourceVersion")
        if version is not None and version != old["metadata"]["resourceVersion"]:
            raise Stale("409 the object has been modified")
        new = copy.deepcopy(old)
        for field in ("labels", "annotations"):
            assert set(meta.get(field) or {}) <= set(OWNED[field]), "not driver-manager's: %s" % meta.get(field)
            have = new["metadata"].setdefault(field, {})
            for key, value in (meta.get(field) or {}).items():
                if value is None:
                    have.pop(key, None)
                else:
                    have[key] = value
        spec = body.get("spec") or {}
        assert set(spec) <= set(OWNED["spec"])
        if "unschedulable" in spec:
            new["spec"]["unschedulable"] = spec["unschedulable"]
        before, after = bool(old["spec"].get("unschedulable")), bool(new["spec"].get("unschedulable"))
        if before != after:
            # the policy: a cordon with the record "ours" beside it, an uncordon only of a cordon recorded ours
            record = (new if after else old)["metadata"].get("annotations", {}).get(N.ANNOTATION_MAINTENANCE_CORDON)
            assert record == N.MAINTENANCE_CORDON_OURS, "the node-agent policy refuses this cordon change"
        self.nodes[self.node] = new
        self._bump()

    def write_condition(self, condition):
        self.requests += 1
        assert condition["type"] in OWNED["conditions"]
        conds = [c for c in self.obj["status"]["conditions"] if c["type"] != condition["type"]]
        self.obj["status"]["conditions"] = conds + [dict(condition)]
        self._bump()

    def node_event(self, reason, message, warning=True):
        self.events.append((reason, message, warning))

    def event(self, reason, message, warning=True):
        self.events.append((reason, message, warning))

    def health_policy(self):
        return None if self.policy is None else json.dumps(self.policy)

    def gpu_pods(self):
        return list(self.pods)

    def evict_gpu_pods(self, timeout):
        evicted = [p for p in self.pods if p not in self.refusals]
        self.pods = [p for p in self.pods if p in self.refusals]
        if self.pods:
            raise EvictionError("pods still on node", self.pods, self.refusals)
        return evicted

    def restart_gpu_device(self, selector=""):
        self.restarted.append(selector)
        return ["gpu-device-x"]

    # -- what gpu-device and the administrator do -------------------------------------
    def health(self, *findings):
        """gpu-device's MetaXGPUHealthy for these (signal, rule) findings (none: healthy)."""
        decision = Decision(0.0, tuple(Finding(BDF, 5, signal, rule, 1, 0.0) for signal, rule in findings))
        cond = health_condition(decision, None, 0.0)
        conds = [c for c in self.obj["status"]["conditions"] if c["type"] != N.CONDITION_GPU_HEALTHY]
        self.obj["status"]["conditions"] = conds + [cond]
        self._bump()

    def admin(self, unschedulable):
        self.obj["spec"]["unschedulable"] = unschedulable
        self._bump()

    # -- reading it back ---------------------------------------------------------------
    def annotations(self):
        return self.obj["metadata"].get("annotations", {})

    def state(self):
        return L.parse_state(self.annotations().get(N.ANNOTATION_HEALTH_REMEDIATION))

    def condition(self):
        return next((c for c in self.obj["status"]["conditions"] if c["type"] == N.CONDITION_GPU_REMEDIATION), None)

    def cordoned(self):
        return bool(self.obj["spec"].get("unschedulable"))

    def reasons(self):
        return [e[0] for e in self.events]


def new_node(name):
    return {"metadata": {"name": name, "resourceVersion": "1", "labels": {}, "annotations": {}},
            "spec": {}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


@pytest.fixture
def sim_root(tmp_path):
    host = generator.create(str(tmp_path / "root"), preset("1xC500"))
    pkgtool.install_tools(host.path, "deb")
    return host


class World:
    """Nodes, their APIs and ladders, one budget pool of Leases, one clock."""

    def __init__(self, host, policy=None, names=("gpu-1",)):
        self.nodes = {n: new_node(n) for n in names}
        self.leases = FakeLeaseApi()
        self.clock = Clock()
        self.host = host
        self.apis = {n: FakeNodeApi(self.nodes, n, policy) for n in names}
        self.reloads = []
        self.ladders = {n: self.ladder(n) for n in names}

    def ladder(self, name):
        api = self.apis[name]

        def reload():
            self.reloads.append(name)
            # the real in-use-safe reload on the simulated root; the pods the API lists refuse it
            return reload_driver(self.host, backend.NodeCommands(self.host), api.gpu_pods())
        return Ladder(api, name, self.host, reload,
                      lambda size: Slots(self.leases, "metax-operator", N.HEALTH_SLOT_PREFIX, size, name,
                                         clock=self.clock), clock=self.clock)

    def round(self, name):
        return self.ladders[name].round(self.apis[name].read_node())

    def holders(self):
        return sorted(lease["spec"]["holderIdentity"] for lease in self.leases.leases.values())


@pytest.fixture
def world(sim_root):
    made = []

    def make(**kwargs):
        w = World(sim_root, **kwargs)
        made.append(w)
        return w
    yield make
    for w in made:
        for ladder in w.ladders.values():
            if ladder._budget is not None:
                ladder._budget.release()


# -- the pure parts ---------------------------------------------------------------------------------
def test_remediating_reads_only_the_marked_findings_of_a_false_condition():
    decision = Decision(0.0, (Finding(BDF, 5, "ecc-dram-uncorrectable", ECC_ROW, 2, 0.0),
                              Finding("0000:0a:00.0", 0, "pci-aer-ce", OBSERVED_ROW, 9, 0.0)))
    cond = health_condition(decision, None, 0.0)
    assert "[critical, device-unhealthy, remediate]" in cond["message"]
    assert L.remediating(cond) == ("GPU 5 (%s) ecc-dram-uncorrectable=2" % BDF,)
    assert L.remediating(dict(cond, status="True")) == ()
    assert L.remediating(None) == ()
    quarantined = Decision(0.0, (Finding(BDF, 5, "pci-mmio", P.Rule("pci-mmio", "critical", "quarantine", threshold=1,
                                                                    effect="NoExecute", remediate=True), 1, 0.0),))
    assert L.remediating(health_condition(quarantined, None, 0.0)) == ("GPU 5 (%s) pci-mmio=1" % BDF,)


def test_a_long_message_still_names_the_remediating_findings():
    many = tuple(Finding("0000:%02x:00.0" % i, i, "pci-mmio", P.Rule("pci-mmio", "critical", "quarantine", threshold=1,
                                                                     effect="NoSchedule"), 1, 0.0) for i in range(40))
    decision = Decision(0.0, many + (Finding(BDF, 63, "ecc-dram-uncorrectable", ECC_ROW, 1, 0.0),))
    cond = health_condition(decision, None, 0.0)
    assert cond["message"].endswith("(41 in all)")
    assert L.remediating(cond) == ("GPU 63 (%s) ecc-dram-uncorrectable=1" % BDF,)


def test_the_state_round_trips_and_a_bad_annotation_starts_again():
    state = L.State(L.EVICT, L.RESULT_RUNNING, 1.0, 2.0, "ours", "", ("GPU 5 (x) s=1",)).record("cordon: cordoned")
    assert L.parse_state(state.to_json()) == state
    assert L.parse_state("{not json") is None and L.parse_state('{"step": "dance"}') is None
    assert L.parse_state(None) is None


SETTINGS = P.Remediation(max_nodes=1, evict_timeout_seconds=60, settle_seconds=120)
FINDING = ("GPU 5 (x) ecc-dram-uncorrectable=1",)


@pytest.mark.parametrize("state, facts, action", [
    (None, L.Facts(0, (), False, None), L.NONE),
    (None, L.Facts(0, FINDING, False, None), L.START),
    (None, L.Facts(0, FINDING, True, None), L.START),                     # an admin's cordon: held, kept
    (None, L.Facts(0, FINDING, False, "set-vfnum"), L.WAIT),              # another procedure's node
    (L.State(L.CORDON), L.Facts(0, FINDING, True, "health"), L.EVICT),
    (L.State(L.EVICT, since=0), L.Facts(10, FINDING, True, "health", ("a/p",)), L.EVICT),
    (L.State(L.EVICT, since=0), L.Facts(10, FINDING, True, "health"), L.DRIVER_RELOAD),
    (L.State(L.EVICT, since=0), L.Facts(60, FINDING, True, "health", ("a/p",)), L.REBOOT_REQUEST),
    (L.State(L.DRIVER_RELOAD, L.RESULT_OK, since=0), L.Facts(100, FINDING, True, "health"), L.WAIT),
    (L.State(L.DRIVER_RELOAD, L.RESULT_OK, since=0), L.Facts(120, FINDING, True, "health"), L.REBOOT_REQUEST),
    (L.State(L.DRIVER_RELOAD, L.RESULT_FAILED, since=0), L.Facts(1, FINDING, True, "health"), L.REBOOT_REQUEST),
    (L.State(L.REBOOT_REQUEST), L.Facts(1, FINDING, True, "health"), L.WAIT),
    (L.State(L.EVICT), L.Facts(1, (), True, "health"), L.RECOVER),       # healthy after a step: stop climbing
    (L.State(L.EVICT), L.Facts(1, FINDING, False, "health"), L.STOP),    # the administrator uncordoned
    (L.State(L.EVICT), L.Facts(1, FINDING, True, None), L.STOP),         # the hold was removed
    (L.State(L.EVICT, stopped="x"), L.Facts(1, FINDING, False, None), L.NONE),
    (L.State(L.EVICT, stopped="x"), L.Facts(1, (), False, None), L.RECOVER),
], ids=lambda v: v if isinstance(v, str) else None)
def test_decide(state, facts, action):
    assert L.decide(state, facts, SETTINGS).action == action


def test_the_policy_document_carries_the_remediation_settings():
    policy = P.parse_policy({"remediation": {"maxNodes": 2, "settleSeconds": 0, "rebootSentinel": "/var/run/reboot-required"},
                             "rules": [{"signal": "ecc-dram-uncorrectable", "threshold": 1, "severity": "critical",
                                        "action": "device-unhealthy", "remediate": True}]})
    assert policy.remediation == P.Remediation(2, P.DEFAULT_EVICT_TIMEOUT, 0, "var/run/reboot-required")
    assert policy.rules_of("ecc-dram-uncorrectable")[0].remediate
    assert P.parse_policy(P.policy_document(policy)) == policy
    assert P.DEFAULT_POLICY.remediation == P.Remediation(1, 300, 600, "")
    for row in ({"signal": "pci-aer-ce", "rate": 1, "severity": "info", "action": "observe", "remediate": True},
                {"signal": "pci-aer-ue", "threshold": 1, "severity": "info", "action": "device-unhealthy",
                 "remediate": True}):
        with pytest.raises(P.PolicyError, match="remediate needs a row that fails the node condition"):
            P.parse_policy({"rules": [row]})
    for bad, words in (({"maxNodes": 0}, "maxNodes must be 1 or more"), ({"speed": 1}, "remediation holds"),
                       ({"rebootSentinel": "../etc/x"}, "under the host root"), ({"maxNodes": "2"}, "whole number")):
        with pytest.raises(P.PolicyError, match=words):
            P.parse_policy({"remediation": bad})


def test_the_reload_is_refused_while_a_gpu_is_in_use_and_reloads_an_idle_driver(sim_root):
    cmds = backend.NodeCommands(sim_root)
    with pytest.raises(DriverInUseError, match="pod ns/job requests"):
        reload_driver(sim_root, cmds, ["ns/job"])
    sim_root.write_file_atomic("sys/module/metax/refcnt", b"1\n")
    with pytest.raises(DriverInUseError, match="refcnt 1"):
        reload_driver(sim_root, cmds, [])
    sim_root.write_file_atomic("sys/module/metax/refcnt", b"0\n")
    version = sim_root.read_attribute("sys/module/metax/version")
    assert reload_driver(sim_root, cmds, []) == "driver %s reloaded, verified" % version
    assert sim_root.read_attribute("sys/module/metax/version") == version and sim_root.exists("dev/mxcd")


# -- the procedure ------------------------------------------------------------------------------------
def test_idle_the_ladder_makes_no_request(world):
    w = world()
    api = w.apis["gpu-1"]
    api.health((("pci-aer-ce", OBSERVED_ROW)))
    node = api.read_node()
    before = api.requests
    assert w.ladders["gpu-1"].round(node) == L.NONE
    assert api.requests == before and api.condition() is None and api.events == []


def test_the_ladder_climbs_cordon_evict_reload_and_recovery_uncordons(world):
    w = world(policy={"remediation": {"settleSeconds": 300}})
    api = w.apis["gpu-1"]
    api.pods = ["team/train-0"]
    api.health(("ecc-dram-uncorrectable", ECC_ROW))
    w.round("gpu-1")
    # cordoned through the protocol, the GPU pod evicted, the driver reloaded: one round, each step's result seen
    assert api.cordoned()
    ann = api.annotations()
    assert ann[N.ANNOTATION_MAINTENANCE_OWNER] == "health" and ann[N.ANNOTATION_MAINTENANCE_CORDON] == "ours"
    assert api.pods == [] and w.reloads == ["gpu-1"] and api.restarted
    state = api.state()
    assert (state.step, state.result, state.cordon) == (L.DRIVER_RELOAD, L.RESULT_OK, "ours")
    assert [h.split(":")[0] for h in state.history] == ["cordon", "evict", "driver-reload"]
    assert api.reasons()[:3] == ["GPURemediationCordon", "GPURemediationEvict", "GPURemediationDriverReload"]
    cond = api.condition()
    assert (cond["status"], cond["reason"]) == ("True", "DriverReloaded")
    assert "evict: evicted team/train-0" in cond["message"] and "ecc-dram-uncorrectable=1" in cond["message"]
    assert w.holders() == ["gpu-1"]
    # within the settle time the ladder waits; gpu-device then reads it healthy (after M clean readings)
    w.clock.now += 100
    assert w.round("gpu-1") == L.WAIT and w.reloads == ["gpu-1"]
    api.health()
    w.clock.now += 25
    assert w.round("gpu-1") == L.RECOVER
    assert not api.cordoned()
    assert not set(api.annotations()) & {N.ANNOTATION_MAINTENANCE_OWNER, N.ANNOTATION_MAINTENANCE_CORDON,
                                         N.ANNOTATION_HEALTH_REMEDIATION, N.ANNOTATION_REBOOT_REQUIRED}
    cond = api.condition()
    assert (cond["status"], cond["reason"]) == ("False", "Recovered")
    assert "after 2m5s in remediation; uncordoned" in cond["message"]
    assert api.reasons()[-1] == "GPURemediationRecovered" and w.holders() == []
    assert w.round("gpu-1") == L.NONE


def test_still_failing_after_the_settle_time_the_reboot_is_requested(world, sim_root):
    w = world(policy={"remediation": {"settleSeconds": 60, "rebootSentinel": "var/run/reboot-required"}})
    api = w.apis["gpu-1"]
    api.health(("ecc-dram-uncorrectable", ECC_ROW))
    w.round("gpu-1")
    w.clock.now += 61
    assert w.round("gpu-1") == L.REBOOT_REQUEST
    assert api.annotations()[N.ANNOTATION_REBOOT_REQUIRED].endswith("Z")
    assert sim_root.exists("var/run/reboot-required")
    assert (api.condition()["reason"], api.state().step) == ("RebootRequested", L.REBOOT_REQUEST)
    assert "still failing 61 s after the driver reload" in api.condition()["message"]
    w.clock.now += 600
    assert w.round("gpu-1") == L.WAIT and api.reasons().count("GPURemediationRebootRequest") == 1
    api.health()       # the node came back healthy
    w.round("gpu-1")
    assert N.ANNOTATION_REBOOT_REQUIRED not in api.annotations() and not sim_root.exists("var/run/reboot-required")
    assert not api.cordoned()


def test_an_administrators_cordon_is_kept_throughout(world):
    w = world()
    api = w.apis["gpu-1"]
    api.admin(True)
    api.health(("ecc-dram-uncorrectable", ECC_ROW))
    w.round("gpu-1")
    assert api.annotations()[N.ANNOTATION_MAINTENANCE_CORDON] == "admin" and api.state().cordon == "admin"
    assert "the administrator's cordon kept" in api.condition()["message"]
    api.health()
    w.round("gpu-1")
    assert api.cordoned()                                  # never lifted by the ladder
    assert "the administrator's cordon kept" in api.condition()["message"]
    assert N.ANNOTATION_MAINTENANCE_OWNER not in api.annotations()


def test_an_administrators_uncordon_stops_the_ladder_for_the_incident(world):
    w = world(policy={"remediation": {"settleSeconds": 600}})
    api = w.apis["gpu-1"]
    api.health(("ecc-dram-uncorrectable", ECC_ROW))
    w.round("gpu-1")
    api.admin(False)                                       # the administrator wants it in service
    assert w.round("gpu-1") == L.STOP
    assert not api.cordoned() and N.ANNOTATION_MAINTENANCE_OWNER not in api.annotations()
    assert api.state().stopped and api.condition()["reason"] == "RemediationStopped" and w.holders() == []
    for _round in range(3):                                # still failing: never cordoned again
        w.clock.now += 1000
        assert w.round("gpu-1") == L.NONE
    assert not api.cordoned() and api.reasons().count("GPURemediationCordon") == 1
    api.health()                                           # the incident ends ...
    w.round("gpu-1")
    assert N.ANNOTATION_HEALTH_REMEDIATION not in api.annotations()
    api.health(("ecc-dram-uncorrectable", ECC_ROW))        # ... a new one climbs again
    w.round("gpu-1")
    assert api.cordoned() and api.reasons().count("GPURemediationCordon") == 2


def test_an_uncordon_after_the_reboot_request_withdraws_it(world, sim_root):
    w = world(policy={"remediation": {"settleSeconds": 0, "rebootSentinel": "var/run/reboot-required"}})
    api = w.apis["gpu-1"]
    api.health(("ecc-dram-uncorrectable", ECC_ROW))
    assert w.round("gpu-1") == L.REBOOT_REQUEST and sim_root.exists("var/run/reboot-required")
    api.admin(False)
    assert w.round("gpu-1") == L.STOP
    assert N.ANNOTATION_REBOOT_REQUIRED not in api.annotations() and not sim_root.exists("var/run/reboot-required")
    events = len(api.events)
    w.round("gpu-1")
    assert len(api.events) == events                         # stopped: no Event per round


def test_two_nodes_failing_with_a_budget_of_one_the_second_waits(world):
    w = world(names=("gpu-1", "gpu-2"))
    for name in ("gpu-1", "gpu-2"):
        w.apis[name].health(("ecc-dram-uncorrectable", ECC_ROW))
    w.round("gpu-1")
    assert w.round("gpu-2") == L.START
    second = w.apis["gpu-2"]
    assert not second.cordoned() and second.state() is None and w.reloads == ["gpu-1"]
    assert second.condition()["reason"] == "RemediationWaiting" and "held by gpu-1" in second.condition()["message"]
    w.round("gpu-2")
    assert second.reasons() == ["GPURemediationWaiting"]      # said once
    w.apis["gpu-1"].health()
    w.round("gpu-1")                                          # the first recovers: its slot is free
    w.round("gpu-2")
    assert second.cordoned() and w.reloads == ["gpu-1", "gpu-2"] and w.holders() == ["gpu-2"]


def test_a_refused_eviction_waits_then_the_reboot_request_without_a_reload(world):
    w = world(policy={"remediation": {"evictTimeoutSeconds": 120}})
    api = w.apis["gpu-1"]
    api.pods = ["team/serve-0"]
    api.refusals = {"team/serve-0": "Cannot evict pod as it would violate the pod's disruption budget."}
    api.health(("ecc-dram-uncorrectable", ECC_ROW))
    w.round("gpu-1")
    assert api.state().step == L.EVICT and api.condition()["reason"] == "EvictingGPUPods"
    assert "disruption budget" in api.condition()["message"]
    w.clock.now += 60
    w.round("gpu-1")
    assert api.state().step == L.EVICT
    w.clock.now += 61
    assert w.round("gpu-1") == L.REBOOT_REQUEST and w.reloads == []
    assert "still on the node 121 s after their eviction" in api.condition()["message"]


def test_a_failed_reload_goes_to_the_reboot_request(world, sim_root):
    w = world()
    api = w.apis["gpu-1"]
    sim_root.write_file_atomic("sys/module/metax/refcnt", b"2\n")       # a process holds the driver
    api.health(("ecc-dram-uncorrectable", ECC_ROW))
    assert w.round("gpu-1") == L.REBOOT_REQUEST
    history = api.state().history
    assert history[2].startswith("driver-reload: failed: the MetaX driver is in use") and api.restarted == []
    assert ("GPURemediationDriverReload", history[2], True) in api.events


def test_a_node_another_procedure_holds_is_left_alone(world):
    w = world()
    api = w.apis["gpu-1"]
    api.obj["metadata"]["annotations"][N.ANNOTATION_MAINTENANCE_OWNER] = "set-vfnum"
    api.health(("ecc-dram-uncorrectable", ECC_ROW))
    assert w.round("gpu-1") == L.WAIT
    assert not api.cordoned() and w.holders() == [] and "held by set-vfnum" in api.condition()["message"]


def test_a_new_driver_manager_pod_resumes_the_incident(world):
    w = world()
    api = w.apis["gpu-1"]
    api.pods = ["team/a"]
    api.refusals = {"team/a": "budget"}
    api.health(("ecc-dram-uncorrectable", ECC_ROW))
    w.round("gpu-1")
    w.ladders["gpu-1"]._budget.release()           # the pod's Lease gone with it ...
    w.ladders["gpu-1"] = w.ladder("gpu-1")         # ... a new pod, a new ladder object
    api.refusals = {}
    w.round("gpu-1")
    assert api.state().step == L.DRIVER_RELOAD and api.reasons().count("GPURemediationCordon") == 1
    assert w.holders() == ["gpu-1"]


def test_driver_managers_node_watch_wakes_on_a_remediating_finding():
    watched = dm.NodeWatched()
    node = new_node("gpu-1")
    assert watched.changed({"type": "ADDED", "object": node})
    assert not watched.changed({"type": "MODIFIED", "object": node})
    api = FakeNodeApi({"gpu-1": node}, "gpu-1")
    api.health(("ecc-dram-uncorrectable", ECC_ROW))
    assert watched.changed({"type": "MODIFIED", "object": api.obj})
    api.health(("pci-aer-ce", OBSERVED_ROW))
    assert watched.changed({"type": "MODIFIED", "object": api.obj})


def test_the_sentinel_path_stays_under_the_host_root():
    assert os.path.normpath(P.parse_policy({"remediation": {"rebootSentinel": "/var/run/x"}}).remediation
                            .reboot_sentinel) == "var/run/x"
    # a ConfigMap or CR value naming a path out of the host root is refused, the policy unparsed
    for hostile in ("../etc/shadow", "var/../../etc/passwd", "/var/run/..", 7):
        with pytest.raises(P.PolicyError, match="rebootSentinel"):
            P.parse_policy({"remediation": {"rebootSentinel": hostile}})


class DriverManagerKube(FakeNodeApi):
    """What driver-manager's round asks of its Kube, over the same in-memory Node."""

    def __init__(self, nodes, name, leases, policy=None):
        super().__init__(nodes, name, policy)
        self.leases = leases
        self.config_version = "1"
        self.last_node = None

    def config(self):
        return {}

    def node_metadata(self):
        self.last_node = self.read_node()
        return self.last_node["metadata"]

    def vfnum_slots(self, size):
        return Slots(self.leases, "metax-operator", dm.VFNUM_SLOT_PREFIX, size, self.node)

    def health_slots(self, size):
        return Slots(self.leases, "metax-operator", N.HEALTH_SLOT_PREFIX, size, self.node)


def test_driver_managers_round_climbs_the_ladder_with_the_node_it_read(tmp_path, sim_root):
    leases = FakeLeaseApi()
    kube = DriverManagerKube({"gpu-1": new_node("gpu-1")}, "gpu-1", leases)
    mgr = dm.Manager(sim_root, kube, "Never", str(tmp_path / "payload"), None, str(tmp_path / "ready"))
    mgr.driver.verify_pause = 0.0
    kube.pods = ["team/train-0"]
    assert mgr.round()
    assert not kube.cordoned() and kube.condition() is None          # healthy: the ladder made no request
    kube.health(("ecc-dram-uncorrectable", ECC_ROW))
    assert mgr.round()
    assert kube.cordoned() and kube.pods == [] and kube.state().step == L.DRIVER_RELOAD
    assert kube.state().result == L.RESULT_OK and sim_root.exists("dev/mxcd")
    kube.health()
    assert mgr.round()
    assert not kube.cordoned() and kube.condition()["reason"] == "Recovered"
    mgr.ladder._budget.release()
