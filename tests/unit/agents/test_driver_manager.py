"""driver-manager's rounds on simulated node roots: the real package tools and kernel hook of the
simulator, the real backend code of metax.gpu.driver and metax.gpu.vfnum; the API calls are recorded
(tests/integration/test_driver_manager_cluster.py runs them against the local cluster)."""
from __future__ import annotations

import json
import os
import threading
from types import SimpleNamespace
from typing import Dict, List, Optional

import pytest
from fake_leases import FakeLeaseApi

from ansible_collections.metax.gpu.plugins.module_utils import names as N
from ansible_collections.metax.gpu.plugins.module_utils.agents import driver_manager as dm
from ansible_collections.metax.gpu.plugins.module_utils.driver import backend, node_upgrade, policy
from ansible_collections.metax.gpu.plugins.module_utils.host import HostRoot
from ansible_collections.metax.gpu.plugins.module_utils.kube.evict import EvictionError
from ansible_collections.metax.gpu.plugins.module_utils.kube.slots import Slots
from ansible_collections.metax.gpu.plugins.module_utils.nodeapi import GPU_DEVICE_SELECTOR, NodeApi
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator, pkgtool
from ansible_collections.metax.gpu.plugins.module_utils.sim.spec import preset
from ansible_collections.metax.gpu.plugins.module_utils.vfnum import backend as vfnum_backend
from ansible_collections.metax.gpu.plugins.module_utils.vfnum.plan import plan as vfnum_plan
from ansible_collections.metax.gpu.plugins.module_utils.vfnum.reconcile import VfnumPolicy

PAYLOAD = "2.99.1"


class Recorder(NodeApi):
    """The Kube surface driver-manager uses (the procedures' NodeApi, plus the round's config and
    slots), recording what it would send."""

    def __init__(self, node: str, data: Dict[str, str], leases=None) -> None:
        self.node = node
        self.data = data
        self.config_version: Optional[str] = None   # Kube's: the resourceVersion config() read (None: unknown)
        self.pods: List[str] = []           # GPU pods on the node (namespace/name)
        self.refusals: Dict[str, str] = {}  # pod -> a PodDisruptionBudget's refusal of its eviction
        self.evictions: List[List[str]] = []
        self.leases = leases if leases is not None else FakeLeaseApi()
        self.patches: List[dict] = []
        self.events: List[tuple] = []
        self.restarts = 0
        self.restarted: List[str] = []      # the label selectors of the pods deleted
        # the Node's metadata as the API server would hold it after the patches
        self.node_labels: Dict[str, str] = {}
        self.node_annotations: Dict[str, str] = {}

    def config(self):
        return self.data

    def node_metadata(self):
        return {"labels": dict(self.node_labels), "annotations": dict(self.node_annotations)}

    def start_upgrade(self, target):
        """What the controller's start patch puts on the node (clusteroperator/driver_rollout.start_patch)."""
        self.node_labels[N.LABEL_DRIVER_UPGRADE_STATE] = N.DRIVER_UPGRADE_REQUIRED
        self.node_annotations[N.ANNOTATION_DRIVER_UPGRADE_TARGET] = target

    def patch_node(self, labels, annotations):
        # what the node-agent admission policy lets driver-manager's service account write
        allowed = N.NODE_AGENT_KEYS["driver-manager"]
        assert set(labels) <= set(allowed["labels"]) and set(annotations) <= set(allowed["annotations"])
        self.patches.append({"labels": dict(labels), "annotations": dict(annotations)})
        for have, change in ((self.node_labels, labels), (self.node_annotations, annotations)):
            for key, value in change.items():
                if value is None:
                    have.pop(key, None)
                else:
                    have[key] = value

    def gpu_pods(self):
        return list(self.pods)

    def evict_gpu_pods(self, timeout):
        """kube/evict.evict's outcome: pods a budget refuses stay, the others leave."""
        self.evictions.append(list(self.pods))
        evicted = [p for p in self.pods if p not in self.refusals]
        self.pods = [p for p in self.pods if p in self.refusals]
        if self.pods:
            raise EvictionError("pods still on node", self.pods, self.refusals)
        return evicted

    def vfnum_slots(self, size):
        return Slots(self.leases, "metax-operator", dm.VFNUM_SLOT_PREFIX, size, self.node)

    def slot_holders(self):
        return sorted(lease["spec"]["holderIdentity"] for lease in self.leases.leases.values())

    def restart_gpu_device(self, selector=GPU_DEVICE_SELECTOR):
        self.restarts += 1
        self.restarted.append(selector)
        return ["gpu-device-x"]

    def event(self, reason, message, warning=True):
        self.events.append((reason, message, warning))

    def label(self, key):
        value = None
        for patch in self.patches:
            if key in patch["labels"]:
                value = patch["labels"][key]
        return value

    def annotation(self, key):
        value = None
        for patch in self.patches:
            if key in patch["annotations"]:
                value = patch["annotations"][key]
        return value


def payload(tmp_path, version=PAYLOAD, broken=(), kmd=None, layouts=("deb", "rpm", "run")):
    """The payload image's /payload (sim.pkgtool.make_payload): ``kmd``, the kernel driver it declares."""
    root = tmp_path / ("payload-" + version)
    return pkgtool.make_payload(str(root), version, kmd, layouts=layouts, broken=broken)


def node(tmp_path, preset_name="1xC500", kind="deb", driver=True, os_release="ID=debian\n"):
    host = generator.create(str(tmp_path / "root"), preset(preset_name))
    pkgtool.install_tools(host.path, kind)
    os.makedirs(host.join("etc"), exist_ok=True)
    with open(host.join("etc/os-release"), "w") as handle:
        handle.write(os_release)
    if not driver:
        generator.unload_driver(host)
        assert pkgtool.main("dpkg" if kind == "deb" else "rpm",
                            ["--purge" if kind == "deb" else "-e", "metax-driver"], host.path) == 0
    return host


def manager(tmp_path, host, pol="IfNotPresent", data=None, version=PAYLOAD, broken=(), kube=None,
            vfnum_policy=VfnumPolicy(), kmd=None, layouts=("deb", "rpm", "run")):
    kube = kube or Recorder("n1", data or {})
    mgr = dm.Manager(host, kube, pol, payload(tmp_path, version, broken, kmd, layouts), version,
                     str(tmp_path / "ready"), vfnum_policy=vfnum_policy)
    mgr.driver.verify_pause = 0.0
    return mgr, kube


def loaded(host: HostRoot):
    return host.read_attribute("sys/module/metax/version", default="") or None


@pytest.mark.parametrize("kind, release", [("deb", "ID=ubuntu\nID_LIKE=debian\n"), ("rpm", 'ID="openEuler"\n')])
def test_if_not_present_installs_the_payload_for_the_nodes_os_on_a_node_without_driver(tmp_path, kind, release):
    host = node(tmp_path, kind=kind, driver=False, os_release=release)
    assert loaded(host) is None
    mgr, kube = manager(tmp_path, host, data={"module-params": "vf_mode=1", "node-module-params": "n1: 'dbg=2'"})
    assert mgr.round()
    assert loaded(host) == PAYLOAD
    assert pkgtool._load_db(host)["metax-driver"]["kind"] == kind      # the node's own tool installed it
    staged = os.listdir(host.join(policy.NODE_CACHE + "/" + PAYLOAD))
    assert sorted(f.rsplit(".", 1)[1] for f in staged) == sorted([kind, "run"])
    assert kube.label(N.LABEL_DRIVER_MODE) == "cloud"
    assert os.path.exists(str(tmp_path / "ready"))                     # verified: the probe passes
    assert host.read_text("sys/module/metax/parameters/vf_mode").strip() == "1"
    assert host.read_text("sys/module/metax/parameters/dbg").strip() == "2"
    assert kube.restarts == 1 and kube.events[0][0] == "DriverInstalled"
    # the next round changes nothing
    assert mgr.round() and kube.restarts == 1 and loaded(host) == PAYLOAD


