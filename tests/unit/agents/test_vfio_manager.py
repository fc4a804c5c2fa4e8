"""vfio-manager's rounds on simulated nodes, with the API recorded (issue 43)."""
from __future__ import annotations

import threading

import pytest
import yaml

from ansible_collections.metax.gpu.plugins.module_utils import names
from ansible_collections.metax.gpu.plugins.module_utils.agents import vfio_manager
from ansible_collections.metax.gpu.plugins.module_utils.agents.vfio_manager import VfioManager
from ansible_collections.metax.gpu.plugins.module_utils.deviceplugin.server import RequestError
from ansible_collections.metax.gpu.plugins.module_utils.deviceplugin.vfio import GroupState, container_allocation, \
    kubevirt_env_var
from ansible_collections.metax.gpu.plugins.module_utils.vfio import backend
from ansible_collections.metax.gpu.plugins.module_utils.vfio.plan import PassthroughError
from ansible_collections.metax.gpu.plugins.module_utils.vfnum import backend as vfnum_backend
from ansible_collections.metax.gpu.plugins.module_utils.vfnum.plan import plan as vfnum_plan


class Recorder:
    """The Kube of vfio-manager against dicts: the ConfigMap's data, the node's annotations, Events."""

    def __init__(self, entry=None):
        self.data = {} if entry is None else {names.DRIVER_CONFIG_VFIO_KEY: yaml.safe_dump(entry)}
        self.annotations = {}
        self.events = []
        self.evicted = []

    def config(self):
        return dict(self.data)

    def annotate(self, annotations):
        for key, value in annotations.items():
            if value is None:
                self.annotations.pop(key, None)
            else:
                self.annotations[key] = value

    def event(self, reason, message, warning=True):
        self.events.append((reason, message))

    def evict(self, pods, timeout, holders):
        assert set(pods) <= set(holders())            # the pods it evicts are those holding the GPUs
        self.evicted.extend(pods)
        return list(pods)


def manager(host, kube, holders=None, evict=False):
    return VfioManager(host, kube, "vm", evict_in_use=evict, holders=(lambda: holders or {}), groups=GroupState(host))


def test_the_entry_hands_gpus_6_and_7_over_and_its_removal_hands_them_back(make_node):
    host = make_node("8xC500")
    kube = Recorder([{"nodeName": "vm", "gpus": "6,7"}, {"nodeName": "vm-2", "gpus": "all"}])
    agent = manager(host, kube)
    assert agent.round() == "applied"
    assert [g.driver for g in backend.read_node(host).gpus] == ["metax"] * 6 + ["vfio-pci"] * 2
    assert kube.annotations == {names.ANNOTATION_VFIO_IOMMU: "enabled"}
    assert kube.events[-1][0] == "VfioApplied"
    snap = agent.groups.snapshot()
    assert [g.id for g in snap.groups] == ["6", "7"] and all(g.ready for g in snap.groups)
    assert agent.round() == "unchanged"
    kube.data = {}
    assert agent.round() == "applied"
    assert [g.driver for g in backend.read_node(host).gpus] == ["metax"] * 8
    assert agent.groups.snapshot().groups == () and not host.exists(backend.RECORD)


def test_no_iommu_says_it_once_and_stays_quiet(make_node):
    host = make_node("8xC500-noiommu")
    kube = Recorder([{"nodeName": "vm", "gpus": "all"}])
    agent = manager(host, kube)
    for _round in range(3):
        assert agent.round() == "no-iommu"
    assert kube.events == [("IOMMUDisabled", "IOMMU support is missing on node vm. "
                                             "Please ensure that IOMMU is enabled on the node")]
    assert kube.annotations == {names.ANNOTATION_VFIO_IOMMU: "disabled"}
    assert [g.driver for g in backend.read_node(host).gpus] == ["metax"] * 8


