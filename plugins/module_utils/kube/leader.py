# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Leader election through a coordination.k8s.io Lease, as Kubernetes' own controllers do.

The rules are client-go's ``leaderelection`` (kube-controller-manager,
kube-scheduler), with shorter durations (below):

* acquire: the Lease is absent (create it: the API server's create is the
  lock), or its holder has not renewed it for ``leaseDurationSeconds`` *as
  this process observed it* (the record's resourceVersion unchanged for that
  long on this machine's monotonic clock: no trust in the other node's wall
  clock), or it was released (empty holder); taken with a replace carrying the
  resourceVersion read, so two candidates cannot both win (409 for the loser);
* renew: the leader rewrites ``renewTime`` every ``retry_period``; when no
  renewal has succeeded for ``renew_deadline`` it has lost the lease and
  must stop acting (``renew_deadline`` < ``lease_duration``: it stops before
  another may take over);
* release: on a clean exit the holder is emptied, so a standby takes over at
  its next try instead of after ``lease_duration``.

The decisions (:func:`observe`, :func:`decide`, :func:`still_leading`) are
pure, with the clock passed in; :class:`LeaderElector` is the I/O around them.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional

from ..errors import MetaxGpuError
from .client import ApiException
from .pages import raw_json
from .slots import micro_time

LOG = logging.getLogger("metax-gpu.leader")
# client-go's defaults are 15 / 10 / 2 s; the operator's failover bound is 15 s from the
# leader's death to the standby's reconcile (docs/operator.md), so shorter: a standby
# takes over at most LEASE_DURATION + 1.2 * RETRY_PERIOD after the last renewal it saw.
LEASE_DURATION = 8      # seconds a standby waits after the last renewal it saw
RENEW_DEADLINE = 6      # seconds the leader keeps acting without a successful renewal (< LEASE_DURATION)
RETRY_PERIOD = 1.5      # seconds between tries (acquire and renew)


class LeaderError(MetaxGpuError):
    """The Lease API failed (other than losing a race, which is just "not leading")."""


@dataclass(frozen=True)
class Record:
    """The leader election record of the Lease, as read."""

    holder: str
    duration: int
    transitions: int
    acquire_time: Optional[str]
    version: str                 # metadata.resourceVersion


@dataclass(frozen=True)
class Observation:
    """The record as this process last saw it, and when (its monotonic clock) it last changed."""

    record: Optional[Record]
    since: float


@dataclass(frozen=True)
class Decision:
    """``create`` the Lease, ``update`` it (a renewal, or a takeover when ``take``), or ``wait``."""

    action: str
    take: bool = False
    transitions: int = 0


def observe(previous: Optional[Observation], record: Optional[Record], now: float) -> Observation:
    """The new observation: its time moves only when the record changed (another write happened)."""
    if previous is not None and previous.record is not None and record is not None \
            and previous.record.version == record.version:
        return previous
    return Observation(record, now)


def decide(observation: Observation, identity: str, now: float) -> Decision:
    """What this candidate does with the Lease as observed (pure)."""
    record = observation.record
    if record is None:
        return Decision("create", take=True, transitions=0)
    if record.holder == identity:
        return Decision("update", take=False, transitions=record.transitions)
    if record.holder and now < observation.since + record.duration:
        return Decision("wait", transitions=record.transitions)
    # expired (not renewed while we watched for a whole duration) or released
    return Decision("update", take=True, transitions=record.transitions + 1)


def still_leading(last_renewed: float, now: float, renew_deadline: float = RENEW_DEADLINE) -> bool:
    """Whether a leader whose last successful renewal was at ``last_renewed`` may still act."""
    return now - last_renewed < renew_deadline


def lease_body(name: str, namespace: str, identity: str, duration: int, decision: Decision,
               previous: Optional[Record], wall: float) -> Dict[str, Any]:
    """The Lease to write for ``decision`` (``wall``: seconds since the epoch, for the record's times)."""
    stamp = micro_time(wall)
    acquired = stamp if decision.take or previous is None else (previous.acquire_time or stamp)
    body: Dict[str, Any] = {
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"holderIdentity": identity, "leaseDurationSeconds": duration, "acquireTime": acquired,
                 "renewTime": stamp, "leaseTransitions": decision.transitions},
    }
    if previous is not None:
        body["metadata"]["resourceVersion"] = previous.version
    return body


def record_of(lease: Optional[Dict[str, Any]]) -> Optional[Record]:
    """A Lease as JSON (None: absent) -> Record."""
    if lease is None:
        return None
    spec = lease.get("spec") or {}
    return Record(holder=spec.get("holderIdentity") or "", duration=int(spec.get("leaseDurationSeconds") or LEASE_DURATION),
                  transitions=int(spec.get("leaseTransitions") or 0), acquire_time=spec.get("acquireTime"),
                  version=str(lease["metadata"].get("resourceVersion") or ""))


