"""The pure hand-over plan: the writes in the kernel's order, refusals before anything is written."""
from __future__ import annotations

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.vfio import sysfs
from ansible_collections.metax.gpu.plugins.module_utils.vfio.plan import TO_HOST, TO_VM, GpuState, IommuDisabled, \
    NodeState, PassthroughError, plan, reconcile, select

NULL = sysfs.NO_OVERRIDE


def gpu(i, driver="metax", override=NULL, numvfs=0, group=None, vfs=()):
    return GpuState(i, "0000:%02x:00.0" % (i + 3), driver, override, numvfs, 8 if numvfs else 0, tuple(vfs),
                    i if group is None else group)


def node(*gpus, iommu=True, vfio=True, records=None):
    return NodeState(tuple(gpus), iommu, vfio, records or {})


def test_hand_over_writes_override_first_then_unbind_then_probe():
    result = plan(node(gpu(0), gpu(1)), to_vm=[1])
    assert [s.index for s in result.steps] == [1]
    assert result.steps[0].writes == (
        ("sys/bus/pci/devices/0000:04:00.0/driver_override", "vfio-pci"),
        ("sys/bus/pci/drivers/metax/unbind", "0000:04:00.0"),
        ("sys/bus/pci/drivers_probe", "0000:04:00.0"))
    assert result.diff() == {"before": {"0000:04:00.0": {"driver": "metax", "vfnum": 0}},
                             "after": {"0000:04:00.0": {"driver": "vfio-pci", "vfnum": 0}}}


def test_a_pf_with_vfs_goes_through_vfnum_0_first():
    step = plan(node(gpu(0, numvfs=4, vfs=["0000:03:00.1"])), to_vm=[0]).steps[0]
    assert [w[0].rsplit("/", 1)[-1] for w in step.writes] == ["driver_override", "sriov_numvfs", "unbind",
                                                              "drivers_probe"]
    assert step.writes[1][1] == "0" and (step.vfnum_before, step.vfnum_after) == (4, 0)


def test_hand_back_restores_the_recorded_vfnum_and_clears_the_override():
    held = gpu(0, driver="vfio-pci", override="vfio-pci")
    step = plan(node(held, records={held.bdf: 4}), to_host=[0]).steps[0]
    assert step.action == TO_HOST and step.writes == (
        ("sys/bus/pci/drivers/vfio-pci/unbind", held.bdf),
        ("sys/bus/pci/devices/%s/driver_override" % held.bdf, "\n"),
        ("sys/bus/pci/drivers_probe", held.bdf),
        ("sys/bus/pci/devices/%s/sriov_numvfs" % held.bdf, "4"))


def test_where_they_are_already_is_no_step():
    held = gpu(1, driver="vfio-pci", override="vfio-pci")
    assert not plan(node(gpu(0), held), to_vm=[1], to_host=[0]).changed


def test_an_interrupted_hand_over_is_finished():
    half = gpu(0, driver=None, override="vfio-pci")
    assert plan(node(half), to_vm=[0]).steps[0].writes == (("sys/bus/pci/drivers_probe", half.bdf),)
    assert plan(node(half), to_host=[0]).steps[0].writes == (
        ("sys/bus/pci/devices/%s/driver_override" % half.bdf, "\n"), ("sys/bus/pci/drivers_probe", half.bdf))


def test_no_iommu_is_refused_with_the_vendors_words():
    with pytest.raises(IommuDisabled, match="IOMMU support is missing on node vm. Please ensure that IOMMU is enabled"):
        plan(node(gpu(0), iommu=False), to_vm=[0], node_name="vm")
    # nothing asked for VMs: nothing to refuse
    assert not plan(node(gpu(0), iommu=False), to_host=[0]).changed


@pytest.mark.parametrize("kwargs,match", [
    ({"to_vm": [3]}, "unknown GPU index"), ({"to_vm": [0], "to_host": [0]}, "both"),
])
def test_bad_requests(kwargs, match):
    with pytest.raises(PassthroughError, match=match):
        plan(node(gpu(0)), **kwargs)


def test_vfio_not_loaded_and_no_group():
    with pytest.raises(PassthroughError, match="modprobe vfio-pci"):
        plan(node(gpu(0), vfio=False), to_vm=[0])
    lonely = GpuState(0, "0000:03:00.0", "metax", NULL, 0, 0, (), None)
    with pytest.raises(PassthroughError, match="no IOMMU group"):
        plan(node(lonely), to_vm=[0])


def test_reconcile_hands_back_what_is_not_wanted_any_more():
    gpus = [gpu(0), gpu(1, driver="vfio-pci", override="vfio-pci"), gpu(2, driver="vfio-pci", override="vfio-pci")]
    result = reconcile(node(*gpus), wanted=[0, 2])
    assert [(s.index, s.action) for s in result.steps] == [(0, TO_VM), (1, TO_HOST)]
    assert not reconcile(node(gpu(0)), wanted=[]).changed


def test_select_by_index_address_or_all():
    gpus = [gpu(0), gpu(1)]
    assert [g.index for g in select(gpus, ["04:00.0"])] == [1]
    assert [g.index for g in select(gpus, ["all"])] == [0, 1]
    with pytest.raises(PassthroughError, match="unknown GPU"):
        select(gpus, ["9"])