def test_an_administrators_driver_is_left_alone_by_if_not_present_and_never(tmp_path):
    host = node(tmp_path)
    before = loaded(host)
    for pol in ("IfNotPresent", "Never"):
        mgr, kube = manager(tmp_path, host, pol)
        assert mgr.round()
        assert loaded(host) == before and not host.exists(policy.OWNER_RECORD)
        assert kube.label(N.LABEL_DRIVER_MODE) == "native" and kube.restarts == 0
        assert os.path.exists(str(tmp_path / "ready"))


def test_always_refuses_a_driver_in_use_with_an_event_and_the_node_message_once(tmp_path):
    host = node(tmp_path)
    before = loaded(host)
    with open(host.join("sys/module/metax/refcnt"), "w") as handle:
        handle.write("1\n")
    mgr, kube = manager(tmp_path, host, "Always")
    # a loaded driver is replaced only by the rolling upgrade: a round alone leaves it
    assert mgr.round() and loaded(host) == before and kube.label(N.LABEL_DRIVER_MODE) == "native"
    kube.start_upgrade(PAYLOAD)
    assert not mgr.round()
    assert loaded(host) == before
    assert "in use" in kube.annotation(N.ANNOTATION_DRIVER_MESSAGE)
    assert [e[0] for e in kube.events] == ["DriverFailed"]
    assert not mgr.round()
    assert len(kube.events) == 1                 # the same failure is reported once, not every round
    assert kube.node_labels[N.LABEL_DRIVER_UPGRADE_STATE] == N.DRIVER_UPGRADE_REQUIRED   # still to do
    with open(host.join("sys/module/metax/refcnt"), "w") as handle:
        handle.write("0\n")
    assert mgr.round()
    assert loaded(host) == PAYLOAD and kube.annotation(N.ANNOTATION_DRIVER_MESSAGE) is None
    assert kube.node_labels[N.LABEL_DRIVER_UPGRADE_STATE] == N.DRIVER_UPGRADE_DONE


OLD = "2.98.0"


def cloud_node(tmp_path, kube=None):
    """A node whose driver OLD driver-manager installed from its payload (so OLD is in the node's cache)."""
    host = node(tmp_path, driver=False)
    first, kube = manager(tmp_path, host, version=OLD, kube=kube)
    assert first.round() and loaded(host) == OLD and kube.label(N.LABEL_DRIVER_MODE) == "cloud"
    kube.patches.clear()
    kube.events.clear()
    kube.restarted.clear()
    return host, kube


@pytest.mark.parametrize("pol", ["IfNotPresent", "Always", "PreferCloud"])
def test_a_new_payload_waits_for_upgrade_required_then_installs_verifies_and_reports_done(tmp_path, pol):
    host, kube = cloud_node(tmp_path)
    mgr, kube = manager(tmp_path, host, pol, kube=kube)
    assert mgr.round() and mgr.round()
    assert loaded(host) == OLD and kube.label(N.LABEL_DRIVER_UPGRADE_STATE) is None
    assert os.path.exists(str(tmp_path / "ready"))          # the old driver stays ready meanwhile
    kube.start_upgrade(PAYLOAD)
    assert mgr.round()
    assert loaded(host) == PAYLOAD
    states = [p["labels"][N.LABEL_DRIVER_UPGRADE_STATE] for p in kube.patches
              if N.LABEL_DRIVER_UPGRADE_STATE in p["labels"]]
    assert states == [node_upgrade.UPGRADE_STATE_INSTALLED, N.DRIVER_UPGRADE_DONE]
    # the devices and the version labels come back at once: gpu-device and gpu-label recreated
    assert kube.restarted == [node_upgrade.DRIVER_READERS_SELECTOR]
    assert kube.events[-1][0] == "DriverUpgraded" and "%s -> %s" % (OLD, PAYLOAD) in kube.events[-1][1]
    assert os.path.exists(str(tmp_path / "ready")) and not host.exists(node_upgrade.UPGRADE_RECORD)
    assert kube.node_labels[N.LABEL_DRIVER_MODE] == "cloud"
    # done is the controller's to finish: the next rounds change nothing
    assert mgr.round() and kube.restarted == [node_upgrade.DRIVER_READERS_SELECTOR] and loaded(host) == PAYLOAD


def test_a_pod_of_another_payload_leaves_the_upgrade_to_its_successor(tmp_path):
    host, kube = cloud_node(tmp_path)
    stale, kube = manager(tmp_path, host, "Always", version=OLD, kube=kube)
    kube.start_upgrade(PAYLOAD)                # the controller wants PAYLOAD; this pod carries OLD
    assert stale.round()
    assert loaded(host) == OLD and kube.node_labels[N.LABEL_DRIVER_UPGRADE_STATE] == N.DRIVER_UPGRADE_REQUIRED
    assert kube.restarted == []
    fresh, kube = manager(tmp_path, host, "Always", kube=kube)
    assert fresh.round() and loaded(host) == PAYLOAD
    assert kube.node_labels[N.LABEL_DRIVER_UPGRADE_STATE] == N.DRIVER_UPGRADE_DONE


def test_a_failed_validation_rolls_back_and_leaves_failed_with_the_reason(tmp_path):
    host, kube = cloud_node(tmp_path)
    mgr, kube = manager(tmp_path, host, "Always", broken=("deb",), kube=kube)
    kube.start_upgrade(PAYLOAD)
    mgr.round()
    assert loaded(host) == OLD                                   # the previous driver is back
    assert kube.node_labels[N.LABEL_DRIVER_UPGRADE_STATE] == "failed"
    message = kube.node_annotations[N.ANNOTATION_DRIVER_UPGRADE_MESSAGE]
    assert "/dev/mxcd missing" in message and "rolled back to " + OLD in message
    assert kube.events[-1][0] == "DriverUpgradeFailed"
    assert os.path.exists(str(tmp_path / "ready"))              # the old driver verifies again
    assert not host.exists(node_upgrade.UPGRADE_RECORD)
    # failed is the administrator's: no retry, no change, round after round
    patches = len(kube.patches)
    assert mgr.round() and mgr.round()
    assert loaded(host) == OLD and len(kube.patches) - patches <= 2   # driver.mode refreshed only
    assert kube.node_labels[N.LABEL_DRIVER_UPGRADE_STATE] == "failed"


def test_an_administrators_driver_without_its_package_is_not_rolled_back_but_says_so(tmp_path):
    host = node(tmp_path)                   # the administrator's driver: no package of it in the payload cache
    before = loaded(host)
    mgr, kube = manager(tmp_path, host, "Always", broken=("deb",))
    kube.start_upgrade(PAYLOAD)
    mgr.round()
    assert kube.node_labels[N.LABEL_DRIVER_UPGRADE_STATE] == "failed"
    assert "not rolled back (no package of %s" % before in kube.node_annotations[N.ANNOTATION_DRIVER_UPGRADE_MESSAGE]