class LeaderElector:
    """One candidate for the Lease ``namespace/name`` (``api``: kube/client.coordination_v1)."""

    def __init__(self, api: Any, namespace: str, name: str, identity: str,
                 lease_duration: int = LEASE_DURATION, renew_deadline: float = RENEW_DEADLINE,
                 retry_period: float = RETRY_PERIOD, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        if renew_deadline >= lease_duration:
            raise LeaderError("renew deadline (%ss) must be shorter than the lease duration (%ss)"
                              % (renew_deadline, lease_duration))
        self.api = api
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self._clock = clock
        self._wall = wall
        self._observed: Optional[Observation] = None
        self.last_renewed: Optional[float] = None   # monotonic time of the last successful write as holder

    def _read(self) -> Optional[Dict[str, Any]]:
        try:
            resp = self.api.read_namespaced_lease(self.name, self.namespace, _preload_content=False)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise LeaderError("reading Lease %s/%s: %s" % (self.namespace, self.name, exc))
        return raw_json(resp)

    def try_acquire_or_renew(self) -> bool:
        """One round: whether this candidate holds the Lease now."""
        now = self._clock()
        self._observed = observe(self._observed, record_of(self._read()), now)
        decision = decide(self._observed, self.identity, now)
        if decision.action == "wait":
            return False
        previous = self._observed.record
        body = lease_body(self.name, self.namespace, self.identity, self.lease_duration, decision, previous, self._wall())
        try:
            if decision.action == "create":
                written = self.api.create_namespaced_lease(self.namespace, body, _preload_content=False)
            else:
                written = self.api.replace_namespaced_lease(self.name, self.namespace, body, _preload_content=False)
        except ApiException as exc:
            if exc.status in (409, 422):   # another candidate wrote first (created, or a newer resourceVersion)
                return False
            raise LeaderError("writing Lease %s/%s: %s" % (self.namespace, self.name, exc))
        self._observed = Observation(record_of(raw_json(written)), now)
        if decision.take:
            LOG.info("%s acquired the Lease %s/%s", self.identity, self.namespace, self.name)
        self.last_renewed = now
        return True

    def _try(self) -> bool:
        """One round that never raises: an API server restarting (an ApiException, or a connection
        error of the HTTP library) is a failed try, so the renewal loop counts it against the
        renew deadline instead of dying and leaving a leader that never learns it lost the Lease."""
        try:
            return self.try_acquire_or_renew()
        except Exception as exc:  # pylint: disable=broad-except
            LOG.warning("Lease %s/%s: %s", self.namespace, self.name, exc)
            return False

    def acquire(self, stop: threading.Event) -> bool:
        """Block until this candidate leads (True) or ``stop`` is set (False)."""
        while not stop.is_set():
            if self._try():
                return True
            # client-go's JitterUntil: a little jitter so that candidates do not try in step
            stop.wait(self.retry_period * (1.0 + 0.2 * random.random()))
        return False

    def keep(self, stop: threading.Event, on_lost: Callable[[], None]) -> None:
        """Renew every ``retry_period`` until ``stop``; ``on_lost`` when no renewal succeeded for
        ``renew_deadline`` (or another holder is seen): the caller must stop acting at once."""
        while not stop.wait(self.retry_period):
            if self._try():
                continue
            record = self._observed.record if self._observed else None
            taken = record is not None and record.holder not in ("", self.identity)
            if taken or not still_leading(self.last_renewed or 0.0, self._clock(), self.renew_deadline):
                LOG.error("%s lost the Lease %s/%s%s", self.identity, self.namespace, self.name,
                          " to %s" % record.holder if taken and record else "")
                on_lost()
                return

    def release(self) -> bool:
        """Give the Lease up (a clean exit): the holder emptied, the resourceVersion as a precondition,
        so a Lease already taken over is never overwritten. Whether it was released."""
        record = self._observed.record if self._observed else None
        if record is None or record.holder != self.identity:
            return False
        body = lease_body(self.name, self.namespace, "", 1, Decision("update", transitions=record.transitions),
                          record, self._wall())
        try:
            self.api.replace_namespaced_lease(self.name, self.namespace, body, _preload_content=False).release_conn()
        except ApiException as exc:
            LOG.warning("releasing Lease %s/%s: %s", self.namespace, self.name, exc)
            return False
        self._observed = None
        LOG.info("%s released the Lease %s/%s", self.identity, self.namespace, self.name)
        return True
