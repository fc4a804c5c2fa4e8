"""The node-maintenance protocol's plan (module_utils/maintenance/plan.py): owners, cordons, records."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from ansible_collections.metax.gpu.plugins.module_utils import names as N
from ansible_collections.metax.gpu.plugins.module_utils.maintenance import plan as P
from ansible_collections.metax.gpu.plugins.module_utils.maintenance.plan import (
    MaintenanceConflict, MaintenanceError, node_view, owner_of, plan_pause, plan_resume)

UPGRADE, VFNUM, MANAGER, HEALTH = (N.MAINTENANCE_OWNER_DRIVER_UPGRADE, N.MAINTENANCE_OWNER_SET_VFNUM,
                                   N.MAINTENANCE_OWNER_DRIVER_MANAGER, N.MAINTENANCE_OWNER_HEALTH)


def node(labels=None, annotations=None, cordoned=False, name="gpu-1"):
    return node_view({"metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}},
                      "spec": {"unschedulable": True} if cordoned else {}})


def applied(view, change):
    """``view`` after ``change``'s merge patch, as the API server would hold it."""
    labels, annotations = dict(view.labels), dict(view.annotations)
    for have, edit in ((labels, change.labels), (annotations, change.annotations)):
        for key, value in edit.items():
            if value is None:
                have.pop(key, None)
            else:
                have[key] = value
    cordoned = view.cordoned if change.unschedulable is None else change.unschedulable
    return P.NodeView(view.name, labels, annotations, cordoned)


def test_the_owners_are_names_pys():
    assert set(P.STATE_KEYS) == set(N.MAINTENANCE_OWNERS)
    with pytest.raises(MaintenanceError, match="expected one of"):
        plan_pause(node(), "someone")


def test_pause_of_a_schedulable_node_cordons_records_it_as_ours_and_pauses_the_agents_in_one_patch():
    change = plan_pause(node(), UPGRADE, procedure_state="paused")
    assert change.patch == {
        "metadata": {"labels": {N.LABEL_AGENTS_PAUSED: UPGRADE, N.LABEL_DRIVER_UPGRADE_STATE: "paused"},
                     "annotations": {N.ANNOTATION_MAINTENANCE_OWNER: UPGRADE,
                                     N.ANNOTATION_MAINTENANCE_CORDON: N.MAINTENANCE_CORDON_OURS}},
        "spec": {"unschedulable": True}}
    assert change.holder is None and not change.cordon_kept
    assert change.before["unschedulable"] is False and change.after["unschedulable"] is True


def test_pause_then_resume_leaves_the_node_as_it_was():
    before = node(labels={"other": "x"})
    paused = applied(before, plan_pause(before, UPGRADE, procedure_state="paused"))
    resumed = applied(paused, plan_resume(paused, UPGRADE, procedure_state=""))
    assert resumed == before


def test_an_administrators_cordon_is_recorded_and_kept_by_the_resume():
    before = node(cordoned=True)
    change = plan_pause(before, HEALTH)
    assert change.unschedulable is None and change.cordon_kept
    assert change.annotations[N.ANNOTATION_MAINTENANCE_CORDON] == N.MAINTENANCE_CORDON_ADMIN
    paused = applied(before, change)
    resume = plan_resume(paused, HEALTH)
    assert resume.unschedulable is None and resume.cordon_kept
    after = applied(paused, resume)
    assert after.cordoned and after.annotations == {} and after.labels == {}


def test_a_cordon_set_while_held_is_ours_only_if_the_hold_made_it():
    # the administrator cordons a node we hold without a cordon (set_vfnum does not cordon): kept
    held = applied(node(), plan_pause(node(), VFNUM, cordon=False))
    admin = P.NodeView(held.name, held.labels, held.annotations, True)
    assert plan_resume(admin, VFNUM).unschedulable is None


def test_another_owners_pause_is_refused_naming_the_holder_in_both_directions():
    held = applied(node(), plan_pause(node(), VFNUM, cordon=False))
    for plan in (plan_pause, plan_resume):
        with pytest.raises(MaintenanceConflict) as info:
            plan(held, UPGRADE)
        assert info.value.holder == VFNUM and info.value.owner == UPGRADE
        assert "held by set-vfnum's maintenance" in str(info.value) and "gpu-1" in str(info.value)


def test_a_pause_label_from_before_the_protocol_names_its_owner():
    assert owner_of(node(labels={N.LABEL_AGENTS_PAUSED: "true"})) == UPGRADE
    assert owner_of(node(labels={N.LABEL_AGENTS_PAUSED: VFNUM})) == VFNUM
    assert owner_of(node()) is None
    # the driver upgrade takes over its own old pause, and rewrites the value
    change = plan_pause(node(labels={N.LABEL_AGENTS_PAUSED: "true"}), UPGRADE, cordon=False)
    assert change.holder == UPGRADE and change.labels[N.LABEL_AGENTS_PAUSED] == UPGRADE
    with pytest.raises(MaintenanceConflict):
        plan_pause(node(labels={N.LABEL_AGENTS_PAUSED: "true"}), VFNUM)


