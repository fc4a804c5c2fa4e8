"""metax.gpu.gpu_passthrough run in-process against simulated nodes."""
from __future__ import annotations

import os

import pytest

from ansible_collections.metax.gpu.plugins.modules import gpu_passthrough
from ansible_collections.metax.gpu.plugins.module_utils.vfio import backend
from ansible_collections.metax.gpu.plugins.module_utils.vfnum import backend as vfnum_backend
from ansible_collections.metax.gpu.plugins.module_utils.vfnum.plan import plan as vfnum_plan

from module_runner import run_module, tree


def _run(host, check_mode=False, diff=True, **args):
    return run_module(gpu_passthrough, dict(args, host_root=host.path, node_name="vm"), check_mode=check_mode,
                      diff=diff)


def _drivers(host):
    return [g.driver for g in backend.read_node(host).gpus]


def test_gpus_6_and_7_to_vms_and_back(make_node):
    host = make_node("8xC500")
    before = tree(host.path)
    failed, result = _run(host, gpus=["6", "7"])
    assert not failed and result["changed"] is True and result["iommu"] is True
    assert _drivers(host) == ["metax"] * 6 + ["vfio-pci"] * 2
    bdfs = [g.bdf for g in backend.read_node(host).gpus]
    assert [(d["index"], d["driver_before"], d["driver_after"]) for d in result["devices"]] == [
        (6, "metax", "vfio-pci"), (7, "metax", "vfio-pci")]
    assert result["vm_gpus"] == [{"bdf": bdfs[6], "iommu_group": 6}, {"bdf": bdfs[7], "iommu_group": 7}]
    assert result["diff"]["after"][bdfs[6]] == {"driver": "vfio-pci", "vfnum": 0}
    again = _run(host, gpus=["6", "7"])[1]
    assert again["changed"] is False
    failed, result = _run(host, state="absent")
    assert not failed and result["changed"] is True and result["vm_gpus"] == []
    # every file as it was; only the (shared) record directory stays
    after = tree(host.path)
    assert {k: v for k, v in after.items() if "/var" not in k} == before
    assert {v for k, v in after.items() if "/var" in k} == {"dir"}


def test_check_mode_predicts_and_writes_nothing(make_node):
    host = make_node("2xC550-sriov")
    vfnum_backend.apply(host, vfnum_plan(vfnum_backend.read_pfs(host), 4))
    before = tree(host.path)
    failed, checked = _run(host, check_mode=True, gpus=["0"])
    assert not failed and checked["changed"] is True and tree(host.path) == before
    assert [(d["vfnum_before"], d["vfnum_after"], d["driver_after"]) for d in checked["devices"]] == [(4, 0, "vfio-pci")]
    failed, real = _run(host, gpus=["0"])
    assert not failed and real["devices"] == checked["devices"] and real["diff"] == checked["diff"]
    # handing it back restores vfnum 4
    failed, back = _run(host, state="absent", gpus=["0"])
    assert not failed and back["devices"][0]["vfnum_after"] == 4
    assert [g.numvfs for g in backend.read_node(host).gpus] == [4, 4]


def test_in_use_is_refused_and_nothing_changes(make_node):
    host = make_node("8xC500")
    fd_dir = host.join("proc/77/fd")
    os.makedirs(fd_dir)
    os.symlink("/dev/dri/renderD134", os.path.join(fd_dir, "5"))
    before = tree(host.path)
    failed, result = _run(host, gpus=["6"])
    assert failed and "in use" in result["msg"] and "renderD134" in result["msg"]
    assert tree(host.path) == before
    failed, result = _run(host, gpus=["7"], gpu_pods=["default/train"])
    assert failed and "default/train" in result["msg"] and tree(host.path) == before
    failed, result = _run(host, gpus=["6"], force=True)
    assert not failed and result["in_use"] and _drivers(host)[6] == "vfio-pci"


def test_no_iommu_fails_with_the_vendors_message(make_node):
    host = make_node("8xC500-noiommu")
    before = tree(host.path)
    failed, result = _run(host, gpus=["all"])
    assert failed and result["iommu"] is False
    assert result["msg"] == "IOMMU support is missing on node vm. Please ensure that IOMMU is enabled on the node"
    assert tree(host.path) == before
    # nothing held for VMs: handing back is nothing to do, not a failure
    failed, result = _run(host, state="absent")
    assert not failed and result["changed"] is False


@pytest.mark.parametrize("args,match", [
    ({"gpus": ["9"]}, "unknown GPU"), ({"gpus": []}, "gpus is required"), ({"gpus": ["zz:00.0"]}, "unknown GPU"),
])
def test_bad_input_is_refused_before_writing(make_node, args, match):
    host = make_node("8xC500")
    before = tree(host.path)
    failed, result = _run(host, **args)
    assert failed and match in result["msg"] and tree(host.path) == before