def test_a_restarted_pod_resumes_an_upgrade_half_way_and_knows_what_to_roll_back_to(tmp_path):
    host, kube = cloud_node(tmp_path)
    mgr, kube = manager(tmp_path, host, "IfNotPresent", broken=("deb",), kube=kube)
    kube.start_upgrade(PAYLOAD)
    # the first pod installed the broken driver and was killed before it verified
    mgr.driver.write_record(node_upgrade.UPGRADE_RECORD, {"from": OLD, "to": PAYLOAD})
    src = mgr.driver.stage_payload(PAYLOAD)
    backend.run(host, backend.Request(version=PAYLOAD, src=src, verify=False, force=True), False)
    kube.node_labels[N.LABEL_DRIVER_UPGRADE_STATE] = node_upgrade.UPGRADE_STATE_INSTALLED
    assert loaded(host) == PAYLOAD
    successor, kube = manager(tmp_path, host, "IfNotPresent", broken=("deb",), kube=kube)
    successor.round()
    assert loaded(host) == OLD and kube.node_labels[N.LABEL_DRIVER_UPGRADE_STATE] == "failed"
    assert "rolled back to " + OLD in kube.node_annotations[N.ANNOTATION_DRIVER_UPGRADE_MESSAGE]


@pytest.mark.parametrize("labels, annotations, acts", [
    ({N.LABEL_DRIVER_UPGRADE_STATE: "upgrade-required"}, {N.ANNOTATION_DRIVER_UPGRADE_TARGET: PAYLOAD}, True),
    ({N.LABEL_DRIVER_UPGRADE_STATE: "driver-installed"}, {N.ANNOTATION_DRIVER_UPGRADE_TARGET: PAYLOAD}, True),
    ({N.LABEL_DRIVER_UPGRADE_STATE: "upgrade-required"}, {N.ANNOTATION_DRIVER_UPGRADE_TARGET: OLD}, False),
    ({N.LABEL_DRIVER_UPGRADE_STATE: "upgrade-required"}, {}, False),       # set by hand without a target
    ({N.LABEL_DRIVER_UPGRADE_STATE: "done"}, {N.ANNOTATION_DRIVER_UPGRADE_TARGET: PAYLOAD}, False),
    ({N.LABEL_DRIVER_UPGRADE_STATE: "failed"}, {N.ANNOTATION_DRIVER_UPGRADE_TARGET: PAYLOAD}, False),
    ({}, {}, False),
])
def test_which_upgrade_states_are_driver_managers_to_run(tmp_path, labels, annotations, acts):
    mgr, _kube = manager(tmp_path, node(tmp_path))
    assert mgr.driver.acts_on(node_upgrade.node_upgrade(labels, annotations)) is acts


def test_vfnum_entry_applies_through_the_vfnum_code_and_restarts_gpu_device(tmp_path):
    host = node(tmp_path, preset_name="2xC550-sriov")
    mgr, kube = manager(tmp_path, host, "Never", data={"node-vfnums": "nodes:\n  n1: {vfnum: 4}\n"})
    assert mgr.round()
    pfs = vfnum_backend.read_pfs(host)
    assert [p.numvfs for p in pfs] == [4, 4]
    states = [p["labels"].get(N.LABEL_VFNUM_STATE) for p in kube.patches if N.LABEL_VFNUM_STATE in p["labels"]]
    assert states == ["pending", "success"] and kube.restarts == 1
    assert mgr.round() and kube.restarts == 1      # applied: nothing more


def test_with_the_driver_verified_a_round_applies_vfnum_before_the_driver_part(tmp_path):
    host = node(tmp_path, preset_name="2xC550-sriov")
    mgr, kube = manager(tmp_path, host, "IfNotPresent", data={})
    assert mgr.round() and mgr.driver_verified       # the administrator's driver, verified
    first = len(kube.patches)
    kube.data["node-vfnums"] = "nodes:\n  n1: {vfnum: 4}\n"
    del kube.node_labels[N.LABEL_DRIVER_MODE]        # removed by someone: the driver part writes it again
    assert mgr.round()
    this_round = kube.patches[first:]
    # the state label pending -> success and the restart come before the driver part's mode label
    keys = [next(iter(p["labels"]), None) for p in this_round if p["labels"]]
    assert keys == [N.LABEL_VFNUM_STATE, N.LABEL_VFNUM_STATE, N.LABEL_DRIVER_MODE], keys
    assert [p.numvfs for p in vfnum_backend.read_pfs(host)] == [4, 4] and kube.restarts == 1


def test_without_a_verified_driver_the_driver_part_comes_first(tmp_path):
    host = node(tmp_path, preset_name="2xC550-sriov", driver=False, os_release="ID=ubuntu\nID_LIKE=debian\n")
    mgr, kube = manager(tmp_path, host, "IfNotPresent", data={"node-vfnums": "nodes:\n  n1: {vfnum: 2}\n"})
    assert not mgr.driver_verified
    assert mgr.round()
    keys = [next(iter(p["labels"]), None) for p in kube.patches if p["labels"]]
    # the payload's driver installed and verified (mode cloud), then the VFs on its bound PFs
    assert keys.index(N.LABEL_DRIVER_MODE) < keys.index(N.LABEL_VFNUM_STATE), keys
    assert loaded(host) == PAYLOAD and [p.numvfs for p in vfnum_backend.read_pfs(host)] == [2, 2]


@pytest.mark.parametrize("entry, words", [
    ("nodes:\n  n1: {vfnum: 3}\n", "not one of 0, 1, 2, 4, 8"),
    ("nodes:\n  n1: {vfnum: 16}\n", "not one of"),
    ("nodes: [", "not valid YAML"),
])
def test_an_invalid_entry_changes_nothing(tmp_path, entry, words):
    host = node(tmp_path, preset_name="2xC550-sriov")
    mgr, kube = manager(tmp_path, host, "Never", data={"node-vfnums": entry})
    assert not mgr.round()
    assert [p.numvfs for p in vfnum_backend.read_pfs(host)] == [0, 0]
    assert words in kube.annotation(N.ANNOTATION_VFNUM_MESSAGE)
    assert kube.events[-1][0] == "VfnumRejected" and kube.restarts == 0
    assert kube.label(N.LABEL_VFNUM_STATE) is None


VFNUM_4 = {"node-vfnums": "nodes:\n  n1: {vfnum: 4}\n"}
PDB = "The disruption budget holder-pdb needs 1 healthy pods and has 1 currently"


def numvfs(host):
    return [p.numvfs for p in vfnum_backend.read_pfs(host)]


def test_a_pod_holding_the_gpus_refuses_the_change_and_is_named_when_eviction_is_off(tmp_path):
    host = node(tmp_path, preset_name="2xC550-sriov")
    mgr, kube = manager(tmp_path, host, "Never", data=VFNUM_4)
    kube.pods = ["ml/holder"]
    assert not mgr.round()
    message = kube.annotation(N.ANNOTATION_VFNUM_MESSAGE)
    assert "pod ml/holder requests metax-tech.com/gpu" in message and "vfnumPolicy.evictInUse: true" in message
    assert kube.events[-1][0] == "VfnumRejected" and kube.evictions == [] and kube.restarts == 0
    assert numvfs(host) == [0, 0] and kube.label(N.LABEL_VFNUM_STATE) is None
    assert kube.leases.calls == []                  # refused before the budget is asked