def test_the_record_wins_over_the_pause_label():
    view = node(labels={N.LABEL_AGENTS_PAUSED: "true"}, annotations={N.ANNOTATION_MAINTENANCE_OWNER: HEALTH})
    assert owner_of(view) == HEALTH


def test_the_same_owner_pausing_again_changes_nothing():
    view = node()
    for _run in range(2):
        change = plan_pause(view, UPGRADE, procedure_state="paused")
        view = applied(view, change)
    assert not change.changed and change.patch == {} and change.holder == UPGRADE


def test_unpausing_the_agents_keeps_the_hold_and_the_cordon():
    paused = applied(node(), plan_pause(node(), UPGRADE, procedure_state="paused"))
    change = plan_pause(paused, UPGRADE, pause_agents=False, procedure_state="validating")
    assert change.patch == {"metadata": {"labels": {N.LABEL_AGENTS_PAUSED: None,
                                                    N.LABEL_DRIVER_UPGRADE_STATE: "validating"}}}
    after = applied(paused, change)
    assert owner_of(after) == UPGRADE and after.cordoned


def test_cordon_false_never_lifts_a_cordon():
    paused = applied(node(), plan_pause(node(), UPGRADE))
    assert plan_pause(paused, UPGRADE, cordon=False, pause_agents=True).unschedulable is None


def test_a_failed_node_stays_cordoned_and_a_later_hold_still_knows_the_cordon_is_ours():
    paused = applied(node(), plan_pause(node(), UPGRADE, procedure_state="paused"))
    failed = applied(paused, plan_resume(paused, UPGRADE, uncordon=False, procedure_state="failed",
                                         message="validation: no labels"))
    assert failed.cordoned and owner_of(failed) is None
    assert failed.annotations[N.ANNOTATION_MAINTENANCE_CORDON] == N.MAINTENANCE_CORDON_OURS
    assert failed.labels[N.LABEL_DRIVER_UPGRADE_STATE] == "failed"
    assert failed.annotations[N.ANNOTATION_DRIVER_UPGRADE_MESSAGE] == "validation: no labels"
    # a resume without a hold never uncordons
    assert plan_resume(failed, UPGRADE).unschedulable is None
    # the re-run holds it again: the cordon is still ours, so it is lifted at the end
    again = applied(failed, plan_pause(failed, UPGRADE, procedure_state="paused"))
    assert again.annotations[N.ANNOTATION_MAINTENANCE_CORDON] == N.MAINTENANCE_CORDON_OURS
    done = applied(again, plan_resume(again, UPGRADE, procedure_state="", message=""))
    assert not done.cordoned and done.labels == {} and done.annotations == {}


def test_an_admin_cordoned_node_left_failed_keeps_the_admins_cordon_after_the_rerun():
    paused = applied(node(cordoned=True), plan_pause(node(cordoned=True), UPGRADE))
    failed = applied(paused, plan_resume(paused, UPGRADE, uncordon=False, procedure_state="failed"))
    again = applied(failed, plan_pause(failed, UPGRADE))
    done = applied(again, plan_resume(again, UPGRADE, procedure_state=""))
    assert done.cordoned


@pytest.mark.parametrize("annotations, state, ours", [
    ({N.ANNOTATION_PRE_CORDONED: "true"}, "failed", False),              # the administrator's, recorded
    ({}, "failed", True),                                                 # left by an earlier run
    ({N.ANNOTATION_DRIVER_UPGRADE_IN_PLACE: "true"}, "failed", False),  # in place: never cordoned by us
    ({}, None, False),                                                    # cordoned, no upgrade: the admin's
])
def test_the_driver_upgrades_cordons_from_before_the_protocol_read_as_they_did(annotations, state, ours):
    labels = {N.LABEL_DRIVER_UPGRADE_STATE: state} if state else {}
    view = node(labels=labels, annotations=annotations, cordoned=True)
    paused = applied(view, plan_pause(view, UPGRADE))
    resume = plan_resume(paused, UPGRADE, procedure_state="")
    assert (resume.unschedulable is False) is ours
    if not ours:
        assert resume.cordon_kept
    assert N.ANNOTATION_PRE_CORDONED not in applied(paused, resume).annotations


def test_the_old_rule_is_the_driver_upgrades_only():
    # set_vfnum never cordoned: its state label says nothing about a cordon
    view = node(labels={N.LABEL_VFNUM_STATE: "success"}, cordoned=True)
    paused = applied(view, plan_pause(view, VFNUM))
    assert plan_resume(paused, VFNUM).unschedulable is None


