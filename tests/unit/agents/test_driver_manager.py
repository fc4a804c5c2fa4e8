"""driver-manager's rounds on simulated node roots: the real package tools and kernel hook of the
simulator, the real backend code of metax.gpu.driver and metax.gpu.vfnum; the API calls are recorded
(tests/integration/test_driver_manager_cluster.py runs them against the local cluster)."""
from __future__ import annotations

import os
from typing import Dict, List

import pytest

from ansible_collections.metax.gpu.plugins.module_utils import names as N
from ansible_collections.metax.gpu.plugins.module_utils.agents import driver_manager as dm
from ansible_collections.metax.gpu.plugins.module_utils.driver import policy
from ansible_collections.metax.gpu.plugins.module_utils.host import HostRoot
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator, pkgtool
from ansible_collections.metax.gpu.plugins.module_utils.sim.spec import preset

PAYLOAD = "2.99.1"


class Recorder:
    """The Kube surface driver-manager uses, recording what it would send."""

    def __init__(self, node: str, data: Dict[str, str]) -> None:
        self.node = node
        self.data = data
        self.patches: List[dict] = []
        self.events: List[tuple] = []
        self.restarts = 0

    def config(self):
        return self.data

    def patch_node(self, labels, annotations):
        # what the node-agent admission policy lets driver-manager's service account write
        allowed = N.NODE_AGENT_KEYS["driver-manager"]
        assert set(labels) <= set(allowed["labels"]) and set(annotations) <= set(allowed["annotations"])
        self.patches.append({"labels": dict(labels), "annotations": dict(annotations)})

    def restart_gpu_device(self):
        self.restarts += 1
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


def payload(tmp_path):
    root = tmp_path / "payload"
    for kind in ("deb", "rpm", "run"):
        pkgtool.make_package(str(root / kind), kind, PAYLOAD)
    return str(root)


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


def manager(tmp_path, host, pol="IfNotPresent", data=None):
    kube = Recorder("n1", data or {})
    return dm.Manager(host, kube, pol, payload(tmp_path), PAYLOAD, str(tmp_path / "ready")), kube


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
    assert not mgr.round()
    assert loaded(host) == before
    assert "in use" in kube.annotation(N.ANNOTATION_DRIVER_MESSAGE)
    assert [e[0] for e in kube.events] == ["DriverFailed"]
    assert not mgr.round()
    assert len(kube.events) == 1                 # the same failure is reported once, not every round
    with open(host.join("sys/module/metax/refcnt"), "w") as handle:
        handle.write("0\n")
    assert mgr.round()
    assert loaded(host) == PAYLOAD and kube.annotation(N.ANNOTATION_DRIVER_MESSAGE) is None


def test_vfnum_entry_applies_through_the_vfnum_code_and_restarts_gpu_device(tmp_path):
    host = node(tmp_path, preset_name="2xC550-sriov")
    mgr, kube = manager(tmp_path, host, "Never", data={"node-vfnums": "nodes:\n  n1: {vfnum: 4}\n"})
    assert mgr.round()
    pfs = dm.vfnum_backend.read_pfs(host)
    assert [p.numvfs for p in pfs] == [4, 4]
    states = [p["labels"].get(N.LABEL_VFNUM_STATE) for p in kube.patches if N.LABEL_VFNUM_STATE in p["labels"]]
    assert states == ["pending", "success"] and kube.restarts == 1
    assert mgr.round() and kube.restarts == 1      # applied: nothing more


@pytest.mark.parametrize("entry, words", [
    ("nodes:\n  n1: {vfnum: 3}\n", "not one of 0, 1, 2, 4, 8"),
    ("nodes:\n  n1: {vfnum: 16}\n", "not one of"),
    ("nodes: [", "not valid YAML"),
])
def test_an_invalid_entry_changes_nothing(tmp_path, entry, words):
    host = node(tmp_path, preset_name="2xC550-sriov")
    mgr, kube = manager(tmp_path, host, "Never", data={"node-vfnums": entry})
    assert not mgr.round()
    assert [p.numvfs for p in dm.vfnum_backend.read_pfs(host)] == [0, 0]
    assert words in kube.annotation(N.ANNOTATION_VFNUM_MESSAGE)
    assert kube.events[-1][0] == "VfnumRejected" and kube.restarts == 0
    assert kube.label(N.LABEL_VFNUM_STATE) is None


def test_vfnum_on_a_node_without_sriov_is_refused(tmp_path):
    host = node(tmp_path, preset_name="1xC500")
    mgr, kube = manager(tmp_path, host, "Never", data={"node-vfnums": "nodes:\n  n1: {vfnum: 2}\n"})
    assert not mgr.round()
    assert "gpu.sriov=forbidden" in kube.annotation(N.ANNOTATION_VFNUM_MESSAGE)


class _Meta:
    def __init__(self, version):
        self.resource_version = version


class _ConfigMap:
    def __init__(self, version):
        self.metadata = _Meta(version)


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