def test_with_eviction_on_a_budgets_refusal_keeps_the_change_pending_until_it_lets_the_pod_go(tmp_path):
    host = node(tmp_path, preset_name="2xC550-sriov")
    mgr, kube = manager(tmp_path, host, "Never", data=VFNUM_4, vfnum_policy=VfnumPolicy(evict_in_use=True))
    kube.pods = ["ml/holder"]
    kube.refusals = {"ml/holder": PDB}
    assert not mgr.round()
    assert numvfs(host) == [0, 0] and kube.restarts == 0
    assert kube.node_labels[N.LABEL_VFNUM_STATE] == "pending"
    message = kube.node_annotations[N.ANNOTATION_VFNUM_MESSAGE]
    assert "eviction of ml/holder refused: " + PDB in message
    assert [e[0] for e in kube.events] == ["VfnumEvictionRefused"] and "ml/holder" in kube.events[0][1]
    assert kube.slot_holders() == []                # the slot is given back while the budget refuses
    assert not mgr.round() and len(kube.events) == 1     # retried (the loop's backoff), reported once
    kube.refusals = {}                              # the PodDisruptionBudget removed
    assert mgr.round()
    assert numvfs(host) == [4, 4] and kube.node_labels[N.LABEL_VFNUM_STATE] == "success"
    assert N.ANNOTATION_VFNUM_MESSAGE not in kube.node_annotations and kube.pods == []
    assert [e[0] for e in kube.events][-2:] == ["VfnumEvicted", "VfnumApplied"] and kube.restarts == 1
    assert kube.evictions == [["ml/holder"]] * 3 and kube.slot_holders() == []


def test_evicted_pods_slow_to_leave_keep_the_change_pending_under_their_own_reason(tmp_path):
    host = node(tmp_path, preset_name="2xC550-sriov")
    mgr, kube = manager(tmp_path, host, "Never", data=VFNUM_4, vfnum_policy=VfnumPolicy(evict_in_use=True))
    kube.pods = ["ml/slow"]

    def slow(timeout):
        raise EvictionError("pods still on node", ["ml/slow"], {})
    kube.evict_gpu_pods = slow
    assert not mgr.round()
    assert kube.events[-1][0] == "VfnumEvictionPending" and "ml/slow still on the node" in kube.events[-1][1]
    assert numvfs(host) == [0, 0] and kube.node_labels[N.LABEL_VFNUM_STATE] == "pending"


def test_eviction_does_not_help_against_a_process_outside_any_pod(tmp_path):
    host = node(tmp_path, preset_name="2xC550-sriov")
    vfnum_backend.apply(host, vfnum_plan(vfnum_backend.read_pfs(host), 2))
    pfs = vfnum_backend.read_pfs(host)
    held = sorted(vfnum_backend.device_nodes(host, pfs[0].vf_bdfs))[0]
    os.makedirs(host.join("proc/4242/fd"))
    os.symlink(held, host.join("proc/4242/fd/3"))
    mgr, kube = manager(tmp_path, host, "Never", data=VFNUM_4, vfnum_policy=VfnumPolicy(evict_in_use=True))
    assert not mgr.round()
    assert "process 4242" in kube.annotation(N.ANNOTATION_VFNUM_MESSAGE)
    assert kube.evictions == [] and numvfs(host) == [2, 2] and kube.label(N.LABEL_VFNUM_STATE) is None


def test_a_node_without_a_free_slot_stays_pending_without_a_failure_and_changes_once_one_is_free(tmp_path, monkeypatch):
    leases = FakeLeaseApi()
    other = Slots(leases, "metax-operator", dm.VFNUM_SLOT_PREFIX, 1, "n2")
    assert other.take()                             # n2 changes its vfnum now
    host = node(tmp_path, preset_name="2xC550-sriov")
    mgr, kube = manager(tmp_path, host, "Never", data=VFNUM_4, kube=Recorder("n1", dict(VFNUM_4), leases))
    assert mgr.round()                              # waiting is not a failure: no backoff
    assert mgr.slot_wanted.is_set()                 # the slot waiter wakes the next round
    assert numvfs(host) == [0, 0] and kube.node_labels[N.LABEL_VFNUM_STATE] == "pending"
    assert kube.events == [] and kube.annotation(N.ANNOTATION_VFNUM_MESSAGE) is None    # not Degraded
    other.release()
    holders_while_applying = []
    apply = vfnum_backend.apply

    def watched(host_, plan_):
        holders_while_applying.append(kube.slot_holders())
        return apply(host_, plan_)
    monkeypatch.setattr(vfnum_backend, "apply", watched)
    assert mgr.round()
    assert numvfs(host) == [4, 4] and holders_while_applying == [["n1"]] and kube.slot_holders() == []
    states = [p["labels"][N.LABEL_VFNUM_STATE] for p in kube.patches if N.LABEL_VFNUM_STATE in p["labels"]]
    assert states == ["pending", "success"]         # pending once, kept while it waited
    assert not mgr.slot_wanted.is_set()


def test_the_slot_waiter_wakes_the_round_when_the_watched_pool_frees_a_slot(tmp_path):
    leases = FakeLeaseApi()
    other = Slots(leases, "metax-operator", dm.VFNUM_SLOT_PREFIX, 1, "n2")
    assert other.take()
    host = node(tmp_path, preset_name="2xC550-sriov")
    mgr, kube = manager(tmp_path, host, "Never", data=VFNUM_4, kube=Recorder("n1", dict(VFNUM_4), leases))
    leases.watch(mgr.slots)                         # what Kube.watch_slots feeds in the pod
    mgr.slots.spread = 0.0
    before = len(leases.calls)
    assert mgr.round() and mgr.slot_wanted.is_set()
    wake, stop = threading.Event(), threading.Event()
    waiter = threading.Thread(target=dm.wait_for_slots, args=(mgr, wake, stop), daemon=True)
    waiter.start()
    assert not wake.wait(0.3)                       # the pool is full: no round woken, no API call
    assert leases.calls[before:] == []              # chosen from the view: not even a list
    other.release()
    assert wake.wait(60.0) and not mgr.slot_wanted.is_set()
    assert mgr.round() and numvfs(host) == [4, 4]
    stop.set()
    waiter.join(60.0)
    assert not waiter.is_alive()


def test_without_a_watch_a_waiting_node_retries_blindly_within_one_to_two_slot_retries():
    assert dm.slot_retry(lambda: 0.0) == dm.SLOT_RETRY and dm.slot_retry(lambda: 0.99) < 2 * dm.SLOT_RETRY


def test_the_cli_takes_the_vfnum_policy():
    args = dm.build_parser().parse_args(["--vfnum-evict-in-use=true", "--vfnum-max-parallel=3"])
    assert (args.vfnum_evict_in_use, args.vfnum_max_parallel) == ("true", 3)
    with pytest.raises(SystemExit):
        dm.build_parser().parse_args(["--vfnum-max-parallel=0"])