def test_procedure_state_and_message_go_to_the_owners_own_keys():
    change = plan_pause(node(), VFNUM, cordon=False, procedure_state="pending", message="")
    assert change.labels[N.LABEL_VFNUM_STATE] == "pending"
    assert N.ANNOTATION_VFNUM_MESSAGE not in change.annotations          # "" removes: nothing to remove
    with_message = node(annotations={N.ANNOTATION_VFNUM_MESSAGE: "old"})
    assert plan_pause(with_message, VFNUM, message="").annotations[N.ANNOTATION_VFNUM_MESSAGE] is None
    with pytest.raises(MaintenanceError, match="health has no procedure_state"):
        plan_pause(node(), HEALTH, procedure_state="x")


def test_a_resume_with_no_hold_writes_only_the_owners_state():
    change = plan_resume(node(labels={N.LABEL_VFNUM_STATE: "pending"}), VFNUM, procedure_state="failed",
                         message="why")
    assert change.patch == {"metadata": {"labels": {N.LABEL_VFNUM_STATE: "failed"},
                                         "annotations": {N.ANNOTATION_VFNUM_MESSAGE: "why"}}}
    assert not plan_resume(node(), VFNUM).changed


def test_an_agents_hold_never_touches_the_cordon_or_the_agents():
    change = plan_pause(node(), MANAGER, cordon=False, pause_agents=False)
    assert change.patch == {"metadata": {"annotations": {N.ANNOTATION_MAINTENANCE_OWNER: MANAGER}}}
    held = applied(node(), change)
    assert plan_resume(held, MANAGER, uncordon=False).patch == {
        "metadata": {"annotations": {N.ANNOTATION_MAINTENANCE_OWNER: None}}}


def test_node_view_reads_a_node_or_its_metadata():
    full = node_view({"metadata": {"name": "a", "labels": None}, "spec": {"unschedulable": True}})
    assert full.name == "a" and full.cordoned and full.labels == {}
    meta = node_view({"name": "b", "labels": {"k": "v"}, "annotations": {}})
    assert meta.name == "b" and meta.labels == {"k": "v"} and not meta.cordoned
    assert P.held({"metadata": {"annotations": {N.ANNOTATION_MAINTENANCE_OWNER: HEALTH}}}) == HEALTH


def test_the_agents_labels_go_and_the_day_two_labels_stay():
    labels = {N.LABEL_GPU_INSTALLED: "true", N.LABEL_DRIVER_MAJOR: "2", "kubernetes.io/os": "linux",
              N.LABEL_DRIVER_UPGRADE_STATE: "paused", N.LABEL_AGENTS_PAUSED: UPGRADE, N.LABEL_VFNUM_STATE: "success"}
    view = node(labels=labels, annotations={N.ANNOTATION_MAINTENANCE_OWNER: UPGRADE,
                                            N.ANNOTATION_MAINTENANCE_CORDON: N.MAINTENANCE_CORDON_OURS},
                cordoned=True)
    change = plan_pause(view, UPGRADE, procedure_state="paused", remove_agent_labels=True)
    assert change.patch == {"metadata": {"labels": {N.LABEL_DRIVER_MAJOR: None, N.LABEL_GPU_INSTALLED: None}}}
    assert P.agent_label_removal(labels) == {N.LABEL_GPU_INSTALLED: None, N.LABEL_DRIVER_MAJOR: None}


def test_a_cordon_the_administrator_keeps_after_clearing_a_failed_node_is_theirs():
    paused = applied(node(), plan_pause(node(), UPGRADE, procedure_state="paused"))
    failed = applied(paused, plan_resume(paused, UPGRADE, uncordon=False, procedure_state="failed"))
    # the administrator clears the state and keeps the node cordoned (the record is left behind)
    cleared = P.NodeView(failed.name, {}, dict(failed.annotations), True)
    again = applied(cleared, plan_pause(cleared, UPGRADE))
    assert again.annotations[N.ANNOTATION_MAINTENANCE_CORDON] == N.MAINTENANCE_CORDON_ADMIN
    assert applied(again, plan_resume(again, UPGRADE)).cordoned


# -- properties over any node and any sequence of requests ---------------------------------

OWNERS = st.sampled_from(N.MAINTENANCE_OWNERS)
STEPS = st.lists(st.tuples(st.sampled_from(("pause", "resume")), OWNERS, st.booleans(), st.booleans()), max_size=8)


