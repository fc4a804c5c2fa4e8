# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The policy applied to readings over time: what fails, what recovers, and when. Pure.

:class:`Evaluator` keeps, per GPU and signal, the row that holds it failing,
since when, its last bad reading and the clean readings since; the clock is
the reading's ``taken_at`` (or ``now`` passed in), never read here, so every
timing is testable.

- A signal fails at the first reading on which one of its rows fires (the
  strongest row wins): one ``failing`` transition. A stronger row firing
  later is an ``escalated`` transition; a weaker one changes nothing.
- It stays failing -- a flapping GPU is held, not toggled -- until
  ``recoveryReadings`` clean readings in a row **and** ``holdOffSeconds``
  since its last bad one (the row's own when it has them, else the policy's): then one ``recovered`` transition, which carries the
  time out of service.
- A signal a reading does not know (absent: its source did not answer) is no
  news: it neither fails nor counts as clean.
- A counter that went down was reset (a driver reload): its history restarts.

The :class:`Decision` says what to do now: the GPUs to hold out of
Allocatable, whether the node condition fails, the quarantine effect, and
for rows that remediate the ladder's first step. The ladder itself is
driver-manager's (health/ladder.py): it reads the remediating findings from
the condition's message, where :meth:`Finding.describe` marks them
``remediate``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, FrozenSet, List, Optional, Tuple

from .policy import ACTIONS, DEVICE_UNHEALTHY, LADDER_STEPS, NODE_CONDITION, NO_EXECUTE, QUARANTINE, Policy, Rule
from .signals import NodeReading

FAILING, ESCALATED, RECOVERED = "failing", "escalated", "recovered"
# a finding of a remediating row, in the condition's message (health/ladder.py reads it)
REMEDIATE_MARK = "remediate"


@dataclass(frozen=True)
class Finding:
    """A signal of a GPU held failing now."""

    bdf: str
    index: int
    signal: str
    rule: Rule
    value: Optional[int]
    since: float
    detail: str = ""

    def describe(self) -> str:
        text = "GPU %d (%s) %s=%s [%s, %s%s]" % (self.index, self.bdf, self.signal,
                                                 "?" if self.value is None else self.value,
                                                 self.rule.severity, self.rule.action,
                                                 ", " + REMEDIATE_MARK if self.rule.remediate else "")
        return text + (": " + self.detail if self.detail else "")


@dataclass(frozen=True)
class Transition:
    kind: str                 # FAILING, ESCALATED, RECOVERED
    bdf: str
    index: int
    signal: str
    rule: Rule                # the row that failed it (for RECOVERED: the one it was held by)
    value: Optional[int]
    at: float
    out_of_service: Optional[float] = None    # RECOVERED: seconds since it failed
    detail: str = ""


@dataclass(frozen=True)
class LadderRequest:
    """A remediating row failed: the ladder's step to start with (driver-manager climbs it: health/ladder.py)."""

    bdf: str
    signal: str
    step: str


@dataclass(frozen=True)
class Decision:
    at: float
    findings: Tuple[Finding, ...] = ()
    transitions: Tuple[Transition, ...] = ()
    ladder: Tuple[LadderRequest, ...] = ()

    @property
    def unhealthy_gpus(self) -> FrozenSet[str]:
        """GPUs out of Allocatable: a row at device-unhealthy or stronger holds them."""
        floor = ACTIONS.index(DEVICE_UNHEALTHY)
        return frozenset(f.bdf for f in self.findings if ACTIONS.index(f.rule.action) >= floor)

    @property
    def condition_failing(self) -> bool:
        floor = ACTIONS.index(NODE_CONDITION)
        return any(ACTIONS.index(f.rule.action) >= floor for f in self.findings)

    @property
    def quarantine(self) -> Optional[str]:
        """The taint effect: NoExecute when any quarantining row says so, else NoSchedule; None: none."""
        effects = {f.rule.effect for f in self.findings if f.rule.action == QUARANTINE}
        if not effects:
            return None
        return NO_EXECUTE if NO_EXECUTE in effects else sorted(e for e in effects if e)[0]