def test_in_use_is_refused_reported_and_nothing_changes(make_node):
    host = make_node("8xC500")
    bdf7 = backend.read_node(host).gpus[7].bdf
    kube = Recorder([{"nodeName": "vm", "gpus": "7"}])
    agent = manager(host, kube, holders={bdf7: ["default/train"]})
    with pytest.raises(PassthroughError, match="default/train") as info:
        agent.round()
    agent.report(info.value)
    assert "evictInUse" in kube.annotations[names.ANNOTATION_VFIO_MESSAGE]
    assert kube.events[-1][0] == "VfioFailed"
    assert [g.driver for g in backend.read_node(host).gpus] == ["metax"] * 8
    agent.report(info.value)                     # the same failure again: not said twice
    assert [e[0] for e in kube.events].count("VfioFailed") == 1


def test_evict_in_use_evicts_the_holders_then_hands_over(make_node):
    host = make_node("8xC500")
    bdf7 = backend.read_node(host).gpus[7].bdf
    kube = Recorder([{"nodeName": "vm", "gpus": "7"}])
    holders = {bdf7: ["default/train"]}
    agent = VfioManager(host, kube, "vm", evict_in_use=True, holders=lambda: holders if not kube.evicted else {})
    assert agent.round() == "applied" and kube.evicted == ["default/train"]


def test_a_pf_with_vfs_gives_them_up_and_gets_them_back(make_node):
    host = make_node("2xC550-sriov")
    vfnum_backend.apply(host, vfnum_plan(vfnum_backend.read_pfs(host), 4))
    kube = Recorder([{"nodeName": "vm", "gpus": "0"}])
    agent = manager(host, kube)
    assert agent.round() == "applied"
    assert [g.numvfs for g in backend.read_node(host).gpus] == [0, 4]
    kube.data = {}
    assert agent.round() == "applied"
    assert [g.numvfs for g in backend.read_node(host).gpus] == [4, 4]


def test_bad_entry_is_a_reported_error(make_node):
    host = make_node("1xC500")
    kube = Recorder()
    kube.data = {names.DRIVER_CONFIG_VFIO_KEY: "- nodeName: vm\n  gpus: six\n"}
    with pytest.raises(PassthroughError, match="six"):
        manager(host, kube).round()


def test_allocate_gives_the_vfio_nodes_and_kubevirts_variable(make_node):
    host = make_node("8xC500")
    backend.apply(host, backend_plan(host, [6, 7]))
    state = GroupState(host)
    state.refresh()
    snap = state.snapshot()
    result = container_allocation(host, snap, ["7"])
    assert [d[0] for d in result["devices"]] == ["/dev/vfio/vfio", "/dev/vfio/7"]
    assert result["devices"][1][1] == host.join("dev/vfio/7")
    assert result["envs"] == {"PCI_RESOURCE_METAX-TECH_COM_VFIO-GPU": backend.read_node(host).gpus[7].bdf}
    both = container_allocation(host, snap, ["7", "6"])["envs"][kubevirt_env_var()]
    assert both.split(",") == [g.bdf for g in backend.read_node(host).gpus[6:]]
    for ids in ([], ["7", "7"], ["3"]):
        with pytest.raises(RequestError):
            container_allocation(host, snap, ids)


def backend_plan(host, indices):
    from ansible_collections.metax.gpu.plugins.module_utils.vfio.plan import plan
    return plan(backend.read_node(host), to_vm=indices)


def test_kubevirt_spelling():
    # KubeVirt's util.ResourceNameToEnvVar: upper case, "/" and "." to "_" (dashes stay)
    assert kubevirt_env_var("metax-tech.com/vfio-gpu") == "PCI_RESOURCE_METAX-TECH_COM_VFIO-GPU"
    assert kubevirt_env_var("nvidia.com/GA102") == "PCI_RESOURCE_NVIDIA_COM_GA102"


def test_run_survives_failures_and_stops(make_node):
    host = make_node("1xC500")

    class Broken(Recorder):
        def config(self):
            raise RuntimeError("apiserver away")
    stop = threading.Event()
    agent = manager(host, Broken())
    thread = threading.Thread(target=vfio_manager.run, args=(agent, agent.groups, None, stop, 0.05))
    thread.start()
    stop.wait(0.3)
    stop.set()
    thread.join(60)
    assert not thread.is_alive()


def test_usage_errors():
    with pytest.raises(SystemExit):
        vfio_manager.build_parser().parse_args(["--interval", "0"])