def test_vfnum_on_a_node_without_sriov_is_refused(tmp_path):
    host = node(tmp_path, preset_name="1xC500")
    mgr, kube = manager(tmp_path, host, "Never", data={"node-vfnums": "nodes:\n  n1: {vfnum: 2}\n"})
    assert not mgr.round()
    assert "gpu.sriov=forbidden" in kube.annotation(N.ANNOTATION_VFNUM_MESSAGE)


def _ConfigMap(version):
    """driver-config as the watch hands it: the API server's JSON (kube/watch.py reads no models)."""
    return {"kind": "ConfigMap", "metadata": {"name": "driver-config", "resourceVersion": version}}


@pytest.mark.parametrize("event, seen, changed", [
    ({"type": "ADDED", "object": _ConfigMap("7")}, "7", False),    # the watch's replay of what the round read
    ({"type": "ADDED", "object": _ConfigMap("8")}, "7", True),     # edited while the round ran
    ({"type": "MODIFIED", "object": _ConfigMap("9")}, "8", True),
    ({"type": "ADDED", "object": _ConfigMap("3")}, None, True),    # created after a round found none
    ({"type": "DELETED", "object": _ConfigMap("9")}, "9", True),
    ({"type": "DELETED", "object": _ConfigMap("9")}, None, False),
])
def test_a_watch_event_is_a_change_when_it_is_not_the_version_the_round_read(event, seen, changed):
    assert dm.event_changes_config(event, seen) is changed


class _RawStream:
    """urllib3's answer to a watch call (``_preload_content=False``): newline-delimited JSON events;
    ``after``: what happens once the server ended the watch."""

    def __init__(self, events, after=None):
        self.events = events
        self.after = after

    def stream(self, amt=None, decode_content=False):
        for event in self.events:
            yield (json.dumps(event) + "\n").encode()
        if self.after is not None:
            self.after()

    def close(self):
        pass

    def release_conn(self):
        pass


class _Server:
    """One kind's list and watch as the API server answers the client's raw calls (kube/watch.py's
    RawSource): ``listed(n)`` is the n-th list's (items, resourceVersion); each watch plays the next step
    of ``script`` (a list of events, after which the server ends the watch, or an exception: the watch
    breaks); the last step sets ``stop``. A watch without a resourceVersion is a consistent read, which a
    server whose cache of the kind lags behind etcd refuses with 504."""

    def __init__(self, listed, script):
        self.listed = listed
        self.script = list(script)
        self.lists: List[dict] = []
        self.watches: List[dict] = []

    def __call__(self, namespace, **kwargs):
        assert namespace == "ns" and kwargs["_preload_content"] is False
        if not kwargs.get("watch"):
            self.lists.append(kwargs)
            items, version = self.listed(len(self.lists))
            return _RawAnswer(json.dumps({"items": items, "metadata": {"resourceVersion": version}}).encode())
        self.watches.append(kwargs)
        if not kwargs.get("resource_version"):
            stop.set()
            raise dm.ApiException(status=504, reason="Timeout: Too large resource version")
        step = self.script.pop(0)
        last = not self.script
        if isinstance(step, Exception):
            if last:
                stop.set()
            raise step
        return _RawStream(step, after=stop.set if last else None)


stop = threading.Event()


def test_the_watch_opens_from_a_cached_list_and_wakes_for_an_edit():
    stop.clear()
    server = _Server(lambda n: ([_ConfigMap("11")], "11"), [[{"type": "MODIFIED", "object": _ConfigMap("12")}]])
    kube = dm.Kube.__new__(dm.Kube)
    kube.config_map, kube.namespace, kube.config_version = "driver-config", "ns", "11"
    kube.core = type("Core", (), {"list_namespaced_config_map": staticmethod(server)})()
    wake = threading.Event()
    kube.watch_config(wake, stop)
    lists = server.lists
    # listed from the cache ("0": no consistent read), watched from the list's version, woken by the edit
    assert lists[0]["resource_version"] == "0" and lists[0]["field_selector"] == "metadata.name=driver-config"
    assert server.watches[0]["resource_version"] == "11" and wake.is_set()
    assert server.watches[0]["allow_watch_bookmarks"] and server.watches[0]["field_selector"] == "metadata.name=driver-config"


def test_driver_config_is_parsed_again_only_when_its_resource_version_moved(tmp_path, monkeypatch):
    host = node(tmp_path, preset_name="2xC550-sriov")
    mgr, kube = manager(tmp_path, host, "Never", data={"node-vfnums": "nodes:\n  n1: {vfnum: 0}\n"})
    parsed = []
    parse = dm.parse_config

    def counted(data, name):
        parsed.append(dict(data))
        return parse(data, name)
    monkeypatch.setattr(dm, "parse_config", counted)
    kube.config_version = "7"
    assert mgr.read_config().vfnum == 0 and mgr.read_config().vfnum == 0
    assert len(parsed) == 1                          # the same version: the parse kept
    kube.data = {"node-vfnums": "nodes:\n  n1: {vfnum: 4}\n"}
    kube.config_version = "8"
    assert mgr.read_config().vfnum == 4 and len(parsed) == 2
    kube.config_version = None                       # no version known (a fake, or no ConfigMap): parsed
    assert mgr.read_config().vfnum == 4 and len(parsed) == 3


def _node_event(kind, labels=None, annotations=None, name="n1"):
    return {"type": kind, "object": {"kind": "Node", "metadata": {"name": name, "labels": labels,
                                                                  "annotations": annotations}}}


def test_the_node_watch_wakes_only_when_the_upgrade_state_or_target_moves():
    watched = dm.NodeWatched()
    required = {N.LABEL_DRIVER_UPGRADE_STATE: N.DRIVER_UPGRADE_REQUIRED}
    target = {N.ANNOTATION_DRIVER_UPGRADE_TARGET: PAYLOAD}
    assert watched.opened([_node_event("ADDED")["object"]])          # the first sight of the node
    assert not watched.changed(_node_event("MODIFIED", {N.LABEL_VFNUM_STATE: "pending"}))  # our own patch
    assert watched.changed(_node_event("MODIFIED", required, target))      # the controller's start
    assert not watched.changed(_node_event("MODIFIED", dict(required, other="x"), target))
    assert watched.changed(_node_event("MODIFIED", {}, {}))                # cleared by the controller


def test_an_opening_hands_every_listed_object_to_the_decision_and_none_listed_as_a_deletion():
    kube = SimpleNamespace(config_map="driver-config", config_version="11")
    watched = dm.ConfigWatched(kube)
    assert not watched.opened([_ConfigMap("11")])       # what the last round read
    assert watched.opened([_ConfigMap("12")])           # edited while the round ran
    assert watched.opened([])                           # deleted: the round finds no ConfigMap
    kube.config_version = None
    assert not watched.opened([])


def test_the_slot_watch_keeps_the_view_of_its_slots_and_never_wakes_a_round_itself():
    leases = FakeLeaseApi()
    other = Slots(leases, "metax-operator", dm.VFNUM_SLOT_PREFIX, 1, "n2")
    assert other.take()
    mine = Slots(leases, "metax-operator", dm.VFNUM_SLOT_PREFIX, 1, "n1")
    watched = dm.SlotsWatched(mine)
    listed = leases.list_namespaced_lease("metax-operator", "%s=%s" % (dm.POOL_LABEL, dm.VFNUM_SLOT_PREFIX))["items"]
    assert not watched.opened(listed) and mine.free() == []          # the view: held by n2
    held = leases.leases[("metax-operator", other.held)]
    other.release()
    assert not watched.changed({"type": "DELETED", "object": held})  # the slot waiter wakes the round
    assert mine.free() == ["%s-0" % dm.VFNUM_SLOT_PREFIX]
    watched.broken()
    assert mine.view is None                                          # take() lists again


