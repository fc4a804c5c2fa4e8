# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The one planner of rolling driver upgrades: which nodes start now, which wait, and why.

Both drivers of an upgrade ask it: the ``metax.gpu.driver_upgrade`` playbook
(through the ``driver_upgrade_plan`` filter, which plays the planner forward
into batches with :func:`plan_batches`) and the operator's controller
(``clusteroperator/driver_rollout.py``, one :func:`decide` per reconcile).
Pure: no I/O and no clock (``now`` is an argument), standard library only.

The rules (docs/day-two.md, docs/operator.md "driver upgradePolicy"):

* the budget ``max_unavailable`` (a count, or a percentage of the nodes given,
  rounded down, at least 1) counts every node that is cordoned or NotReady,
  the ones in flight included; starting a schedulable node costs 1, a node
  that is cordoned already costs nothing;
* ``max_parallel`` (same form) caps the nodes in flight plus those started;
* ``steps``: cumulative node counts (``replicas``, a count or a percentage
  rounded up) with a pause after each; a step is over when that many nodes are
  at the target, then its pause runs from the moment a decision first saw it
  over (the returned :class:`StepPause`, which the caller keeps and passes back);
  after the last step there is no cap;
* failed nodes (state ``failed``/``rolled-back``) are never started; when
  there are ``max_failures`` of them or more, the rollout is paused
  (``fallback: pause``): nothing starts, what is in flight finishes;
