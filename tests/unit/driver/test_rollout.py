"""The rollout planner (module_utils/driver/rollout.py): properties over random fleets and policies,
then the worked examples of docs/operator.md and docs/day-two.md."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from ansible_collections.metax.gpu.plugins.module_utils import names as N
from ansible_collections.metax.gpu.plugins.module_utils.driver.rollout import (
    WAIT_BUDGET, WAIT_HELD, WAIT_NOT_READY, WAIT_PARALLEL, WAIT_PAUSED, WAIT_PAYLOAD, WAIT_SKIP, WAIT_STEP,
    WAIT_STEP_PAUSE,
    Policy, PolicyError, RolloutNode, Step, StepPause, count_of, decide, finished_node, plan_batches, same_version)

OLD, NEW = "2.14.6", "2.40.1"
STATES = (None, None, None) + N.DRIVER_UPGRADE_STATES


@st.composite
def rollout_nodes(draw, max_size=14):
    count = draw(st.integers(0, max_size))
    nodes = []
    for i in range(count):
        cordoned = draw(st.booleans())
        state = draw(st.sampled_from(STATES))
        recorded = draw(st.booleans())
        nodes.append(RolloutNode(
            name="n%02d" % i, ready=draw(st.booleans() | st.just(True)), cordoned=cordoned,
            admin_cordoned=recorded or (cordoned and state is None), state=state,
            skip=draw(st.sampled_from((False, False, False, True))),
            current_version=draw(st.sampled_from((OLD, OLD, NEW, None))), target_version=NEW,
            declared=draw(st.sampled_from((True, True, True, False)))))
    return nodes


int_or_percent = st.integers(1, 6) | st.integers(0, 100).map(lambda p: "%d%%" % p)


@st.composite
def policies(draw):
    steps = tuple(Step(draw(st.integers(0, 8) | st.integers(0, 100).map(lambda p: "%d%%" % p)),
                       draw(st.sampled_from((0, 0, 30, 600))))
                  for _step in range(draw(st.integers(0, 3))))
    return Policy(max_parallel=draw(int_or_percent), max_unavailable=draw(int_or_percent), steps=steps,
                  max_failures=draw(st.integers(0, 4)), paused=draw(st.booleans() | st.just(False)),
                  enabled=draw(st.booleans() | st.just(True)))


def by_name(nodes):
    return {n.name: n for n in nodes}


@settings(max_examples=400, deadline=None)
@given(rollout_nodes(), policies(), st.floats(0, 1e6),
       st.none() | st.builds(StepPause, st.integers(0, 3), st.floats(0, 2e6)))
def test_limits_hold_for_any_fleet_and_policy(nodes, policy, now, pause):
    d = decide(nodes, policy, now, pause)
    nodes_by = by_name(nodes)
    started = [nodes_by[s] for s in d.start]
    # enableRollout false: never a cordon; every candidate in place, limits and steps do not apply
    assert d.cordon == policy.enabled
    if d.cordon:
        # never exceeds maxParallel
        assert not d.start or len(d.in_flight) + len(d.start) <= d.max_parallel
        # never exceeds maxUnavailable, counting nodes already cordoned or NotReady
        # (a node cordoned already costs nothing: starting it adds no unavailable node)
        before = {n.name for n in nodes if n.unavailable}
        after = before | set(d.start)
        assert len(after) <= max(d.max_unavailable, len(before))
    # a node whose target's kernel driver is not declared yet is never started
    assert not any(not node.declared for node in started)
    assert set(d.unavailable) == {n.name for n in nodes if n.unavailable}
    # never a failed, skipped, NotReady, in-flight or up-to-date node
    for node in started:
        assert node.ready and not node.skip and node.outdated
        assert node.state is None or node.state == N.DRIVER_UPGRADE_DONE
    assert not set(d.start) & (set(d.failed) | set(d.in_flight) | set(d.done))
    # pauses at the failure threshold
    if len(d.failed) >= max(1, policy.max_failures):
        assert d.start == () and d.paused
    if policy.paused:
        assert d.start == ()
    elif not policy.enabled and not d.paused:
        assert set(d.start) == {n.name for n in nodes if n.ready and not n.skip and n.declared and n.outdated
                                and n.name not in set(d.failed) | set(d.in_flight)}
    # the step caps: nodes touched never exceed the current step's replicas
    if policy.steps and d.step is not None and d.start and d.cordon:
        cap = count_of(policy.steps[d.step].replicas, len(nodes), "r", round_up=True, minimum=0)
        assert len(d.done) + len(d.in_flight) + len(d.failed) + len(d.start) <= cap
    # a step pause starts nothing and ends in the future
    if d.pause_until is not None:
        assert d.start == () and d.pause_until > now
    # every node is accounted for exactly once
    accounted = list(d.start) + [w.node for w in d.waiting] + list(d.in_flight) + list(d.done) + list(d.failed)
    assert sorted(accounted) == sorted(n.name for n in nodes)
    # candidates are taken in the order given
    order = [n.name for n in nodes]
    assert list(d.start) == sorted(d.start, key=order.index)


@settings(max_examples=300, deadline=None)
@given(rollout_nodes(), int_or_percent, int_or_percent)
def test_progress_whenever_a_limit_allows_it(nodes, parallel, unavailable):
    """Without failures, pauses or steps, something starts when a ready node fits the limits."""
    nodes = [n for n in nodes if n.state is None and n.declared]
    policy = Policy(max_parallel=parallel, max_unavailable=unavailable)
    d = decide(nodes, policy)
    candidates = [n for n in nodes if n.ready and not n.skip and n.outdated]
    fits = any(n.cordoned for n in candidates) or (candidates and d.budget >= 1)
    assert bool(d.start) == bool(fits)
    if not d.start and candidates:
        assert d.stuck and {w.reason for w in d.waiting if w.node in {n.name for n in candidates}} == {WAIT_BUDGET}


@settings(max_examples=300, deadline=None)
@given(rollout_nodes(), policies())
def test_batches_played_forward_respect_the_limits_and_cover_every_candidate(nodes, policy):
    nodes = [n for n in nodes if n.state is None and n.declared]
    policy = Policy(max_parallel=policy.max_parallel, max_unavailable=policy.max_unavailable, steps=policy.steps)
    plan = plan_batches(nodes, policy)
    current = {n.name: n for n in nodes}
    seen = []
    for batch in plan.batches:
        assert 0 < len(batch) <= plan.first.max_parallel
        before = {n for n, node in current.items() if node.unavailable}
        assert len(before | set(batch)) <= max(plan.first.max_unavailable, len(before))
        for name in batch:
            current[name] = finished_node(current[name])
        seen.extend(batch)
    assert len(seen) == len(set(seen))
    candidates = [n.name for n in nodes if n.ready and not n.skip and n.outdated]
    assert sorted(seen + list(plan.blocked)) == sorted(candidates)
    # pauses only between steps, each moving the clock forward
    assert [p.until for p in plan.pauses] == sorted(p.until for p in plan.pauses)


def fleet(n, cordoned=(), admin=(), states=None, ready=None, current=OLD):
    states, ready = states or {}, ready if ready is not None else {}
    return [RolloutNode("n%d" % i, ready=ready.get("n%d" % i, True), cordoned="n%d" % i in cordoned,
                        admin_cordoned="n%d" % i in admin, state=states.get("n%d" % i),
                        current_version=current, target_version=NEW) for i in range(n)]


def test_real_cr_defaults_canary_then_the_rest():
    """The 0.9.2 CR: maxParallel 100%, maxUnavailable 0% (at least 1), steps 1 then 100% with 30 s between."""
    policy = Policy(max_parallel="100%", max_unavailable="0%", steps=(Step(1, 30.0), Step("100%", 0.0)),
                    max_failures=5)
    nodes = fleet(4)
    d = decide(nodes, policy, now=1000.0)
    assert d.start == ("n0",) and d.max_unavailable == 1 and d.step == 0
    assert {w.reason for w in d.waiting} == {WAIT_STEP}
    # n0 in flight: nothing else (step 1 holds one node)
    d = decide(fleet(4, cordoned={"n0"}, states={"n0": "paused"}), policy, now=1010.0)
    assert d.start == () and d.in_flight == ("n0",)
    # n0 done and uncordoned: the canary step is over, its pause starts now
    done = [finished_node(nodes[0])] + nodes[1:]
    d = decide(done, policy, now=1020.0)
    assert d.start == () and d.pause_until == 1050.0 and d.reasons(WAIT_STEP_PAUSE) == ("n1", "n2", "n3")
    record = d.step_pause
    assert decide(done, policy, now=1049.0, step_pause=record).start == ()
    d = decide(done, policy, now=1050.0, step_pause=record)
    assert d.start == ("n1",) and d.step == 1 and d.reasons(WAIT_BUDGET) == ("n2", "n3")


def test_failures_pause_at_the_threshold_and_failed_nodes_never_restart():
    states = {"n0": "failed", "n1": "rolled-back"}
    nodes = fleet(5, cordoned={"n0", "n1"}, states=states)
    d = decide(nodes, Policy(max_parallel=5, max_unavailable=5, max_failures=3))
    assert d.failed == ("n0", "n1") and d.start == ("n2", "n3", "n4") and not d.paused
    d = decide(nodes, Policy(max_parallel=5, max_unavailable=5, max_failures=2))
    assert d.start == () and d.paused and "maxFailureThreshold 2" in d.pause_reason
    assert d.reasons(WAIT_PAUSED) == ("n2", "n3", "n4")
    # the playbook's re-run restarts them (its own leftovers), cordoned by us: no budget spent
    d = decide(nodes, Policy(max_parallel=5, max_unavailable=2, restart_unfinished=True))
    assert d.start == ("n0", "n1") and d.budget == 0


def test_admin_cordon_costs_nothing_and_survives_the_upgrade():
    nodes = fleet(4, cordoned={"n2"}, admin={"n2"})
    plan = plan_batches(nodes, Policy(max_parallel=2, max_unavailable=2))
    assert plan.batches == (("n0", "n2"), ("n1",), ("n3",))
    assert finished_node(nodes[2]).cordoned and not finished_node(nodes[0]).cordoned


def test_budget_skips_ahead_to_a_cordoned_node_and_reports_why_the_rest_wait():
    nodes = fleet(4, cordoned={"n3"}, admin={"n3"}, ready={"n1": False})
    d = decide(nodes, Policy(max_parallel=3, max_unavailable=3))
    assert d.start == ("n0", "n3") and d.reasons(WAIT_NOT_READY) == ("n1",) and d.reasons(WAIT_BUDGET) == ("n2",)
    d = decide(nodes, Policy(max_parallel=1, max_unavailable=3))
    assert d.start == ("n0",) and d.reasons(WAIT_PARALLEL) == ("n2", "n3")


def test_done_nodes_count_toward_steps_and_wait_for_their_labels():
    nodes = fleet(3, cordoned={"n0"}, states={"n0": N.DRIVER_UPGRADE_DONE})
    # done, but the labels still say the old version: the node is validating (in flight)
    assert decide(nodes, Policy(max_parallel=1)).in_flight == ("n0",)
    nodes[0] = RolloutNode("n0", cordoned=True, state=N.DRIVER_UPGRADE_DONE, current_version="2.40.1",
                           target_version="2.40.1.7")
    d = decide(nodes, Policy(max_parallel=1, max_unavailable=2))
    assert d.done == ("n0",) and d.start == ("n1",)


def test_rollout_switches():
    nodes = fleet(2)
    d = decide(nodes, Policy(enabled=False))
    assert d.start == ("n0", "n1") and not d.cordon       # in place, never cordoned
    assert decide(nodes, Policy(enabled=False, paused=True)).start == ()
    d = decide(nodes, Policy(paused=True))
    assert d.paused and d.start == () and d.reasons(WAIT_PAUSED) == ("n0", "n1")
    skip = [RolloutNode("a", skip=True, current_version=OLD, target_version=NEW)]
    assert decide(skip, Policy()).reasons(WAIT_SKIP) == ("a",)
    assert decide([], Policy()).finished


@pytest.mark.parametrize("value,total,up,expected", [
    (2, 10, False, 2), ("3", 10, False, 3), ("25%", 10, False, 2), ("25%", 10, True, 3), ("0%", 10, False, 1),
    ("100%", 7, False, 7), ("1%", 3, True, 1)])
def test_count_or_percent(value, total, up, expected):
    assert count_of(value, total, "x", round_up=up) == expected


@pytest.mark.parametrize("value", [0, "0", "-1", "x", "5%%", True])
def test_count_or_percent_refused(value):
    with pytest.raises(PolicyError):
        count_of(value, 10, "maxParallel")


def test_policy_errors():
    with pytest.raises(PolicyError, match="fallback"):
        decide(fleet(1), Policy(fallback="retry"))
    with pytest.raises(PolicyError, match="pauseDuration"):
        decide(fleet(1), Policy(steps=(Step(1, -1),)))


def test_same_version_compares_what_both_say():
    assert same_version("2.29.0", "2.29.0.13") and not same_version("2.29.1", "2.29.0.13")
    assert not same_version(None, "2.29.0") and not same_version("2.29.0", "")


def test_enable_rollout_false_starts_every_node_in_place_whatever_the_limits():
    """The real CR's defaults: enableRollout false with maxUnavailable 0% and a one-node first step:
    no node is cordoned, so none of them limits anything; in flight ones stay, failed ones hold."""
    policy = Policy(max_parallel="100%", max_unavailable="0%", steps=(Step(1, 30.0), Step("100%", 0.0)),
                    max_failures=5, enabled=False)
    nodes = fleet(5, cordoned={"n4"}, admin={"n4"}, states={"n1": N.DRIVER_UPGRADE_REQUIRED}, ready={"n2": False})
    d = decide(nodes, policy, now=10.0)
    assert d.start == ("n0", "n3", "n4") and not d.cordon and d.in_flight == ("n1",)
    assert d.reasons(WAIT_NOT_READY) == ("n2",) and d.step is None and d.pause_until is None
    failed = fleet(6, states={"n%d" % i: "failed" for i in range(5)})
    assert decide(failed, policy).paused and decide(failed, policy).start == ()
    # finished in place: the administrator's cordon of n4 stays, nothing of ours to lift
    assert finished_node(RolloutNode("n4", cordoned=True, in_place=True, current_version=OLD,
                                     target_version=NEW)).cordoned
    assert not finished_node(RolloutNode("n0", in_place=True, current_version=OLD, target_version=NEW)).cordoned


def test_a_node_waits_until_its_target_payload_declares_its_kernel_driver():
    """Payload 2.29.0.13 installs 2.12.13: a node is on target when its labels say 2.12.13."""
    nodes = [RolloutNode("a", current_version="2.12.13", target_version="2.12.13"),
             RolloutNode("b", current_version="2.12.11", target_version="2.12.13"),
             RolloutNode("c", current_version="2.12.11", target_version=None, declared=False),
             RolloutNode("d", current_version="2.12.13", cordoned=True, state=N.DRIVER_UPGRADE_DONE,
                         target_version=None, declared=False)]
    d = decide(nodes, Policy(max_parallel=3, max_unavailable=3))
    assert d.done == ("a",) and d.start == ("b",) and d.reasons(WAIT_PAYLOAD) == ("c",)
    assert d.in_flight == ("d",) and not d.finished          # d validates once its target is known


def test_the_payload_number_never_decides_on_target():
    assert same_version("2.12.13", "2.12.13") and not same_version("2.12.13", "2.29.0.13")
    assert not RolloutNode("a", current_version="2.12.13", target_version="2.12.13").outdated
    assert RolloutNode("a", current_version="2.12.13", target_version="2.29.0.13").outdated


# -- nodes held by the maintenance protocol (issue 40) ---------------------------------

def test_a_node_held_by_another_procedure_spends_budget_and_waits_until_it_is_resumed():
    """set_vfnum (or driver-manager's vfnum change, the health ladder) holding a schedulable node
    makes it unavailable: the budget counts it, and the upgrade does not take it."""
    nodes = fleet(3)
    nodes[1] = RolloutNode("n1", held_by=N.MAINTENANCE_OWNER_SET_VFNUM, current_version=OLD, target_version=NEW)
    d = decide(nodes, Policy(max_parallel=3, max_unavailable=2))
    assert d.unavailable == ("n1",) and d.budget == 1
    assert d.start == ("n0",) and d.reasons(WAIT_HELD) == ("n1",) and d.reasons(WAIT_BUDGET) == ("n2",)
    assert "held by set-vfnum's maintenance" in [w.detail for w in d.waiting if w.node == "n1"][0]
    assert not d.finished            # the hold ends by itself: the rollout is not over
    # with a budget of one, the held node uses it up: nothing starts until it is resumed
    d = decide(nodes, Policy(max_parallel=3, max_unavailable=1))
    assert d.start == () and d.budget == 0 and d.reasons(WAIT_BUDGET) == ("n0", "n2")


def test_the_budget_ignored_held_nodes_before_and_counts_them_now():
    held = [RolloutNode("n%d" % i, held_by=N.MAINTENANCE_OWNER_HEALTH, current_version=NEW, target_version=NEW)
            for i in range(2)]
    fresh = fleet(4)[2:]
    d = decide(held + fresh, Policy(max_parallel=4, max_unavailable=2))
    assert set(d.unavailable) == {"n0", "n1"} and d.start == () and d.stuck


def test_a_node_the_driver_upgrade_holds_itself_costs_nothing_more_to_start():
    nodes = fleet(2)
    nodes[0] = RolloutNode("n0", held_by=N.MAINTENANCE_OWNER_DRIVER_UPGRADE, current_version=OLD,
                           target_version=NEW)
    d = decide(nodes, Policy(max_parallel=2, max_unavailable=1))
    assert d.start == ("n0",) and d.budget == 0
    plan = plan_batches(nodes, Policy(max_parallel=1, max_unavailable=1))
    # finished, the hold is gone: its place frees for n1
    assert plan.batches == (("n0",), ("n1",)) and finished_node(nodes[0]).held_by is None


@settings(max_examples=200, deadline=None)
@given(rollout_nodes(), policies(), st.lists(st.sampled_from((None,) + N.MAINTENANCE_OWNERS), min_size=14,
                                             max_size=14))
def test_held_nodes_count_as_unavailable_and_are_never_started_by_another_procedure(nodes, policy, owners):
    from dataclasses import replace
    nodes = [replace(n, held_by=owner) for n, owner in zip(nodes, owners)]
    d = decide(nodes, policy)
    assert set(d.unavailable) == {n.name for n in nodes if n.cordoned or not n.ready or n.held_by}
    started = {n.name: n for n in nodes if n.name in d.start}
    assert not any(n.held_by not in (None, N.MAINTENANCE_OWNER_DRIVER_UPGRADE) for n in started.values())
    if d.cordon:
        before = {n.name for n in nodes if n.unavailable}
        assert len(before | set(d.start)) <= max(d.max_unavailable, len(before))