def _until(done, limit=30.0):
    """Poll ``done`` every 50 ms, at most ``limit`` seconds (the asserts after it say what it found)."""
    never = threading.Event()
    polls = int(limit / 0.05)
    while polls and not done():
        never.wait(0.05)
        polls -= 1


def test_run_loop_opens_the_watches_it_is_given_and_their_wake_runs_a_round(tmp_path):
    host = node(tmp_path, preset_name="2xC550-sriov")
    mgr, kube = manager(tmp_path, host, "Never", data={"node-vfnums": "nodes:\n  n1: {vfnum: 0}\n"})
    mgr.driver_verified = True
    rounds = []
    real_round = mgr.round

    def counted():
        rounds.append(kube.config())
        return real_round()
    mgr.round = counted
    opened = []

    def watches(manager_, wake, stop_):
        opened.append((manager_, wake))
    stop_loop = threading.Event()
    loop = threading.Thread(target=dm.run_loop, args=(mgr, 3600.0, stop_loop), kwargs={"watches": watches},
                            daemon=True)
    loop.start()
    _until(lambda: rounds)
    assert len(opened) == 1 and opened[0][0] is mgr and len(rounds) == 1
    kube.data = dict(VFNUM_4)
    opened[0][1].set()                          # what a watch's change does: the next round now, not in an hour
    _until(lambda: len(rounds) >= 2)
    stop_loop.set()
    loop.join(60.0)
    assert not loop.is_alive() and numvfs(host) == [4, 4]


def test_run_loop_looks_again_soon_while_a_round_leaves_work_waiting(tmp_path, monkeypatch):
    """An in-place upgrade waiting for idle GPUs (or a remediation step) is looked at again after
    WAITING_RETRY, doubling, not after the interval: nothing wakes the loop when a GPU pod ends."""
    host = node(tmp_path)
    mgr, _kube = manager(tmp_path, host, "IfNotPresent")
    monkeypatch.setattr(dm, "WAITING_RETRY", 0.01)
    rounds = []

    def waiting_three_times():
        rounds.append(len(rounds))
        mgr.waiting = len(rounds) <= 3
        return True
    mgr.round = waiting_three_times
    stop_loop = threading.Event()
    loop = threading.Thread(target=dm.run_loop, args=(mgr, 3600.0, stop_loop), kwargs={"watch": False}, daemon=True)
    loop.start()
    _until(lambda: len(rounds) >= 4)
    assert len(rounds) >= 4 and not mgr.waiting     # three waiting rounds, each followed by another, no wake
    stop_loop.set()
    loop.join(60.0)
    assert not loop.is_alive()


def test_quiet_rounds_write_the_driver_mode_once_and_again_only_when_the_node_lost_it(tmp_path):
    host = node(tmp_path)
    mgr, kube = manager(tmp_path, host, "IfNotPresent")
    assert mgr.round() and mgr.round() and mgr.round()
    modes = [p["labels"] for p in kube.patches if N.LABEL_DRIVER_MODE in p["labels"]]
    assert modes == [{N.LABEL_DRIVER_MODE: "native"}]          # not a write per round
    # the payload's declaration too: once, not a write per round
    declared = [p["annotations"] for p in kube.patches if p["annotations"]]
    assert declared == [{N.ANNOTATION_DRIVER_PAYLOAD_VERSION: PAYLOAD, N.ANNOTATION_DRIVER_PAYLOAD_DRIVER: PAYLOAD}]
    del kube.node_labels[N.LABEL_DRIVER_MODE]
    assert mgr.round()
    assert kube.node_labels[N.LABEL_DRIVER_MODE] == "native" and len(kube.patches) == 3


class _RawAnswer:
    """urllib3's answer to a call with ``_preload_content=False``: the body, and a connection to give back."""

    def __init__(self, body):
        self.data = body
        self.released = False

    def release_conn(self):
        self.released = True


class _RawCore:
    """CoreV1Api's two Node calls of a round; the client builds no model with ``_preload_content=False``."""

    def __init__(self, node):
        self.node = node
        self.body: Optional[bytes] = None      # an answer that is not the Node's JSON
        self.answers: List[_RawAnswer] = []
        self.patches: List[dict] = []

    def _answer(self, kwargs):
        assert kwargs.get("_preload_content") is False
        self.answers.append(_RawAnswer(self.body if self.body is not None else json.dumps(self.node).encode()))
        return self.answers[-1]

    def read_node(self, name, **kwargs):
        assert name == self.node["metadata"]["name"]
        return self._answer(kwargs)

    def patch_node(self, name, body, **kwargs):
        assert kwargs["_content_type"] == "application/merge-patch+json"
        self.patches.append(body)
        return self._answer(kwargs)


def test_the_round_reads_and_patches_its_node_as_raw_json_and_gives_every_connection_back():
    kube = dm.Kube.__new__(dm.Kube)
    kube.node = "n1"
    kube.core = _RawCore({"kind": "Node", "metadata": {
        "name": "n1", "labels": {N.LABEL_DRIVER_UPGRADE_STATE: N.DRIVER_UPGRADE_REQUIRED},
        "annotations": {N.ANNOTATION_DRIVER_UPGRADE_TARGET: PAYLOAD}}, "status": {"images": []}})
    meta = kube.node_metadata()
    assert node_upgrade.node_upgrade(meta["labels"], meta["annotations"]) == node_upgrade.NodeUpgrade(N.DRIVER_UPGRADE_REQUIRED, PAYLOAD)
    kube.patch_node({N.LABEL_VFNUM_STATE: "success"}, {N.ANNOTATION_VFNUM_MESSAGE: None})
    kube.patch_node({}, {})                                            # nothing to write: no call
    assert kube.core.patches == [{"metadata": {"labels": {N.LABEL_VFNUM_STATE: "success"},
                                               "annotations": {N.ANNOTATION_VFNUM_MESSAGE: None}}}]
    assert len(kube.core.answers) == 2 and all(answer.released for answer in kube.core.answers)
    kube.core.body = b"<html>a proxy's error page</html>"
    assert kube.node_metadata() == {} and kube.core.answers[-1].released


class _Recorded(dm.Watched):
    def __init__(self):
        self.events = []
        self.openings = 0

    def opened(self, items):
        self.openings += 1
        return False

    def changed(self, event):
        self.events.append((event["type"], event["object"]["metadata"]["resourceVersion"]))
        return event["type"] == "MODIFIED"