* ``enabled`` false (``enableRollout: false``, the real CR's default): no
  rolling upgrade at all. Every candidate starts *in place*
  (:attr:`Decision.cordon` false): never cordoned, never evicted, no budget
  spent; its node's driver-manager installs the new payload only while the
  node's GPUs are not in use, else it waits and says so on the node. The
  failure threshold and ``pause`` still hold it;
* a node whose target kernel-driver version is not known yet
  (:attr:`RolloutNode.declared` false: its driver-manager of the new payload
  has not said what the payload installs) waits (``payload-unknown``): "on
  target" is the loaded module against the declared version, never against
  the payload's own number (``package.driver_matches``);
* a node labelled ``driver.upgrade.skip=true`` and a NotReady node never start;
* a node another procedure holds for maintenance (:attr:`RolloutNode.held_by`,
  module_utils/maintenance: set_vfnum, driver-manager's vfnum change, the health
  ladder) is unavailable, so it spends budget like a cordoned node, and it waits
  (``held``) until that procedure resumes it; a node the driver upgrade itself
  holds (an earlier run's) is unavailable and costs nothing more to start;
* an administrator's cordon is never undone: :attr:`RolloutNode.admin_cordoned`
  is carried through (the callers act on it), and such a node is upgraded
  without spending budget.

Candidates are taken in the order given; a node that does not fit the budget
is passed over for a later one that costs nothing (a cordoned node).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Deque, Dict, List, Optional, Sequence, Tuple, Union

from .. import names as N
from ..errors import MetaxGpuError
from .package import driver_matches

IntOrPercent = Union[int, str]

# Why a node does not start now (Wait.reason).
WAIT_SKIP = "skip-label"                  # driver.upgrade.skip=true: never
WAIT_NOT_READY = "not-ready"              # its agents could not validate it
WAIT_PAYLOAD = "payload-unknown"          # the kernel driver the target payload installs is not known yet
WAIT_PAUSED = "rollout-paused"            # upgradePolicy.pause, or failures >= threshold
WAIT_STEP_PAUSE = "step-pause"            # an upgradeSteps pause is running
WAIT_STEP = "step-limit"                  # the current step's replicas are all started
WAIT_PARALLEL = "max-parallel"            # maxParallel nodes in flight
WAIT_BUDGET = "max-unavailable"           # cordoning it would exceed maxUnavailable
WAIT_HELD = "held"                        # another procedure holds it for maintenance (maintenance.owner)
FALLBACKS = ("pause", "rollback")


class PolicyError(MetaxGpuError, ValueError):
    """An upgrade policy value the planner cannot act on."""


@dataclass(frozen=True)
class RolloutNode:
    """One node as the planner sees it (built from a Node object by the callers)."""

    name: str
    ready: bool = True
    cordoned: bool = False
    # cordoned by the administrator (recorded, or cordoned with no upgrade state
    # of ours): never uncordoned by the upgrade
    admin_cordoned: bool = False
    state: Optional[str] = None             # metax-tech.com/driver.upgrade-state
    skip: bool = False                      # metax-tech.com/driver.upgrade.skip=true
    current_version: Optional[str] = None   # the loaded kernel driver (gpu.driver.* labels)
    # the kernel driver the target payload installs, as declared (package.Package.driver);
    # None: unknown, the node is to be processed (the playbook: its module decides)
    target_version: Optional[str] = None
    reason: str = ""                        # why it failed (message annotation)
    # False: the target payload's declaration has not reached the planner for this node (it waits)
    declared: bool = True
    in_place: bool = False                  # started in place (enableRollout false): never cordoned by us
    # the procedure holding the node for maintenance (names.MAINTENANCE_OWNERS; None: none)
    held_by: Optional[str] = None

    @property
    def unavailable(self) -> bool:
        return self.cordoned or not self.ready or self.held_by is not None

    @property
    def held_elsewhere(self) -> bool:
        """Held by another procedure than the driver upgrade: not the upgrade's to start."""
        return self.held_by is not None and self.held_by != N.MAINTENANCE_OWNER_DRIVER_UPGRADE

    @property
    def outdated(self) -> bool:
        return self.target_version is None or not same_version(self.current_version, self.target_version)


@dataclass(frozen=True)
class Step:
    """One of upgradeSteps: upgrade until ``replicas`` nodes are at the target, then pause."""

    replicas: IntOrPercent
    pause_seconds: float = 0.0


@dataclass(frozen=True)
class Policy:
    """The upgradePolicy (or the playbook's serial/max_unavailable, see docs/day-two.md)."""

    max_parallel: IntOrPercent = 1
    max_unavailable: IntOrPercent = "25%"
    steps: Tuple[Step, ...] = ()
    max_failures: int = 1                   # pause when this many nodes failed (0 reads as 1)
    fallback: str = "pause"
    paused: bool = False                    # upgradePolicy.pause: the administrator holds the rollout
    enabled: bool = True                    # upgradePolicy.enableRollout
    # The caller is the only actor (the playbook): an upgrade state left by an
    # earlier run is a leftover, and such nodes (failed ones too) start again.
    # False (the operator): in-flight nodes are their agent's, failed ones the
    # administrator's.
    restart_unfinished: bool = False


@dataclass(frozen=True)
class StepPause:
    """The pause after step ``step`` (0-based) ends at ``until`` (the caller's clock, seconds)."""

    step: int
    until: float


@dataclass(frozen=True)
class Wait:
    node: str
    reason: str       # WAIT_*
    detail: str


@dataclass(frozen=True)
class Decision:
    """What to do now. ``start``: the nodes to cordon and upgrade, in order."""

    start: Tuple[str, ...]
    waiting: Tuple[Wait, ...]
    in_flight: Tuple[str, ...]
    done: Tuple[str, ...]             # at the target version (state done, or no state)
    failed: Tuple[str, ...]
    unavailable: Tuple[str, ...]      # cordoned or NotReady before this decision
    max_unavailable: int
    max_parallel: int
    budget: int                       # nodes that may still become unavailable (before ``start``)
    step: Optional[int] = None        # index of the current upgradeSteps step; None: no step caps
    step_pause: Optional[StepPause] = None   # keep it and pass it back to the next decide()
    paused: bool = False
    pause_reason: str = ""
    # False (enableRollout false): ``start`` is in place, no cordon, no eviction, no budget
    cordon: bool = True

    @property
    def pause_until(self) -> Optional[float]:
        """When the running step pause ends (None: no step pause holds the rollout)."""
        if self.step_pause is not None and any(w.reason == WAIT_STEP_PAUSE for w in self.waiting):
            return self.step_pause.until
        return None

    @property
    def finished(self) -> bool:
        """Nothing more will happen: nothing started, in flight, or waiting for a limit to free up."""
        return not self.start and not self.in_flight and not any(w.reason in _LATER for w in self.waiting)

    @property
    def stuck(self) -> bool:
        """Nodes wait for budget that nothing in flight will free: only the administrator can."""
        return not self.start and not self.in_flight and not self.paused and self.pause_until is None and \
            any(w.reason == WAIT_BUDGET for w in self.waiting)

    def reasons(self, reason: str) -> Tuple[str, ...]:
        return tuple(w.node for w in self.waiting if w.reason == reason)


# waits that end by themselves (or by the rollout going on)
_LATER = frozenset((WAIT_STEP_PAUSE, WAIT_STEP, WAIT_PARALLEL, WAIT_BUDGET, WAIT_PAYLOAD, WAIT_HELD))


@dataclass(frozen=True)
class BatchPlan:
    """:func:`plan_batches`: the decisions played forward, every batch assumed to succeed."""

    batches: Tuple[Tuple[str, ...], ...]
    first: Decision                           # the decision on the nodes as given
    blocked: Tuple[str, ...] = ()             # nodes no batch could take (budget used up)
    pauses: Tuple[StepPause, ...] = ()        # step pauses between the batches
    batch_of: Dict[str, int] = field(default_factory=dict)


@lru_cache(maxsize=1024)     # a fleet has a handful of versions; every node asks
def same_version(current: Optional[str], target: Optional[str]) -> bool:
    """Whether the loaded kernel driver ``current`` (the node's major.minor.patch labels) is the
    declared kernel driver ``target``: :func:`.package.driver_matches`, the one comparison."""
    return driver_matches(current, target)


def count_of(value: IntOrPercent, total: int, what: str, round_up: bool = False, minimum: int = 1) -> int:
    """``value`` (a count, "N" or "N%") as a node count of ``total``.

    A percentage rounds down (up with ``round_up``) and is at least ``minimum``;
    a count below ``minimum`` is refused.
    """
    if isinstance(value, bool):
        raise PolicyError("%s %r: expected a count or a percentage" % (what, value))
    text = str(value).strip()
    try:
        if text.endswith("%"):
            pct = float(text[:-1])
            if pct < 0:
                raise ValueError(text)
            exact = total * pct / 100.0
            count = int(math.ceil(exact - 1e-9)) if round_up else int(math.floor(exact + 1e-9))
            return max(minimum, count)
        count = int(text)
    except ValueError:
        raise PolicyError("%s %r: expected a count or a percentage" % (what, value))
    if count < minimum:
        raise PolicyError("%s must be at least %d (got %s)" % (what, minimum, count))
    return count


@dataclass
class _Census:
    """The nodes sorted into what the planner needs; candidates as (order, name) queues."""

    total: int
    free: Deque[Tuple[int, str]]              # candidates already unavailable (cordoned, held): cost 0
    fresh: Deque[Tuple[int, str]]             # schedulable candidates: cost 1
    excluded: List[Wait]
    in_flight: List[str]
    done: List[str]
    failed: List[str]
    unavailable: List[str]
    n_unavailable: int = 0


def _census(nodes: Sequence[RolloutNode], policy: Policy) -> _Census:
    census = _Census(len(nodes), deque(), deque(), [], [], [], [], [])
    for order, node in enumerate(nodes):
        if node.unavailable:
            census.unavailable.append(node.name)
            census.n_unavailable += 1
        if node.skip:
            census.excluded.append(Wait(node.name, WAIT_SKIP, "labelled %s=true" % N.LABEL_DRIVER_UPGRADE_SKIP))
            continue
        if node.state and not policy.restart_unfinished:
            if node.state in N.DRIVER_UPGRADE_FAILED_STATES:
                census.failed.append(node.name)
                continue
            # done but the version not seen yet: still validating
            if node.state != N.DRIVER_UPGRADE_DONE or node.outdated:
                census.in_flight.append(node.name)
                continue
        if not node.declared:
            census.excluded.append(Wait(node.name, WAIT_PAYLOAD, "the kernel driver the target payload installs "
                                                                 "is not known yet (its driver-manager says it)"))
            continue
        if not node.outdated and (node.state is None or not policy.restart_unfinished):
            census.done.append(node.name)
        elif not node.ready:
            census.excluded.append(Wait(node.name, WAIT_NOT_READY, "NotReady: its agents could not validate it"))
        elif node.held_elsewhere:
            census.excluded.append(Wait(node.name, WAIT_HELD, "held by %s's maintenance (%s): it waits until "
                                        "that procedure resumes it" % (node.held_by, N.ANNOTATION_MAINTENANCE_OWNER)))
        else:
            (census.free if node.unavailable else census.fresh).append((order, node.name))
    return census


@dataclass(frozen=True)
class _Limits:
    max_unavailable: int
    max_parallel: int
    caps: Tuple[int, ...]                     # cumulative nodes at the target per step


def _limits(policy: Policy, total: int) -> _Limits:
    if policy.fallback not in FALLBACKS:
        raise PolicyError("fallback %r: expected one of %s" % (policy.fallback, ", ".join(FALLBACKS)))
    caps = []
    for index, step in enumerate(policy.steps):
        if step.pause_seconds < 0:
            raise PolicyError("upgradeSteps[%d].pauseDuration must not be negative" % index)
        caps.append(min(total, count_of(step.replicas, total, "upgradeSteps[%d].replicas" % index,
                                        round_up=True, minimum=0)))
    return _Limits(count_of(policy.max_unavailable, total, "maxUnavailable"),
                   count_of(policy.max_parallel, total, "maxParallel"), tuple(caps))


@dataclass(frozen=True)
class _Choice:
    start: Tuple[str, ...]
    hold: Optional[Wait]                      # a reason holding every candidate
    cap_reason: str                           # the limit that ends the start list
    full: bool                                # the start list reached that limit
    budget_left: int
    step: Optional[int]
    step_pause: Optional[StepPause]
    paused: bool
    pause_reason: str


def _choose(census: _Census, limits: _Limits, policy: Policy, now: float,
            step_pause: Optional[StepPause]) -> _Choice:
    """The start list; takes the started nodes off the census's candidate queues."""
    budget = limits.max_unavailable - census.n_unavailable
    threshold = max(1, policy.max_failures)
    if not policy.restart_unfinished and len(census.failed) >= threshold:
        why = "%d node(s) failed (%s), maxFailureThreshold %d: fallback %s" % (
            len(census.failed), ", ".join(census.failed), threshold, policy.fallback)
        return _Choice((), Wait("", WAIT_PAUSED, why), "", False, budget, None, step_pause, True, why)
    if policy.paused:
        why = "upgradePolicy.pause is true"
        return _Choice((), Wait("", WAIT_PAUSED, why), "", False, budget, None, step_pause, True, why)
    if not policy.enabled:
        # no rolling upgrade: every candidate in place, in its order; nothing is made
        # unavailable by us, so neither the budget nor maxParallel nor the steps apply
        in_place = sorted(list(census.free) + list(census.fresh))
        census.free.clear()
        census.fresh.clear()
        return _Choice(tuple(name for _order, name in in_place), None, "", True, budget, None, step_pause, False, "")
    done = len(census.done)
    step: Optional[int] = next((i for i, cap in enumerate(limits.caps) if done < cap), None)
    last_over = (len(limits.caps) if step is None else step) - 1
    if last_over >= 0 and policy.steps[last_over].pause_seconds > 0:
        if step_pause is None or step_pause.step != last_over:
            step_pause = StepPause(last_over, now + policy.steps[last_over].pause_seconds)
        if now < step_pause.until:
            why = "step %d of %d is over (%d node(s) at the target): pause until %s" % (
                last_over + 1, len(limits.caps), done, step_pause.until)
            return _Choice((), Wait("", WAIT_STEP_PAUSE, why), "", False, budget, step, step_pause, False, "")
    parallel_left = limits.max_parallel - len(census.in_flight)
    step_left = limits.caps[step] - done - len(census.in_flight) - len(census.failed) \
        if step is not None else census.total
    cap = max(0, min(parallel_left, step_left))
    cap_reason = WAIT_PARALLEL if parallel_left <= step_left else WAIT_STEP
    start: List[Tuple[int, str]] = []
    left = budget
    free, fresh = census.free, census.fresh
    while len(start) < cap:
        head_free = free[0] if free else None
        head_fresh = fresh[0] if fresh and left > 0 else None
        if head_free is None and head_fresh is None:
            break
        if head_fresh is None or (head_free is not None and head_free[0] < head_fresh[0]):
            start.append(free.popleft())
        else:
            start.append(fresh.popleft())
            left -= 1
    return _Choice(tuple(name for _order, name in start), None, cap_reason, len(start) >= cap, left, step, step_pause,
                   False, "")


def _wait_detail(reason: str, limits: _Limits, census: _Census, choice: _Choice) -> str:
    if reason == WAIT_PARALLEL:
        return "maxParallel %d: %d in flight" % (limits.max_parallel, len(census.in_flight) + len(choice.start))
    if reason == WAIT_STEP and choice.step is not None:
        return "step %d of %d: %d node(s) at most, all started" % (
            choice.step + 1, len(limits.caps), limits.caps[choice.step])
    return "maxUnavailable %d: unavailable already %s" % (
        limits.max_unavailable, ", ".join(census.unavailable) or "none")


def decide(nodes: Sequence[RolloutNode], policy: Policy, now: float = 0.0,
           step_pause: Optional[StepPause] = None) -> Decision:
    """The decision for ``nodes`` (in the order candidates are taken) under ``policy`` at ``now``.

    ``step_pause`` is the :attr:`Decision.step_pause` of the previous decision (None the first time).
    Raises :class:`PolicyError` for a policy it cannot act on.
    """
    census = _census(nodes, policy)
    limits = _limits(policy, census.total)
    choice = _choose(census, limits, policy, now, step_pause)
    waiting = list(census.excluded)
    details: Dict[str, str] = {}
    for cheap, queue in ((True, census.free), (False, census.fresh)):
        for _order, name in queue:
            if choice.hold is not None:
                waiting.append(Wait(name, choice.hold.reason, choice.hold.detail))
                continue
            # a cordoned candidate is left only by a full start list, a schedulable
            # one also by the budget; a full list says which limit the rollout is at
            reason = choice.cap_reason if cheap or choice.full else WAIT_BUDGET
            if reason not in details:
                details[reason] = _wait_detail(reason, limits, census, choice)
            waiting.append(Wait(name, reason, details[reason]))
    order = {node.name: i for i, node in enumerate(nodes)}
    waiting.sort(key=lambda w: order[w.node])
    return Decision(start=choice.start, waiting=tuple(waiting), in_flight=tuple(census.in_flight),
                    done=tuple(census.done), failed=tuple(census.failed), unavailable=tuple(census.unavailable),
                    max_unavailable=limits.max_unavailable, max_parallel=limits.max_parallel,
                    budget=max(0, limits.max_unavailable - len(census.unavailable)), step=choice.step,
                    step_pause=choice.step_pause, paused=choice.paused, pause_reason=choice.pause_reason,
                    cordon=policy.enabled)


def finished_node(node: RolloutNode) -> RolloutNode:
    """``node`` after a successful upgrade: at its target, no state, cordoned only if the administrator had."""
    target = node.target_version if node.target_version is not None else "(planned)"
    cordoned = node.cordoned if node.in_place else node.admin_cordoned     # in place: its cordon was never ours
    return replace(node, state=None, cordoned=cordoned, current_version=target, target_version=target,
                   reason="", in_place=False, held_by=None)


def plan_batches(nodes: Sequence[RolloutNode], policy: Policy, now: float = 0.0) -> BatchPlan:
    """The whole rollout as batches: :func:`decide` again after each batch, assuming it succeeded.

    Each batch finishes before the next starts (the playbook's way), so a
    batch is one decision's ``start``; a step pause moves the clock to its
    end. Linear in the nodes: the census is updated, not rebuilt.
    """
    first = decide(nodes, policy, now)
    census = _census(nodes, policy)
    limits = _limits(policy, census.total)
    by_name = {node.name: node for node in nodes}
    batches: List[Tuple[str, ...]] = []
    pauses: List[StepPause] = []
    step_pause: Optional[StepPause] = None
    while True:
        choice = _choose(census, limits, policy, now, step_pause)
        if choice.hold is not None and choice.hold.reason == WAIT_STEP_PAUSE and choice.step_pause is not None:
            step_pause = choice.step_pause
            pauses.append(step_pause)
            now = step_pause.until
            continue
        step_pause = choice.step_pause
        if not choice.start:
            break
        batches.append(choice.start)
        # the batch succeeded: at the target, uncordoned unless the administrator had cordoned it
        census.done.extend(choice.start)
        for name in choice.start:
            node = by_name[name]    # finished: cordoned only if the administrator had (finished_node)
            census.n_unavailable += int(node.admin_cordoned or not node.ready) - int(node.unavailable)
    blocked = tuple(name for _order, name in sorted(list(census.free) + list(census.fresh)))
    return BatchPlan(batches=tuple(batches), first=first, blocked=blocked, pauses=tuple(pauses),
                     batch_of={name: i for i, batch in enumerate(batches) for name in batch})
