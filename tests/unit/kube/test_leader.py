# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Leader election through a Lease (kube/leader.py): the pure decisions with the clock passed in,
and LeaderElector over an in-memory Lease store that keeps the API server's rules (create of an
existing name: 409; replace with a stale resourceVersion: 409). Against a real API server:
tests/integration/test_operator_controller_apiserver.py."""

from __future__ import annotations

import copy
import json
import threading
from typing import Any, Dict, Optional

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.kube import leader
from ansible_collections.metax.gpu.plugins.module_utils.kube.client import ApiException
from ansible_collections.metax.gpu.plugins.module_utils.kube.leader import (
    Decision, LeaderElector, LeaderError, Observation, Record, decide, lease_body, observe, still_leading)

NS, NAME = "metax-operator", "metax-operator-controller"


def rec(holder: str, version: str = "1", duration: int = 15, transitions: int = 0) -> Record:
    return Record(holder=holder, duration=duration, transitions=transitions, acquire_time="t", version=version)


def test_an_absent_lease_is_created():
    assert decide(observe(None, None, 0.0), "a", 0.0) == Decision("create", take=True, transitions=0)


def test_the_holder_renews_without_a_transition():
    assert decide(observe(None, rec("a", transitions=2), 0.0), "a", 100.0) == Decision("update", False, 2)


def test_a_live_holder_is_waited_for_a_whole_duration_of_this_clock():
    first = observe(None, rec("b", "7"), 100.0)
    assert decide(first, "a", 100.0).action == "wait"
    # the same record (resourceVersion 7) seen again: its time stays that of the first sight
    again = observe(first, rec("b", "7"), 114.0)
    assert again.since == 100.0 and decide(again, "a", 114.9).action == "wait"
    taken = decide(observe(again, rec("b", "7"), 115.0), "a", 115.0)
    assert taken == Decision("update", take=True, transitions=1)


def test_a_renewal_restarts_the_wait_whatever_the_holders_clock_says():
    seen = observe(None, rec("b", "7"), 100.0)
    renewed = observe(seen, rec("b", "8"), 110.0)     # another write: the holder is alive
    assert renewed.since == 110.0 and decide(renewed, "a", 124.0).action == "wait"


def test_a_released_lease_is_taken_at_once():
    assert decide(observe(None, rec("", "9", duration=1, transitions=3), 50.0), "a", 50.0) == \
        Decision("update", take=True, transitions=4)


def test_still_leading_until_the_renew_deadline():
    assert still_leading(100.0, 109.9, 10) and not still_leading(100.0, 110.0, 10)


def test_lease_body_keeps_the_acquire_time_on_renewal_and_carries_the_version():
    previous = rec("a", "5", transitions=2)
    body = lease_body(NAME, NS, "a", 15, Decision("update", False, 2), previous, 1_790_000_000.5)
    assert body["metadata"] == {"name": NAME, "namespace": NS, "resourceVersion": "5"}
    assert body["spec"]["acquireTime"] == "t" and body["spec"]["renewTime"] == leader.micro_time(1_790_000_000.5)
    assert body["spec"]["leaseTransitions"] == 2 and body["spec"]["leaseDurationSeconds"] == 15
    taken = lease_body(NAME, NS, "b", 15, Decision("update", True, 3), previous, 1_790_000_000.5)
    assert taken["spec"]["acquireTime"] == taken["spec"]["renewTime"] and taken["spec"]["holderIdentity"] == "b"


class _Resp:
    def __init__(self, obj: Dict[str, Any]) -> None:
        self.data = json.dumps(obj).encode()

    def release_conn(self) -> None:
        return None


class LeaseStore:
    """The Lease API's rules, in memory: resourceVersion bumps on each write, 409 on a stale one."""

    def __init__(self) -> None:
        self.lease: Optional[Dict[str, Any]] = None
        self.version = 0
        self.fail = False
        self.writes = 0

    def _check(self) -> None:
        if self.fail:
            raise ApiException(status=503, reason="unavailable")

    def read_namespaced_lease(self, name: str, namespace: str, _preload_content: bool = True) -> _Resp:
        self._check()
        if self.lease is None:
            raise ApiException(status=404, reason="NotFound")
        return _Resp(self.lease)

    def _store(self, body: Dict[str, Any]) -> _Resp:
        self.version += 1
        self.writes += 1
        self.lease = copy.deepcopy(body)
        self.lease["metadata"]["resourceVersion"] = str(self.version)
        return _Resp(self.lease)

    def create_namespaced_lease(self, namespace: str, body: Dict[str, Any], _preload_content: bool = True) -> _Resp:
        self._check()
        if self.lease is not None:
            raise ApiException(status=409, reason="AlreadyExists")
        return self._store(body)

    def replace_namespaced_lease(self, name: str, namespace: str, body: Dict[str, Any],
                                 _preload_content: bool = True) -> _Resp:
        self._check()
        if self.lease is None or body["metadata"].get("resourceVersion") != self.lease["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        return self._store(body)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def electors(store: LeaseStore, clock: Clock) -> tuple:
    """Two candidates with client-go's durations (15 s, renew deadline 10 s, retry 2 s)."""
    return tuple(LeaderElector(store, NS, NAME, who, lease_duration=15, renew_deadline=10, retry_period=2,
                               clock=clock, wall=lambda: 1_790_000_000.0) for who in "ab")


def test_one_of_two_candidates_leads_and_the_other_takes_over_after_the_duration():
    store, clock = LeaseStore(), Clock()
    a, b = electors(store, clock)
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    assert store.lease["spec"]["holderIdentity"] == "a"
    clock.now += 5
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()   # renewed: b's wait restarts
    clock.now += 14.9                                                  # a stopped renewing (killed)
    assert not b.try_acquire_or_renew()
    clock.now += 0.1
    assert b.try_acquire_or_renew()
    assert store.lease["spec"]["holderIdentity"] == "b" and store.lease["spec"]["leaseTransitions"] == 1
    assert not a.try_acquire_or_renew()        # a, back, finds b's live Lease


def test_two_candidates_racing_for_an_expired_lease_one_wins():
    store, clock = LeaseStore(), Clock()
    a, b = electors(store, clock)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    clock.now += 20
    # both read the same expired record; the first replace wins, the second carries a stale version
    b_obs = observe(b._observed, leader.record_of(store.lease), clock.now)   # pylint: disable=protected-access
    c = LeaderElector(store, NS, NAME, "c", clock=clock)
    c._observed = b_obs                                                       # pylint: disable=protected-access
    assert b.try_acquire_or_renew()
    assert not c.try_acquire_or_renew() and store.lease["spec"]["holderIdentity"] == "b"


def test_release_lets_the_standby_take_over_at_its_next_try():
    store, clock = LeaseStore(), Clock()
    a, b = electors(store, clock)
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    assert a.release()
    assert store.lease["spec"]["holderIdentity"] == ""
    assert b.try_acquire_or_renew()
    assert not a.release() or store.lease["spec"]["holderIdentity"] == "b"


def test_release_never_overwrites_a_successor():
    store, clock = LeaseStore(), Clock()
    a, b = electors(store, clock)
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    clock.now += 16
    assert b.try_acquire_or_renew()
    a._observed = Observation(rec("a", "1"), 0.0)    # what a last saw   # pylint: disable=protected-access
    assert not a.release()                           # stale version: 409
    assert store.lease["spec"]["holderIdentity"] == "b"


def test_keep_reports_the_loss_after_the_renew_deadline_of_failed_renewals():
    store, clock = LeaseStore(), Clock()
    a, _b = electors(store, clock)
    assert a.acquire(threading.Event())
    lost = []
    stop = threading.Event()
    store.fail = True                      # the API server unreachable from here on

    real_wait = stop.wait

    def tick(_timeout: float) -> bool:     # each period: the clock moves a retry period on
        clock.now += a.retry_period
        return real_wait(0)

    stop.wait = tick  # type: ignore[method-assign]
    a.keep(stop, lambda: lost.append(clock.now))
    assert lost == [1000.0 + 10.0]         # the first try at or after renew_deadline (10 s) gives up


def test_keep_stops_at_once_when_another_holder_is_seen():
    store, clock = LeaseStore(), Clock()
    a, b = electors(store, clock)
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    clock.now += 16
    assert b.try_acquire_or_renew()        # a was paused longer than the duration (a stopped process)
    stop, lost = threading.Event(), []

    def tick(_timeout: float) -> bool:
        clock.now += 1
        return False

    stop.wait = tick  # type: ignore[method-assign]
    a.keep(stop, lambda: lost.append(True))
    assert lost == [True] and store.lease["spec"]["holderIdentity"] == "b"


def test_acquire_returns_false_when_stopped():
    store, clock = LeaseStore(), Clock()
    a, b = electors(store, clock)
    assert a.try_acquire_or_renew()
    stop = threading.Event()
    stop.set()
    assert not b.acquire(stop)


def test_the_defaults_fail_over_within_the_operators_bound():
    """A standby takes over at most LEASE_DURATION + 1.2 * RETRY_PERIOD after the leader's last renewal
    (its jittered tries), leaving kopf's start and the reconcile the rest of the 15 s (docs/operator.md)."""
    assert leader.RENEW_DEADLINE < leader.LEASE_DURATION
    assert leader.LEASE_DURATION + 1.2 * leader.RETRY_PERIOD <= 10


def test_a_renew_deadline_not_shorter_than_the_duration_is_refused():
    with pytest.raises(LeaderError):
        LeaderElector(LeaseStore(), NS, NAME, "a", lease_duration=10, renew_deadline=10)


def test_a_connection_error_is_a_failed_try_not_a_dead_renewal_loop():
    store, clock = LeaseStore(), Clock()
    a, _b = electors(store, clock)
    assert a.try_acquire_or_renew()

    def refused(*_args, **_kwargs):
        raise ConnectionRefusedError("connection refused")

    store.read_namespaced_lease = refused  # type: ignore[method-assign]
    stop, lost = threading.Event(), []

    def tick(_timeout: float) -> bool:
        clock.now += a.retry_period
        return False

    stop.wait = tick  # type: ignore[method-assign]
    a.keep(stop, lambda: lost.append(clock.now))
    assert lost == [1000.0 + 10.0]