def test_a_watch_the_server_ends_is_resumed_from_its_last_version_and_listed_again_only_after_a_break(monkeypatch):
    monkeypatch.setattr(dm, "WATCH_RETRY_PAUSE", 0.0)
    bookmark = {"type": "BOOKMARK", "object": {"kind": "ConfigMap", "metadata": {"resourceVersion": "15"}}}
    server = _Server(lambda n: ([_ConfigMap(str(20 + n))], str(20 + n)), [
        [{"type": "MODIFIED", "object": _ConfigMap("12")}, bookmark],    # ended by the server
        [],                                                              # ended, nothing seen
        dm.ApiException(status=410, reason="Gone"),                      # too old: broken
        [{"type": "MODIFIED", "object": _ConfigMap("31")}],
    ])
    stop.clear()
    watched, wake = _Recorded(), threading.Event()
    dm.watch_objects(wake, stop, server, ("ns",), {"field_selector": "metadata.name=driver-config"}, watched)
    lists = server.lists
    # listed at the start and after the break only; resumed from the bookmark's version in between
    assert [k["resource_version"] for k in lists] == ["0", "0"] and watched.openings == 2
    assert [k["resource_version"] for k in server.watches] == ["21", "15", "15", "22"]
    assert all(k["allow_watch_bookmarks"] for k in server.watches)
    # a bookmark is not an event of the object: never handed to the decision
    assert watched.events == [("MODIFIED", "12"), ("MODIFIED", "31")] and wake.is_set()


# -- the vendor's payloads: a payload version apart from its kernel driver's, and the prebuilt layout -------------
VENDOR, VENDOR_KMD = "2.29.0.13", "2.12.13"


@pytest.mark.parametrize("layouts", [("deb", "rpm", "run"), ("prebuilt",)])
def test_a_vendor_payload_installs_verifies_is_ready_and_declares_its_kernel_driver(tmp_path, layouts):
    host = node(tmp_path, driver=False)
    mgr, kube = manager(tmp_path, host, version=VENDOR, kmd=VENDOR_KMD, layouts=layouts)
    assert mgr.round()
    assert loaded(host) == VENDOR_KMD and os.path.exists(str(tmp_path / "ready"))
    assert kube.node_annotations[N.ANNOTATION_DRIVER_PAYLOAD_VERSION] == VENDOR
    assert kube.node_annotations[N.ANNOTATION_DRIVER_PAYLOAD_DRIVER] == VENDOR_KMD
    kind = backend.observe(host, mgr.driver.cmds, backend.Request()).package_kind
    assert kind == ("deb" if "deb" in layouts else "prebuilt")
    # quiet afterwards: the module 2.12.13 is the payload 2.29.0.13's, nothing reloads or re-installs
    kube.patches.clear()
    assert mgr.round() and mgr.round()
    assert loaded(host) == VENDOR_KMD and kube.patches == [] and kube.restarts == 1
    assert os.path.exists(str(tmp_path / "ready"))


@pytest.mark.parametrize("pol", ["Always", "PreferCloud"])
def test_always_sees_a_vendor_payload_on_target_by_its_declared_kernel_driver(tmp_path, pol):
    host = node(tmp_path, driver=False)
    mgr, kube = manager(tmp_path, host, pol, version=VENDOR, kmd=VENDOR_KMD)
    assert mgr.round() and loaded(host) == VENDOR_KMD
    events = len(kube.events)
    assert mgr.round() and mgr.round()
    assert len(kube.events) == events and loaded(host) == VENDOR_KMD     # no converge round after round


@pytest.mark.parametrize("old_kmd, new_kmd", [(None, None), ("2.12.11", VENDOR_KMD)])
def test_both_numbering_schemes_round_trip_through_upgrade_and_rollback(tmp_path, old_kmd, new_kmd):
    """Same-numbered payloads (ours) and vendor-numbered ones: upgrade to the new payload, verified
    against what it declares; a broken one rolls back to the old, verified against what that declared."""
    host = node(tmp_path, driver=False)
    first, kube = manager(tmp_path, host, version=OLD, kmd=old_kmd)
    assert first.round() and loaded(host) == (old_kmd or OLD)
    good, kube = manager(tmp_path, host, "Always", version=VENDOR, kmd=new_kmd, kube=kube)
    assert good.round() and loaded(host) == (old_kmd or OLD)              # waits for upgrade-required
    assert kube.node_annotations[N.ANNOTATION_DRIVER_PAYLOAD_DRIVER] == (new_kmd or VENDOR)
    kube.start_upgrade(VENDOR)
    assert good.round()
    assert loaded(host) == (new_kmd or VENDOR) and kube.node_labels[N.LABEL_DRIVER_UPGRADE_STATE] == "done"
    if new_kmd:
        assert "(kernel driver %s)" % new_kmd in kube.events[-1][1]
    # the controller finishes; then a broken payload of a later version fails and rolls back to VENDOR
    del kube.node_labels[N.LABEL_DRIVER_UPGRADE_STATE]
    bad, kube = manager(tmp_path, host, "Always", version="2.30.0.1", kmd=new_kmd and "2.13.0", broken=("deb",),
                        kube=kube)
    kube.start_upgrade("2.30.0.1")
    bad.round()
    assert kube.node_labels[N.LABEL_DRIVER_UPGRADE_STATE] == "failed"
    assert "rolled back to " + VENDOR in kube.node_annotations[N.ANNOTATION_DRIVER_UPGRADE_MESSAGE]
    assert loaded(host) == (new_kmd or VENDOR) and os.path.exists(str(tmp_path / "ready"))


def test_an_in_place_upgrade_waits_while_a_pod_uses_the_gpus_says_so_and_goes_once_idle(tmp_path):
    """enableRollout false: no cordon; the upgrade goes only while the node's GPUs are idle."""
    host, kube = cloud_node(tmp_path)
    mgr, kube = manager(tmp_path, host, kube=kube, version=VENDOR, kmd=VENDOR_KMD)
    kube.pods = ["ml/train-0"]
    kube.start_upgrade(VENDOR)
    kube.node_annotations[N.ANNOTATION_DRIVER_UPGRADE_IN_PLACE] = "true"
    assert mgr.round() and mgr.round()                      # a wait, not a failure: no DriverFailed
    assert mgr.waiting                                      # run_loop looks again soon, not after the interval
    assert loaded(host) == OLD and kube.node_labels[N.LABEL_DRIVER_UPGRADE_STATE] == N.DRIVER_UPGRADE_REQUIRED
    message = kube.node_annotations[N.ANNOTATION_DRIVER_UPGRADE_MESSAGE]
    assert message.startswith("pending: in use (pod ml/train-0 requests metax-tech.com/gpu)")
    assert [p for p in kube.patches if N.ANNOTATION_DRIVER_UPGRADE_MESSAGE in p["annotations"]] == [
        {"labels": {}, "annotations": {N.ANNOTATION_DRIVER_UPGRADE_MESSAGE: message}}]   # said once
    assert not any(e[0] == "DriverFailed" for e in kube.events) and kube.evictions == []
    assert os.path.exists(str(tmp_path / "ready"))          # the old driver stays ready meanwhile
    kube.pods = []
    assert mgr.round() and not mgr.waiting
    assert loaded(host) == VENDOR_KMD and kube.node_labels[N.LABEL_DRIVER_UPGRADE_STATE] == N.DRIVER_UPGRADE_DONE
    assert N.ANNOTATION_DRIVER_UPGRADE_MESSAGE not in kube.node_annotations


def test_an_in_place_upgrade_waits_for_a_process_holding_a_gpu_too(tmp_path):
    host, kube = cloud_node(tmp_path)
    mgr, kube = manager(tmp_path, host, kube=kube)
    _hold(host)
    kube.start_upgrade(PAYLOAD)
    kube.node_annotations[N.ANNOTATION_DRIVER_UPGRADE_IN_PLACE] = "true"
    assert mgr.round()
    assert loaded(host) == OLD and "process" in kube.node_annotations[N.ANNOTATION_DRIVER_UPGRADE_MESSAGE]


