"""Pure vfnum planning: validation, selection and the kernel's write order (unit + property tests)."""
from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from ansible_collections.metax.gpu.plugins.module_utils.errors import MetaxGpuError
from ansible_collections.metax.gpu.plugins.module_utils.vfnum.plan import (
    ALLOWED_VFNUMS, Change, PfState, VfnumError, plan, select,
)

PFS = (PfState(0, "0000:03:00.0", 8, 0), PfState(1, "0000:83:00.0", 8, 0))


def test_all_gpus_by_default_zero_to_four_is_one_write_each():
    result = plan(PFS, 4)
    assert result.changed
    assert [(c.bdf, c.before, c.after, c.writes) for c in result.changes] == [
        ("0000:03:00.0", 0, 4, (4,)), ("0000:83:00.0", 0, 4, (4,))]
    assert result.diff() == {"before": {"0000:03:00.0": 0, "0000:83:00.0": 0},
                             "after": {"0000:03:00.0": 4, "0000:83:00.0": 4}}


def test_non_zero_to_non_zero_goes_through_zero():
    result = plan([PfState(0, "0000:03:00.0", 8, 4)], 2)
    assert result.changes[0].writes == (0, 2)


def test_same_value_is_no_change_and_no_write():
    result = plan([PfState(0, "0000:03:00.0", 8, 4)], 4)
    assert not result.changed and result.changes[0].writes == ()


@pytest.mark.parametrize("bad", [3, 5, 16, -1, "4", True, None])
def test_values_outside_the_manuals_set_are_refused(bad):
    with pytest.raises(VfnumError, match="vfnum must be one of 0, 1, 2, 4, 8"):
        plan(PFS, bad)


def test_above_totalvfs_is_refused_naming_the_gpu_and_erange():
    with pytest.raises(VfnumError) as info:
        plan([PfState(0, "0000:03:00.0", 4, 0), PfState(1, "0000:83:00.0", 8, 0)], 8)
    assert "GPU 0 (0000:03:00.0) supports at most 4 VFs" in str(info.value)
    assert "ERANGE" in str(info.value) and "GPU 1" not in str(info.value)


def test_node_without_sriov_is_forbidden_but_zero_is_a_no_op():
    pfs = [PfState(0, "0000:03:00.0", 0, 0)]
    with pytest.raises(VfnumError, match="gpu.sriov=forbidden"):
        plan(pfs, 2)
    assert not plan(pfs, 0).changed


def test_mixed_node_refuses_the_gpu_without_sriov():
    with pytest.raises(VfnumError, match=r"GPU 1 \(0000:83:00.0\) does not support SR-IOV"):
        plan([PfState(0, "0000:03:00.0", 8, 0), PfState(1, "0000:83:00.0", 0, 0)], 2)


def test_no_gpu_is_an_error():
    with pytest.raises(VfnumError, match="no MetaX GPU"):
        plan([], 0)


def test_select_by_index_and_by_short_or_long_address():
    assert [p.index for p in select(PFS, ["1"])] == [1]
    assert [p.index for p in select(PFS, ["83:00.0", 0])] == [0, 1]
    assert [p.index for p in select(PFS, ["00000000:83:00.0", "1"])] == [1]
    assert select(PFS, None) == list(PFS) and select(PFS, []) == list(PFS)


def test_select_unknown_names_every_unknown_and_what_exists():
    with pytest.raises(VfnumError) as info:
        select(PFS, ["7", "zz", "0"])
    assert "'7'" in str(info.value) and "'zz'" in str(info.value)
    assert "0 (0000:03:00.0), 1 (0000:83:00.0)" in str(info.value)


def test_errors_derive_from_the_collection_base():
    assert issubclass(VfnumError, MetaxGpuError)


# -- properties -------------------------------------------------------------
TOTALS = st.sampled_from([0, 1, 2, 4, 8, 16])


@st.composite
def nodes(draw):
    count = draw(st.integers(min_value=1, max_value=8))
    pfs = []
    for i in range(count):
        total = draw(TOTALS)
        numvfs = draw(st.sampled_from([v for v in ALLOWED_VFNUMS if v <= total]))
        pfs.append(PfState(i, "0000:%02x:00.0" % (i + 3), total, numvfs))
    return pfs


def _simulate_kernel(change: Change) -> int:
    """The kernel's rules applied to the planned writes; fails the test on EBUSY/ERANGE."""
    current = change.before
    for value in change.writes:
        assert value <= change.totalvfs, "ERANGE"
        assert not (current and value and current != value), "EBUSY"
        current = value
    return current


@given(nodes(), st.sampled_from(ALLOWED_VFNUMS), st.data())
def test_a_valid_plan_reaches_the_target_by_writes_the_kernel_accepts(pfs, vfnum, data):
    devices = data.draw(st.lists(st.sampled_from([str(p.index) for p in pfs]), max_size=3))
    try:
        result = plan(pfs, vfnum, devices)
    except VfnumError:
        chosen = select(pfs, devices)
        assert vfnum > 0 and any(p.totalvfs < vfnum and p.numvfs != vfnum for p in chosen) or \
            not any(p.totalvfs for p in pfs)
        return
    chosen = select(pfs, devices)
    assert [c.bdf for c in result.changes] == [p.bdf for p in chosen]
    for change in result.changes:
        assert _simulate_kernel(change) == vfnum
        assert len(change.writes) <= 2
        assert change.changed == bool(change.writes)
    untouched = {p.bdf for p in pfs} - {p.bdf for p in chosen}
    assert not untouched & set(result.diff()["after"])


@given(nodes(), st.sampled_from(ALLOWED_VFNUMS))
def test_planning_twice_from_the_result_is_idempotent(pfs, vfnum):
    try:
        first = plan(pfs, vfnum)
    except VfnumError:
        return
    after = [PfState(p.index, p.bdf, p.totalvfs, vfnum) for p in pfs]
    assert first.changed == any(p.numvfs != vfnum for p in pfs)
    assert not plan(after, vfnum).changed
