"""vfnum backend over simulated 2xC550-sriov nodes: the simulated kernel answers as the real one."""
from __future__ import annotations

import os
import stat
import sys

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.gpu.discovery import discover
from ansible_collections.metax.gpu.plugins.module_utils.host import SIM_KERNEL_HOOK
from ansible_collections.metax.gpu.plugins.module_utils.vfnum import backend
from ansible_collections.metax.gpu.plugins.module_utils.vfnum.plan import Change, Plan, VfnumError, plan


def _set(host, vfnum, devices=None):
    return backend.apply(host, plan(backend.read_pfs(host), vfnum, devices))


def test_read_pfs_matches_discovery_indexes(make_node):
    host = make_node("2xC550-sriov")
    pfs = backend.read_pfs(host)
    inventory = discover(host)
    assert [(p.index, p.bdf) for p in pfs] == [(g.index, g.bdf) for g in inventory.gpus]
    assert [(p.totalvfs, p.numvfs, p.vf_bdfs) for p in pfs] == [(8, 0, ()), (8, 0, ())]


def test_zero_to_four_to_two_to_zero_as_discovery_sees_it(make_node):
    host = make_node("2xC550-sriov")
    results = _set(host, 4)
    assert [(r["before"], r["after"]) for r in results] == [(0, 4), (0, 4)]
    assert len(discover(host).devices) == 8
    assert [len(p.vf_bdfs) for p in backend.read_pfs(host)] == [4, 4]
    # 4 -> 2 would be EBUSY written directly; the plan goes through 0
    results = _set(host, 2)
    assert [(r["before"], r["after"]) for r in results] == [(4, 2), (4, 2)]
    assert len(discover(host).devices) == 4
    _set(host, 0)
    assert len(discover(host).devices) == 2 and discover(host).sriov.status == "off"


def test_direct_non_zero_write_is_ebusy_and_named(make_node):
    host = make_node("2xC550-sriov")
    _set(host, 4, ["0"])
    pf = backend.read_pfs(host)[0]
    bad = Plan(vfnum=2, changes=(Change(0, pf.bdf, 8, 0, 2),))   # lies about 'before': one write
    with pytest.raises(backend.VfnumApplyError, match="EBUSY") as info:
        backend.apply(host, bad)
    assert info.value.results[0]["after"] == 4


def test_one_gpu_only_leaves_the_other_alone(make_node):
    host = make_node("2xC550-sriov")
    results = _set(host, 8, ["0000:%s" % backend.read_pfs(host)[1].bdf[5:]])
    assert [r["index"] for r in results] == [1]
    assert [p.numvfs for p in backend.read_pfs(host)] == [0, 8]


def test_node_without_sriov_refuses_before_writing(make_node):
    host = make_node("1xC500")
    with pytest.raises(VfnumError, match="forbidden"):
        _set(host, 2)


def _fewer_vfs_hook(host, cap):
    """Wrap the simulated kernel: sriov_numvfs writes above ``cap`` enable only ``cap`` VFs."""
    hook = host.join(SIM_KERNEL_HOOK)
    os.rename(hook, hook + "-real")
    with open(hook, "w") as handle:
        handle.write("""#!%s
import subprocess, sys
value = sys.stdin.read()
if sys.argv[2].endswith("sriov_numvfs") and int(value) > %d:
    value = "%d"
sys.exit(subprocess.run([sys.argv[0] + "-real"] + sys.argv[1:], input=value.encode()).returncode)
""" % (sys.executable, cap, cap))
    os.chmod(hook, stat.S_IRWXU)


def test_kernel_enabling_fewer_vfs_is_detected_by_reading_back(make_node):
    host = make_node("2xC550-sriov")
    _fewer_vfs_hook(host, 2)
    with pytest.raises(backend.VfnumApplyError, match="asked for 4 VFs, the kernel enabled 2") as info:
        _set(host, 4)
    # the first GPU stopped the run; the second was not touched
    assert [(r["index"], r["before"], r["after"]) for r in info.value.results] == [(0, 0, 2), (1, 0, 0)]
    assert [p.numvfs for p in backend.read_pfs(host)] == [2, 0]


def test_driver_not_loaded_is_explained(make_node):
    from ansible_collections.metax.gpu.plugins.module_utils.sim import generator
    host = make_node("2xC550-sriov")
    generator.unload_driver(host)
    with pytest.raises(backend.VfnumApplyError, match="metax kernel module loaded"):
        _set(host, 2)


def _hold_open(host, pid, node, comm="python"):
    fd_dir = host.join("proc/%d/fd" % pid)
    os.makedirs(fd_dir, exist_ok=True)
    os.symlink(node, os.path.join(fd_dir, "3"))
    with open(host.join("proc/%d/comm" % pid), "w") as handle:
        handle.write(comm + "\n")


def test_in_use_sees_open_vf_and_pf_nodes_and_pods(make_node):
    host = make_node("2xC550-sriov")
    _set(host, 2)
    pfs = backend.read_pfs(host)
    vf_nodes = sorted(backend.device_nodes(host, pfs[1].vf_bdfs))
    assert vf_nodes and all(n.startswith("/dev/dri/") for n in vf_nodes)
    _hold_open(host, 4242, vf_nodes[0], comm="train")
    changing_gpu1 = plan(pfs, 4, ["1"])
    assert backend.in_use(host, pfs, changing_gpu1) == ["process 4242 (train) holds %s open" % vf_nodes[0]]
    assert backend.in_use(host, pfs, plan(pfs, 4, ["0"])) == []
    assert backend.in_use(host, pfs, plan(pfs, 2)) == []       # nothing changes: nothing to break
    assert backend.in_use(host, pfs, plan(pfs, 4, ["0"]), ["ml/job-0"]) == [
        "pod ml/job-0 requests metax-tech.com/gpu on this node"]


def test_in_use_counts_the_pf_while_vfnum_is_zero(make_node):
    host = make_node("2xC550-sriov")
    pfs = backend.read_pfs(host)
    pf_nodes = sorted(backend.device_nodes(host, [pfs[0].bdf]))
    _hold_open(host, 7, pf_nodes[0])
    assert len(backend.in_use(host, pfs, plan(pfs, 2))) == 1


# -- property: any sequence of requests leaves sysfs and discovery where the model says --
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from ansible_collections.metax.gpu.plugins.module_utils.sim import generator  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.sim.spec import preset  # noqa: E402

REQUESTS = st.lists(st.tuples(st.sampled_from((0, 1, 2, 4, 8)),
                              st.sampled_from((None, ["0"], ["1"], ["0", "1"]))), min_size=1, max_size=3)


@pytest.fixture(scope="module")
def shared_sriov(tmp_path_factory):
    return generator.create(str(tmp_path_factory.mktemp("sriov")), preset("2xC550-sriov"))


# each write runs the simulated kernel as a process: few, meaningful examples
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(REQUESTS)
def test_any_request_sequence_matches_the_model(shared_sriov, requests):
    host = shared_sriov
    _set(host, 0)
    model = [0, 0]
    for vfnum, devices in requests:
        results = _set(host, vfnum, devices)
        chosen = [0, 1] if devices is None else sorted({int(d) for d in devices})
        assert [(r["index"], r["before"], r["after"]) for r in results] == [(i, model[i], vfnum) for i in chosen]
        for i in chosen:
            model[i] = vfnum
        assert [p.numvfs for p in backend.read_pfs(host)] == model
        assert len(discover(host, topology=False).devices) == sum(max(1, m) for m in model)