def _hold(host):
    """A process holding /dev/mxcd open, as inuse.open_device_users reads it under the root."""
    os.makedirs(host.join("proc/4242/fd"), exist_ok=True)
    os.symlink("/dev/mxcd", host.join("proc/4242/fd/3"))
    with open(host.join("proc/4242/comm"), "w") as handle:
        handle.write("python3\n")


def test_a_declaration_of_another_version_than_the_payloads_is_reported_and_changes_nothing(tmp_path):
    host, kube = cloud_node(tmp_path)
    mgr, kube = manager(tmp_path, host, "Always", kube=kube)
    pkgtool.make_declaration(mgr.driver.payload_dir, "9.9.9", "2.12.13")
    assert not mgr.round()
    assert "declares version 9.9.9" in kube.node_annotations[N.ANNOTATION_DRIVER_MESSAGE]
    assert loaded(host) == OLD


@pytest.mark.parametrize("impl", [dm.Kube, Recorder], ids=["Kube", "Recorder"])
def test_the_agents_kube_and_the_tests_recorder_implement_the_node_api_the_procedures_use(impl):
    """driver/node_upgrade.py and vfnum/reconcile.py reach the API only through NodeApi: the pod's
    Kube and this file's Recorder both answer every one of its calls, with the same parameters."""
    import inspect
    calls = [member[0] for member in inspect.getmembers(NodeApi, inspect.isfunction) if not member[0].startswith("_")]
    assert sorted(calls) == ["event", "evict_gpu_pods", "gpu_pods", "node_metadata", "patch_node",
                             "restart_gpu_device"]
    for name in calls:
        want = list(inspect.signature(getattr(NodeApi, name)).parameters)
        assert list(inspect.signature(getattr(impl, name)).parameters) == want, name


# -- the node-maintenance protocol (issue 40): driver-manager's vfnum change holds the node -------------

def test_a_vfnum_change_holds_the_node_for_driver_manager_and_releases_it(tmp_path):
    host = node(tmp_path, preset_name="2xC550-sriov")
    mgr, kube = manager(tmp_path, host, "Never", data=VFNUM_4, vfnum_policy=VfnumPolicy(evict_in_use=True))
    kube.pods = ["ml/holder"]
    assert mgr.round()
    owners = [p["annotations"][N.ANNOTATION_MAINTENANCE_OWNER] for p in kube.patches
              if N.ANNOTATION_MAINTENANCE_OWNER in p["annotations"]]
    assert owners == [N.MAINTENANCE_OWNER_DRIVER_MANAGER, None]     # held for the change, then released
    held_at = next(i for i, p in enumerate(kube.patches) if N.ANNOTATION_MAINTENANCE_OWNER in p["annotations"])
    pending_at = next(i for i, p in enumerate(kube.patches) if p["labels"].get(N.LABEL_VFNUM_STATE) == "pending")
    assert held_at < pending_at                        # held before anything on the node changes
    assert numvfs(host) == [4, 4] and N.ANNOTATION_MAINTENANCE_OWNER not in kube.node_annotations
    # never a cordon, never the agents' pause: driver-manager is one of them
    assert not any(N.LABEL_AGENTS_PAUSED in p["labels"] for p in kube.patches)


@pytest.mark.parametrize("holder_labels, holder_annotations, holder", [
    ({N.LABEL_AGENTS_PAUSED: N.MAINTENANCE_OWNER_SET_VFNUM}, {}, "set-vfnum"),       # the set_vfnum playbook
    ({N.LABEL_AGENTS_PAUSED: "true"}, {}, "driver-upgrade"),                          # the driver upgrade, pre-protocol
    ({}, {N.ANNOTATION_MAINTENANCE_OWNER: N.MAINTENANCE_OWNER_HEALTH}, "health"),   # the health ladder
])
def test_a_node_another_procedure_holds_waits_and_nothing_on_it_changes(tmp_path, holder_labels,
                                                                        holder_annotations, holder):
    host = node(tmp_path, preset_name="2xC550-sriov")
    mgr, kube = manager(tmp_path, host, "Never", data=VFNUM_4, vfnum_policy=VfnumPolicy(evict_in_use=True))
    kube.node_labels.update(holder_labels)
    kube.node_annotations.update(holder_annotations)
    kube.pods = ["ml/holder"]
    assert not mgr.round()
    message = kube.node_annotations[N.ANNOTATION_VFNUM_MESSAGE]
    assert "held by %s's maintenance" % holder in message
    assert kube.events[-1][0] == "VfnumNodeHeld"
    assert numvfs(host) == [0, 0] and kube.evictions == [] and kube.restarts == 0
    assert N.LABEL_VFNUM_STATE not in kube.node_labels and kube.slot_holders() == []
    # the other hold is untouched
    assert {key: kube.node_labels.get(key) for key in holder_labels} == holder_labels
    assert kube.node_annotations.get(N.ANNOTATION_MAINTENANCE_OWNER) == \
        holder_annotations.get(N.ANNOTATION_MAINTENANCE_OWNER)
    # the other procedure resumes the node: the next round applies the entry
    for key in holder_labels:
        del kube.node_labels[key]
    kube.node_annotations.pop(N.ANNOTATION_MAINTENANCE_OWNER, None)
    assert mgr.round() and numvfs(host) == [4, 4] and kube.node_labels[N.LABEL_VFNUM_STATE] == "success"


def test_the_upgrade_holds_the_node_while_it_installs_and_waits_while_another_procedure_holds_it(tmp_path):
    host, kube = cloud_node(tmp_path)
    mgr, kube = manager(tmp_path, host, "IfNotPresent", kube=kube)
    kube.start_upgrade(PAYLOAD)
    kube.node_labels[N.LABEL_AGENTS_PAUSED] = N.MAINTENANCE_OWNER_SET_VFNUM     # a set_vfnum playbook's hold
    assert mgr.round()
    assert loaded(host) == OLD and kube.node_labels[N.LABEL_DRIVER_UPGRADE_STATE] == N.DRIVER_UPGRADE_REQUIRED
    message = kube.node_annotations[N.ANNOTATION_DRIVER_UPGRADE_MESSAGE]
    assert message.startswith(N.PENDING_MESSAGE_PREFIX) and "held by set-vfnum's maintenance" in message
    assert os.path.exists(str(tmp_path / "ready"))            # the old driver stays ready meanwhile
    del kube.node_labels[N.LABEL_AGENTS_PAUSED]               # set_vfnum resumed the node
    kube.patches.clear()
    assert mgr.round()
    assert loaded(host) == PAYLOAD and kube.node_labels[N.LABEL_DRIVER_UPGRADE_STATE] == N.DRIVER_UPGRADE_DONE
    owners = [p["annotations"][N.ANNOTATION_MAINTENANCE_OWNER] for p in kube.patches
              if N.ANNOTATION_MAINTENANCE_OWNER in p["annotations"]]
    assert owners == [N.MAINTENANCE_OWNER_DRIVER_MANAGER, None]
    assert N.ANNOTATION_MAINTENANCE_OWNER not in kube.node_annotations
    assert N.ANNOTATION_DRIVER_UPGRADE_MESSAGE not in kube.node_annotations
