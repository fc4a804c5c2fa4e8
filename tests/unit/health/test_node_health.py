"""gpu-device applies the health policy: Allocatable, the MetaXGPUHealthy condition, the quarantine taint, Events.

The API server is an in-memory stand-in that applies the patches as the real
one does (strategic merge of conditions by type, JSON patch with a test on
the resourceVersion); the cluster tests (tests/integration/test_gpu_health_cluster.py)
run the same path against the real one.
"""
from __future__ import annotations

import copy
import json

import pytest

from ansible_collections.metax.gpu.plugins.module_utils import names
from ansible_collections.metax.gpu.plugins.module_utils.agents.gpu_device import GpuDeviceAgent
from ansible_collections.metax.gpu.plugins.module_utils.health import node as H
from ansible_collections.metax.gpu.plugins.module_utils.health import policy as P
from ansible_collections.metax.gpu.plugins.module_utils.health.evaluate import Evaluator
from ansible_collections.metax.gpu.plugins.module_utils.health.monitor import HealthMonitor, PolicyFile
from ansible_collections.metax.gpu.plugins.module_utils.health.signals import GpuReading, NodeReading
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator

from ansible_collections.metax.gpu.plugins.module_utils.sim import signals as sim_signals
A = "0000:0a:00.0"


class Raw:
    def __init__(self, doc):
        self.data = json.dumps(doc).encode()

    def release_conn(self):
        pass


class Conflict(Exception):
    status = 409


