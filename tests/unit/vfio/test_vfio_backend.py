"""Hand-over and hand-back on simulated nodes: the simulated kernel answers as the real one."""
from __future__ import annotations

import os

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.deviceplugin.devices import DeviceState
from ansible_collections.metax.gpu.plugins.module_utils.vfio import backend
from ansible_collections.metax.gpu.plugins.module_utils.vfio.plan import IommuDisabled, PassthroughError, plan, reconcile
from ansible_collections.metax.gpu.plugins.module_utils.vfnum import backend as vfnum_backend
from ansible_collections.metax.gpu.plugins.module_utils.vfnum.plan import VfnumError, plan as vfnum_plan

PCI = "sys/bus/pci/devices"


def hold(host, node, pid=4242, comm="train"):
    fd_dir = host.join("proc/%d/fd" % pid)
    os.makedirs(fd_dir, exist_ok=True)
    os.symlink(node, os.path.join(fd_dir, "3"))
    with open(host.join("proc/%d/comm" % pid), "w") as handle:
        handle.write(comm + "\n")


def snapshot(host):
    """Everything a hand-over may touch, to compare before and after a refusal."""
    out = {}
    for bdf in host.listdir(PCI):
        base = "%s/%s" % (PCI, bdf)
        out[bdf] = (host.readlink(base + "/driver"), host.read_attribute(base + "/driver_override", default=""),
                    host.read_attribute(base + "/sriov_numvfs", default="-"))
    out["dev/vfio"] = tuple(host.listdir("dev/vfio"))
    out["record"] = host.exists(backend.RECORD)
    return out


def test_gpus_6_and_7_to_vms_and_back_leave_nothing_behind(make_node):
    host = make_node("8xC500")
    before = snapshot(host)
    node = backend.read_node(host)
    results = backend.apply(host, plan(node, to_vm=[6, 7]))
    assert [(r["index"], r["driver_after"]) for r in results] == [(6, "vfio-pci"), (7, "vfio-pci")]
    node = backend.read_node(host)
    assert [g.driver for g in node.gpus] == ["metax"] * 6 + ["vfio-pci"] * 2
    assert sorted(host.listdir("dev/vfio")) == sorted(["vfio", "6", "7"])
    assert backend.recorded_vfnums(host) == {node.gpus[6].bdf: 0, node.gpus[7].bdf: 0}
    # the container pool: gpu-device's discovery sees the two GPUs unusable (no DRM nodes)
    state = DeviceState(host)
    state.refresh()
    assert len(state.snapshot().devices) == 8
    results = backend.apply(host, reconcile(node, wanted=[]))
    assert [(r["index"], r["driver_after"]) for r in results] == [(6, "metax"), (7, "metax")]
    assert snapshot(host) == before


def test_a_pf_with_vfs_loses_them_first_and_gets_them_back(make_node):
    host = make_node("2xC550-sriov")
    vfnum_backend.apply(host, vfnum_plan(vfnum_backend.read_pfs(host), 4))
    node = backend.read_node(host)
    results = backend.apply(host, plan(node, to_vm=[0]))
    assert (results[0]["vfnum_before"], results[0]["vfnum_after"]) == (4, 0)
    assert [g.numvfs for g in backend.read_node(host).gpus] == [0, 4]
    # vfnum leaves it alone while it is the VMs', and refuses it by name
    pfs = vfnum_backend.read_pfs(host)
    assert [p.for_vm for p in pfs] == [True, False]
    assert [c.index for c in vfnum_plan(pfs, 2).changes] == [1]
    with pytest.raises(VfnumError, match="handed to VMs"):
        vfnum_plan(pfs, 2, ["0"])
    results = backend.apply(host, reconcile(backend.read_node(host), wanted=[]))
    assert (results[0]["driver_after"], results[0]["vfnum_after"]) == ("metax", 4)
    assert [g.numvfs for g in backend.read_node(host).gpus] == [4, 4]
    assert not host.exists(backend.RECORD)


def test_a_gpu_in_use_is_named_and_nothing_changes(make_node):
    host = make_node("8xC500")
    hold(host, "/dev/dri/card6")
    before = snapshot(host)
    node = backend.read_node(host)
    wanted = plan(node, to_vm=[6, 7])
    reasons = backend.in_use(host, node, wanted, holders={node.gpus[7].bdf: ["default/train"]})
    assert reasons == ["GPU 6 (%s): process 4242 (train) holds /dev/dri/card6 open" % node.gpus[6].bdf,
                       "GPU 7 (%s): pod default/train holds device %s" % (node.gpus[7].bdf, node.gpus[7].bdf)]
    assert backend.in_use(host, node, plan(node, to_vm=[5])) == []
    assert snapshot(host) == before


def test_a_vm_holding_its_group_blocks_the_hand_back(make_node):
    host = make_node("8xC500")
    backend.apply(host, plan(backend.read_node(host), to_vm=[7]))
    node = backend.read_node(host)
    hold(host, "/dev/vfio/%d" % node.gpus[7].iommu_group, comm="qemu-kvm")
    reasons = backend.in_use(host, node, reconcile(node, wanted=[]))
    assert reasons == ["GPU 7 (%s): process 4242 (qemu-kvm) holds /dev/vfio/7 open" % node.gpus[7].bdf]


def test_no_iommu_refuses_before_writing(make_node):
    host = make_node("8xC500-noiommu")
    before = snapshot(host)
    node = backend.read_node(host)
    assert not node.iommu and all(g.iommu_group is None for g in node.gpus)
    with pytest.raises(IommuDisabled):
        plan(node, to_vm=[0], node_name="vm-4")
    assert snapshot(host) == before


def test_a_failed_write_stops_and_reports(make_node):
    host = make_node("8xC500")
    node = backend.read_node(host)
    wanted = plan(node, to_vm=[6, 7])
    generator_unload(host)
    with pytest.raises(backend.PassthroughApplyError, match="GPU 6") as info:
        backend.apply(host, wanted)
    assert [r["index"] for r in info.value.results] == [6, 7]
    assert info.value.results[1]["driver_after"] == "metax"       # untouched, as planned before


def generator_unload(host):
    # the metax driver unloaded between the plan and the writes: its unbind is ENOENT
    from ansible_collections.metax.gpu.plugins.module_utils.sim import generator
    generator.unload_driver(host)


def test_an_interrupted_hand_back_forgets_its_record(make_node):
    host = make_node("8xC500")
    backend.apply(host, plan(backend.read_node(host), to_vm=[0]))
    bdf = backend.read_node(host).gpus[0].bdf
    host.write_attribute("sys/bus/pci/drivers/vfio-pci/unbind", bdf)
    host.write_attribute("%s/%s/driver_override" % (PCI, bdf), "\n")
    host.write_attribute("sys/bus/pci/drivers_probe", bdf)
    assert backend.recorded_vfnums(host) == {bdf: 0}
    assert not reconcile(backend.read_node(host), wanted=[]).changed
    backend.forget_settled(host)
    assert not host.exists(backend.RECORD)


def test_unknown_root_is_an_error(tmp_path):
    from ansible_collections.metax.gpu.plugins.module_utils.host import HostRoot, HostRootError
    with pytest.raises((PassthroughError, HostRootError)):
        backend.read_node(HostRoot(str(tmp_path / "missing")))