@dataclass
class _Track:
    history: List[Tuple[float, int]] = field(default_factory=list)    # (time, value) within the longest window
    rule: Optional[Rule] = None
    since: float = 0.0
    last_bad: float = 0.0
    clean: int = 0
    value: Optional[int] = None
    detail: str = ""


def fires(rule: Rule, value: int, history: List[Tuple[float, int]], now: float) -> bool:
    """Does ``rule`` fire on ``value`` given the signal's earlier (time, value) readings?"""
    if rule.threshold is not None:
        return value >= rule.threshold
    since = now - rule.window_seconds
    # the oldest reading inside the window is the baseline (none: the value's growth is unknown yet)
    inside = [v for t, v in history if t >= since]
    if not inside:
        return False
    return value - min(inside) >= (rule.rate or 0)


class Evaluator:
    """Feed readings in time order; each :meth:`evaluate` returns the Decision after it."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._tracks: Dict[Tuple[str, str], _Track] = {}
        self._index: Dict[str, int] = {}

    def set_policy(self, policy: Policy) -> None:
        """A changed policy applies from the next reading; held signals keep their start time."""
        self.policy = policy

    def _longest_window(self, rules: Tuple[Rule, ...]) -> int:
        return max([r.window_seconds for r in rules if r.rate is not None] or [0])

    def evaluate(self, reading: NodeReading, now: Optional[float] = None) -> Decision:
        at = reading.taken_at if now is None else now
        transitions: List[Transition] = []
        for gpu in reading.gpus:
            self._index[gpu.bdf] = gpu.index
            for signal, value in gpu.values.items():
                rules = self.policy.rules_of(signal)
                track = self._tracks.setdefault((gpu.bdf, signal), _Track())
                if track.history and value < track.history[-1][1]:
                    track.history = []          # reset (driver reload): counting starts again
                firing = [r for r in rules if fires(r, value, track.history, at)]
                track.history.append((at, value))
                horizon = at - self._longest_window(rules)
                track.history = [(t, v) for t, v in track.history if t >= horizon] or [(at, value)]
                track.value = value
                detail = gpu.details.get(signal, "")
                if firing:
                    strongest = max(firing, key=lambda r: r.strength)
                    track.last_bad, track.clean, track.detail = at, 0, detail
                    if track.rule is None:
                        track.rule, track.since = strongest, at
                        transitions.append(Transition(FAILING, gpu.bdf, gpu.index, signal, strongest, value, at,
                                                      detail=detail))
                    elif strongest.strength > track.rule.strength:
                        track.rule = strongest
                        transitions.append(Transition(ESCALATED, gpu.bdf, gpu.index, signal, strongest, value, at,
                                                      detail=detail))
                elif track.rule is not None:
                    track.clean += 1
                    held = self.policy_rule(track.rule)
                    hold_off = held.hold_off_seconds if held.hold_off_seconds is not None \
                        else self.policy.hold_off_seconds
                    readings = held.recovery_readings if held.recovery_readings is not None \
                        else self.policy.recovery_readings
                    if track.clean >= readings and at - track.last_bad >= hold_off:
                        transitions.append(Transition(RECOVERED, gpu.bdf, gpu.index, signal, track.rule, value, at,
                                                      out_of_service=at - track.since, detail=track.detail))
                        track.rule, track.clean, track.detail = None, 0, ""
        return self._decision(at, transitions)

    def _decision(self, at: float, transitions: List[Transition]) -> Decision:
        findings = []
        for (bdf, signal), track in sorted(self._tracks.items()):
            if track.rule is None:
                continue
            rule = self.policy_rule(track.rule)
            findings.append(Finding(bdf, self._index.get(bdf, -1), signal, rule, track.value, track.since,
                                    track.detail))
        ladder = tuple(LadderRequest(t.bdf, t.signal, LADDER_STEPS[0]) for t in transitions
                       if t.kind in (FAILING, ESCALATED) and t.rule.remediate)
        return Decision(at, tuple(findings), tuple(transitions), ladder)

    def policy_rule(self, held: Rule) -> Rule:
        """The row a held signal answers to now: itself, or after a policy change the strongest row left."""
        rules = self.policy.rules_of(held.signal)
        if held in rules or not rules:
            return held
        return max(rules, key=lambda r: r.strength)