class FakeApiServer:
    """One Node and the Events; counts writes."""

    def __init__(self, taints=()):
        self.node = {"metadata": {"name": "n1", "resourceVersion": "1"},
                     "spec": {"taints": [dict(t) for t in taints]},
                     "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}}
        self.events = []
        self.writes = 0
        self.fail = None

    def _bump(self):
        self.node["metadata"]["resourceVersion"] = str(int(self.node["metadata"]["resourceVersion"]) + 1)
        self.writes += 1

    def read_node(self, name, _request_timeout=None, _preload_content=True):
        assert name == "n1" and _preload_content is False
        return Raw(self.node)

    def patch_node_status(self, name, body, _request_timeout=None, _content_type=None, _preload_content=True):
        assert _content_type == "application/strategic-merge-patch+json"
        if self.fail:
            raise self.fail
        conditions = self.node["status"]["conditions"]
        for cond in body["status"]["conditions"]:
            conditions[:] = [c for c in conditions if c["type"] != cond["type"]] + [cond]
        self._bump()

    def patch_node(self, name, patch, _request_timeout=None, _content_type=None, _preload_content=True):
        assert _content_type == "application/json-patch+json"
        test, add = patch
        if test["value"] != self.node["metadata"]["resourceVersion"]:
            raise Conflict("the object has been modified")
        assert add["path"] == "/spec/taints"
        self.node["spec"]["taints"] = copy.deepcopy(add["value"])
        self._bump()

    def create_namespaced_event(self, namespace, body, _request_timeout=None):
        assert body["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "n1",
                                          "namespace": namespace}
        self.events.append((body["type"], body["reason"], body["message"]))

    def condition(self):
        return next((c for c in self.node["status"]["conditions"] if c["type"] == names.CONDITION_GPU_HEALTHY), None)

    def our_taints(self):
        return [t for t in self.node["spec"]["taints"] if t["key"] == names.TAINT_GPU_HEALTH]


def reading(at, **values):
    return NodeReading(at, (GpuReading(A, 0, "", values),))


QUARANTINE_AER = P.with_rules(P.Policy(P.DEFAULT_RULES, hold_off_seconds=10, recovery_readings=2),
                              P.Rule("pci-aer-ue", "critical", "quarantine", threshold=1, effect="NoSchedule"))


def run(api, policy, readings, clock):
    ev, writer = Evaluator(policy), H.NodeHealthWriter(api, "n1", "metax-gpu", clock=lambda: clock[0])
    before = None
    for r in readings:
        clock[0] = r.taken_at
        decision = ev.evaluate(r)
        writer.write(decision, before)
        before = decision
    return before


# -- the pure builders ---------------------------------------------------------------
def test_condition_states_and_message():
    ev = Evaluator(QUARANTINE_AER)
    assert H.condition_state(ev.evaluate(reading(0, **{"pci-aer-ce": 0}))) == (
        "True", H.REASON_HEALTHY, "every MetaX GPU passes the health policy")
    status, reason, message = H.condition_state(ev.evaluate(reading(5, **{"pci-aer-ce": 3})))
    assert (status, reason) == ("True", H.REASON_OBSERVED) and "pci-aer-ce=3 [info, observe]" in message
    status, reason, message = H.condition_state(ev.evaluate(reading(6, **{"pci-aer-ce": 3, "eid-driver": 0})))
    status, reason, message = H.condition_state(ev.evaluate(reading(7, **{"pci-aer-ue": 1})))
    assert (status, reason) == ("False", H.REASON_QUARANTINED)
    assert message.startswith("quarantined (metax-tech.com/gpu-health NoSchedule): GPU 0 (0000:0a:00.0) pci-aer-ue=1 "
                              "[critical, quarantine]")


def test_taints_touch_only_our_key():
    admin = {"key": "example.com/maintenance", "value": "x", "effect": "NoSchedule"}
    assert H.taints_after([admin], None, 0) is None
    added = H.taints_after([admin], "NoExecute", 0)
    assert added[0] == admin and added[1]["key"] == names.TAINT_GPU_HEALTH and added[1]["effect"] == "NoExecute"
    assert H.taints_after(added, "NoExecute", 5) is None
    assert H.taints_after(added, "NoSchedule", 5)[1]["effect"] == "NoSchedule"
    assert H.taints_after(added, None, 5) == [admin]


def test_durations():
    assert [H.duration(s) for s in (0, 59, 61, 3725)] == ["0s", "59s", "1m1s", "1h2m5s"]


# -- the writer against the API server -----------------------------------------------------
def test_quarantine_condition_events_and_recovery_naming_the_time_out_of_service():
    admin = {"key": "example.com/maintenance", "value": "x", "effect": "NoSchedule"}
    api = FakeApiServer(taints=[admin])
    clock = [0.0]
    run(api, QUARANTINE_AER, [reading(0, **{"pci-aer-ue": 0})], clock)
    assert api.condition()["status"] == "True" and api.our_taints() == [] and api.events == []
    writes = api.writes
    run(api, QUARANTINE_AER, [reading(5, **{"pci-aer-ue": 0})], clock)
    writes_after_clean = api.writes
    # bad at 10, still bad at 15 and 20 (one transition), clean from 25: 2 clean readings and 10 s after the
    # last bad one at 30
    ev, writer = Evaluator(QUARANTINE_AER), H.NodeHealthWriter(api, "n1", "metax-gpu", clock=lambda: clock[0])
    before = None
    for at, value in ((10, 1), (15, 1), (20, 1), (25, 0), (30, 0), (35, 0)):
        clock[0] = at
        decision = ev.evaluate(reading(at, **{"pci-aer-ue": value}))
        writer.write(decision, before)
        before = decision
        if at == 10:
            assert api.condition()["status"] == "False" and api.condition()["reason"] == H.REASON_QUARANTINED
            assert [t["effect"] for t in api.our_taints()] == ["NoSchedule"]
            assert admin in api.node["spec"]["taints"]
            transition_time = api.condition()["lastTransitionTime"]
        if at == 20:
            assert api.condition()["lastTransitionTime"] == transition_time
    reasons = [e[1] for e in api.events]
    assert reasons == ["GPUHealthSignal", "GPUQuarantined", "GPUHealthRecovered", "GPUQuarantineLifted"]
    assert "recovered after 20s out of service" in api.events[2][2]
    assert "removed after 20s out of service" in api.events[3][2]
    assert api.condition()["status"] == "True" and api.our_taints() == [] and api.node["spec"]["taints"] == [admin]
    # the kubelet's condition untouched; nothing written while nothing changed
    assert api.node["status"]["conditions"][0]["type"] == "Ready"
    assert writes_after_clean == writes
    assert ev.evaluate(reading(40, **{"pci-aer-ue": 0})).transitions == ()


def test_a_conflicting_taint_change_is_retried_not_overwritten():
    api = FakeApiServer()
    ev, writer = Evaluator(QUARANTINE_AER), H.NodeHealthWriter(api, "n1", "metax-gpu", clock=lambda: 0.0)
    real_read = api.read_node

    def read_then_admin_edits(*args, **kwargs):
        raw = real_read(*args, **kwargs)
        api.node["spec"]["taints"].append({"key": "example.com/late", "effect": "NoSchedule"})
        api._bump()
        return raw
    api.read_node = read_then_admin_edits
    decision = ev.evaluate(reading(0, **{"pci-aer-ue": 1}))
    with pytest.raises(Conflict):
        writer.write(decision, None)
    api.read_node = real_read
    writer.write(ev.evaluate(reading(5, **{"pci-aer-ue": 1})), decision)
    assert {t["key"] for t in api.node["spec"]["taints"]} == {"example.com/late", names.TAINT_GPU_HEALTH}


def test_an_event_that_cannot_be_written_does_not_stop_the_condition():
    api = FakeApiServer()

    def refuse(*args, **kwargs):
        raise RuntimeError("events are forbidden")
    api.create_namespaced_event = refuse
    writer = H.NodeHealthWriter(api, "n1", "metax-gpu", clock=lambda: 0.0)
    writer.write(Evaluator(QUARANTINE_AER).evaluate(reading(0, **{"pci-aer-ue": 1})), None)
    assert writer.event_failures == 2 and api.condition()["status"] == "False"


# -- the policy file ----------------------------------------------------------------------
def test_the_policy_file_is_read_again_when_it_changes_and_a_bad_one_keeps_the_policy(tmp_path):
    path = tmp_path / "policy.json"
    pf = PolicyFile(str(path))
    assert not pf.load() and pf.policy is P.DEFAULT_POLICY
    path.write_text(json.dumps({"holdOffSeconds": 7}))
    assert pf.load() and pf.policy.hold_off_seconds == 7
    assert not pf.load()
    path.write_text(json.dumps({"rules": [{"signal": "pci-aer-ce", "rate": 1, "severity": "info",
                                           "action": "quarantine", "effect": "NoSchedule"}]}))
    assert not pf.load() and pf.policy.hold_off_seconds == 7 and "never quarantines" in pf.error
    path.write_text("{not json")
    assert not pf.load() and "not used" in pf.error
    path.unlink()
    assert pf.load() and pf.policy is P.DEFAULT_POLICY


# -- gpu-device end to end on a simulated node ----------------------------------------------
def agent_on(host, policy_path=None):
    agent = GpuDeviceAgent(host, str(host.join("dp")), healthy_interval=5, pod_resources_socket=None,
                           health_policy=policy_path)
    agent.state.refresh()
    return agent


def test_an_uncorrectable_ecc_takes_one_gpu_of_eight_out_and_recovery_brings_it_back(make_node, tmp_path):
    host = make_node("8xC500")
    path = tmp_path / "policy.json"
    path.write_text(json.dumps({"holdOffSeconds": 0, "recoveryReadings": 2}))
    agent = agent_on(host, str(path))
    api = FakeApiServer()
    agent.health_monitor.attach(H.NodeHealthWriter(api, "n1", "metax-gpu", clock=lambda: 0.0))
    assert not agent.apply_health_policy()
    assert len(agent.state.snapshot().healthy_ids) == 8 and api.condition()["status"] == "True"
    bdf = generator.load_state(host)["gpus"][5]["bdf"]
    sim_signals.inject_signals(host, 5, ecc={"dram_uncorrectable": 1})
    assert agent.apply_health_policy()
    snap = agent.state.snapshot()
    assert len(snap.healthy_ids) == 7 and bdf not in snap.healthy_ids
    assert api.condition()["reason"] == H.REASON_FAILING and "ecc-dram-uncorrectable=1" in api.condition()["message"]
    # a rescan keeps it held (discovery alone would call it healthy)
    agent.state.refresh()
    assert len(agent.state.snapshot().healthy_ids) == 7
    # the driver reload / reset zeroes the counter: 2 clean readings
    sim_signals.clear_signals(host, 5)
    assert not agent.apply_health_policy()
    assert agent.apply_health_policy()
    assert len(agent.state.snapshot().healthy_ids) == 8 and api.condition()["status"] == "True"
    assert [e[1] for e in api.events] == ["GPUHealthSignal", "GPUHealthRecovered"]


def test_a_restarted_agent_holds_a_failing_gpu_before_the_kubelet_hears_of_it(make_node):
    # the agent's first offer to the kubelet already leaves out a GPU the policy holds (a pending
    # 8-GPU pod landed on it in the health interval after a restart, on the local cluster)
    host = make_node("8xC500")
    sim_signals.inject_signals(host, 5, ecc={"dram_uncorrectable": 1})
    agent = GpuDeviceAgent(host, str(host.join("dp")), healthy_interval=5, pod_resources_socket=None)
    agent.first_scan()
    snap = agent.state.snapshot()
    assert len(snap.devices) == 8 and len(snap.healthy_ids) == 7
    assert generator.load_state(host)["gpus"][5]["bdf"] not in snap.healthy_ids


def test_the_four_old_checks_still_decide_and_now_reach_the_condition(make_node):
    host = make_node("8xC500")
    agent = agent_on(host)
    api = FakeApiServer()
    agent.health_monitor.attach(H.NodeHealthWriter(api, "n1", "metax-gpu", clock=lambda: 0.0))
    agent.apply_health_policy()
    generator.fail_gpu(host, 2, "bus")
    generator.fail_gpu(host, 4, "smi")
    agent.state.refresh()
    agent.apply_health_policy()
    assert len(agent.state.snapshot().healthy_ids) == 6
    message = api.condition()["message"]
    assert "gpu-lost=1" in message and "gpu-not-available=1" in message
    assert api.condition()["status"] == "False" and api.our_taints() == []


def test_no_write_before_the_api_side_and_a_failing_write_is_retried(make_node):
    host = make_node("1xC500")
    monitor = HealthMonitor(host)
    from ansible_collections.metax.gpu.plugins.module_utils.gpu.discovery import discover
    monitor.step(discover(host, topology=False))
    api = FakeApiServer()
    api.fail = RuntimeError("apiserver away")
    monitor.attach(H.NodeHealthWriter(api, "n1", "metax-gpu", clock=lambda: 0.0))
    monitor.step(discover(host, topology=False))
    assert monitor.write_error and api.condition() is None
    api.fail = None
    monitor.step(discover(host, topology=False))
    assert monitor.write_error is None and api.condition()["status"] == "True"


def test_a_held_gpu_takes_its_vfs_out_and_gives_them_back(make_node):
    host = make_node("2xC550-sriov")
    pf = generator.load_state(host)["gpus"][0]["bdf"]
    host.write_attribute("sys/bus/pci/devices/%s/sriov_numvfs" % pf, "4")
    agent = agent_on(host)
    snap = agent.state.snapshot()
    assert len(snap.devices) == 5 and len(snap.healthy_ids) == 5          # 4 VFs and the other PF
    assert agent.state.hold(frozenset({pf}))
    held = agent.state.snapshot()
    assert sorted(d.id for d in held.devices if not d.healthy) == sorted(d.id for d in held.devices if d.gpu_bdf == pf)
    assert not agent.state.hold(frozenset({pf}))                            # nothing changes twice
    agent.state.refresh()
    assert len(agent.state.snapshot().healthy_ids) == 1                    # a rescan keeps them held
    assert agent.state.hold(frozenset())
    assert len(agent.state.snapshot().healthy_ids) == 5
