"""metax.gpu.vfnum run in-process against simulated 2xC550-sriov nodes."""
from __future__ import annotations

import json
import os

import pytest

from ansible_collections.metax.gpu.plugins.modules import vfnum
from ansible_collections.metax.gpu.plugins.module_utils.gpu.discovery import discover
from ansible_collections.metax.gpu.plugins.module_utils.vfnum import backend

from module_runner import run_module, tree


@pytest.fixture
def sriov(make_node):
    return make_node("2xC550-sriov")


def _numvfs(host):
    return [p.numvfs for p in backend.read_pfs(host)]


def _run(host, check_mode=False, diff=True, **args):
    return run_module(vfnum, dict(args, host_root=host.path), check_mode=check_mode, diff=diff)


def test_zero_to_four_and_back_with_before_after_per_device(sriov):
    failed, result = _run(sriov, vfnum=4)
    assert not failed and result["changed"] is True
    bdfs = [p.bdf for p in backend.read_pfs(sriov)]
    assert result["devices"] == [{"index": i, "bdf": b, "totalvfs": 8, "before": 0, "after": 4}
                                 for i, b in enumerate(bdfs)]
    assert result["diff"] == {"before": {b: 0 for b in bdfs}, "after": {b: 4 for b in bdfs}}
    inventory = discover(sriov)
    assert len(inventory.devices) == 8 and inventory.sriov.status == "on"
    failed, result = _run(sriov, vfnum=0)
    assert not failed and result["changed"] is True
    assert [(d["before"], d["after"]) for d in result["devices"]] == [(4, 0), (4, 0)]
    assert len(discover(sriov).devices) == 2


def test_idempotent_second_run_changes_nothing(sriov):
    assert _run(sriov, vfnum=2)[1]["changed"] is True
    before = tree(sriov.path)
    failed, result = _run(sriov, vfnum=2)
    assert not failed and result["changed"] is False
    assert tree(sriov.path) == before


@pytest.mark.parametrize("start,target", [(0, 4), (4, 8), (2, 0), (4, 4)])
def test_check_mode_predicts_the_real_run_and_writes_nothing(make_node, start, target):
    host = make_node("2xC550-sriov")
    if start:
        assert not _run(host, vfnum=start)[0]
    before = tree(host.path)
    failed_check, checked = _run(host, vfnum=target, check_mode=True)
    assert not failed_check and tree(host.path) == before
    failed_real, real = _run(host, vfnum=target)
    assert not failed_real
    assert (checked["changed"], checked["diff"], checked["devices"]) == \
        (real["changed"], real["diff"], real["devices"])
    assert _numvfs(host) == [target, target]


def test_non_zero_to_non_zero_succeeds_through_zero(sriov):
    _run(sriov, vfnum=4)
    failed, result = _run(sriov, vfnum=2)
    assert not failed and _numvfs(sriov) == [2, 2]


def test_devices_by_index_and_address(sriov):
    bdf1 = backend.read_pfs(sriov)[1].bdf
    failed, result = _run(sriov, vfnum=8, devices=[bdf1[5:]])
    assert not failed and [d["index"] for d in result["devices"]] == [1]
    assert _numvfs(sriov) == [0, 8]
    failed, result = _run(sriov, vfnum=1, devices=["0"])
    assert not failed and _numvfs(sriov) == [1, 8]


@pytest.mark.parametrize("args,message", [
    ({"vfnum": 3}, "value of vfnum must be one of: 0, 1, 2, 4, 8"),
    ({"vfnum": 2, "devices": ["5"]}, "unknown GPU(s) '5'"),
])
def test_bad_input_fails_clearly_and_changes_nothing(sriov, args, message):
    before = tree(sriov.path)
    failed, result = _run(sriov, **args)
    assert failed and message in result["msg"]
    assert "Traceback" not in json.dumps(result)
    assert tree(sriov.path) == before


def test_node_without_sriov_is_forbidden(make_node):
    host = make_node("1xC500")
    failed, result = _run(host, vfnum=2)
    assert failed and "gpu.sriov=forbidden" in result["msg"]
    failed, result = _run(host, vfnum=0)
    assert not failed and result["changed"] is False


def _hold_open(host, node):
    os.makedirs(host.join("proc/99/fd"))
    os.symlink(node, host.join("proc/99/fd/5"))


def test_refuses_while_a_vf_is_open_unless_forced(sriov):
    _run(sriov, vfnum=2)
    vf = backend.read_pfs(sriov)[0].vf_bdfs[0]
    node = sorted(backend.device_nodes(sriov, [vf]))[0]
    _hold_open(sriov, node)
    before = tree(sriov.path)
    for check_mode in (True, False):
        failed, result = _run(sriov, vfnum=4, check_mode=check_mode)
        assert failed and "refusing to change vfnum of GPUs in use" in result["msg"]
        assert result["in_use"] == ["process 99 (?) holds %s open" % node]
    assert tree(sriov.path) == before
    # the other GPU is free
    assert not _run(sriov, vfnum=4, devices=["1"])[0]
    failed, result = _run(sriov, vfnum=4, force=True)
    assert not failed and result["changed"] is True and result["in_use"]
    assert _numvfs(sriov) == [4, 4]


def test_gpu_pods_reported_by_the_caller_block_the_change(sriov):
    failed, result = _run(sriov, vfnum=2, gpu_pods=["ml/train-0"])
    assert failed and "pod ml/train-0 requests metax-tech.com/gpu" in result["msg"]
    assert _numvfs(sriov) == [0, 0]
    # no change planned: pods are no reason to fail
    failed, result = _run(sriov, vfnum=0, gpu_pods=["ml/train-0"])
    assert not failed and result["changed"] is False


def test_missing_root_fails_with_a_clear_message(tmp_path):
    failed, result = run_module(vfnum, {"vfnum": 0, "host_root": str(tmp_path / "absent")})
    assert failed and "does not exist" in result["msg"]