@st.composite
def nodes(draw):
    labels, annotations = {}, {}
    if draw(st.booleans()):
        labels[N.LABEL_AGENTS_PAUSED] = draw(st.sampled_from(("true",) + N.MAINTENANCE_OWNERS))
    if draw(st.booleans()):
        labels[N.LABEL_DRIVER_UPGRADE_STATE] = draw(st.sampled_from(N.DRIVER_UPGRADE_STATES))
    if draw(st.booleans()):
        annotations[N.ANNOTATION_PRE_CORDONED] = "true"
    return node(labels=labels, annotations=annotations, cordoned=draw(st.booleans()))


@settings(max_examples=300, deadline=None)
@given(nodes(), STEPS)
def test_an_administrators_cordon_is_never_lifted_and_one_owner_holds_at_a_time(start, steps):
    view = start
    # a cordon present at the start with no hold, recorded as the administrator's or without a state of the
    # driver upgrade (the one procedure that cordoned before the protocol), is the administrator's
    admins = start.cordoned and owner_of(start) is None and (
        N.ANNOTATION_PRE_CORDONED in start.annotations or N.LABEL_DRIVER_UPGRADE_STATE not in start.labels)
    for action, owner, flag_a, flag_b in steps:
        holder = owner_of(view)
        try:
            if action == "pause":
                change = plan_pause(view, owner, cordon=flag_a, pause_agents=flag_b)
            else:
                change = plan_resume(view, owner, uncordon=flag_a)
        except MaintenanceConflict as exc:
            assert holder is not None and holder != owner and exc.holder == holder
            continue
        assert holder in (None, owner)
        if admins:
            assert change.unschedulable is not False, "the administrator's cordon was lifted"
        if change.unschedulable is False:
            assert action == "resume" and holder == owner      # only a hold lifts, and only its own
        view = applied(view, change)
        if action == "pause":
            assert owner_of(view) == owner
        else:
            assert N.ANNOTATION_MAINTENANCE_OWNER not in view.annotations
            assert view.labels.get(N.LABEL_AGENTS_PAUSED) in (None,) + tuple(o for o in ("true",) + N.MAINTENANCE_OWNERS
                                                                             if P.LEGACY_PAUSE.get(o, o) != owner)


@settings(max_examples=200, deadline=None)
@given(st.booleans(), OWNERS)
def test_pause_then_resume_of_a_free_node_gives_it_back_as_it_was(cordoned, owner):
    before = node(labels={"kubernetes.io/hostname": "gpu-1"}, cordoned=cordoned)
    paused = applied(before, plan_pause(before, owner))
    assert paused.cordoned and owner_of(paused) == owner
    assert applied(paused, plan_resume(paused, owner)) == before


@st.composite
def upgrade_nodes(draw):
    """:func:`nodes`, and a hold or a cordon record left by a run that stopped half-way (any owner's)."""
    view = draw(nodes())
    annotations = dict(view.annotations)
    if draw(st.booleans()):
        annotations[N.ANNOTATION_MAINTENANCE_OWNER] = draw(OWNERS)
    if draw(st.booleans()):
        annotations[N.ANNOTATION_MAINTENANCE_CORDON] = draw(st.sampled_from((N.MAINTENANCE_CORDON_OURS,
                                                                            N.MAINTENANCE_CORDON_ADMIN)))
    return P.NodeView(view.name, view.labels, annotations, view.cordoned)


@settings(max_examples=500, deadline=None)
@given(upgrade_nodes())
def test_the_driver_upgrades_one_cordon_and_pause_ends_where_its_former_cordon_then_pause_did(start):
    """roles/driver_upgrade/tasks/batch.yml holds, cordons and pauses a node in one node_maintenance run
    (procedure_state paused, wait_agents false); it was a cordon run (pause_agents false) and then a pause
    run. Same refusals, same node after, and the one patch is the two patches' keys (less a pause label
    a re-run took off and put back)."""
    try:
        first = plan_pause(start, UPGRADE, pause_agents=False)
    except MaintenanceConflict as exc:
        with pytest.raises(MaintenanceConflict) as merged_exc:
            plan_pause(start, UPGRADE, procedure_state="paused")
        assert merged_exc.value.holder == exc.holder
        return
    middle = applied(start, first)
    second = plan_pause(middle, UPGRADE, procedure_state="paused")
    merged = plan_pause(start, UPGRADE, procedure_state="paused")
    assert applied(start, merged) == applied(middle, second)
    assert merged.cordon_kept == first.cordon_kept
    two = dict(first.labels, **second.labels)
    if two.get(N.LABEL_AGENTS_PAUSED) == start.labels.get(N.LABEL_AGENTS_PAUSED):
        two.pop(N.LABEL_AGENTS_PAUSED)            # taken off by the cordon run, put back by the pause run
    assert merged.labels == two
    assert merged.annotations == dict(first.annotations, **second.annotations)
    assert merged.unschedulable == (first.unschedulable if second.unschedulable is None else second.unschedulable)
