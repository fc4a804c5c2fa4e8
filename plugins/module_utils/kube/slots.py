# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""A budget of N holders at once, as coordination.k8s.io Leases ``<prefix>-<i>``.

Whoever wants to do something that only N may do at once (driver-manager's
vfnum change, docs/operator.md "driver-config") takes a slot first and gives it
back after, without a controller in the path:

* take = create the Lease ``<prefix>-<i>`` (the API server's create is the
  lock: a second create of the same name gets 409) with the holder's identity;
* held = renewed (``renewTime``) every third of ``leaseDurationSeconds``;
* a Lease not renewed within its duration (its holder died) may be taken over:
  replaced with the resourceVersion read, so two nodes cannot both win it;
* given back = deleted, with the resourceVersion of the last write as a
  precondition, so a holder that lost its Lease never deletes its successor's.

The decision (:func:`choose`) is pure; :class:`Slots` is the I/O around it,
independent of its user (client, namespace, prefix, size, holder), so the
scale benchmark can reuse it. Expiry compares ``renewTime`` with this
machine's clock: nodes are assumed to keep time (NTP), as Kubernetes' own
components do; a few seconds of skew only delay or hasten a takeover.

Waiting for a slot (docs/design-decisions.md "vfnum slots: waiting"): the
user feeds a watch of the pool into :meth:`Slots.relisted` /
:meth:`Slots.seen`; :meth:`Slots.wait_turn` then blocks, without an API
call, until that view shows a slot free (deleted, or expired by the clock),
and :meth:`Slots.take` chooses from the view instead of listing. So that one
freed slot does not send every waiter's create at once, each holder has a
home slot (a hash of its identity): a waiter tries within ``spread`` seconds
of its home slot coming free, any other slot only after ``spread`` more, both
at a random point, and only if the view still shows it free by then -- the
first winner's ADDED event stops the others.
"""

from __future__ import annotations

import datetime
import logging
import random
import threading
import time
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence

from ..errors import MetaxGpuError
from ..names import LABEL_SLOT_POOL
from .client import ApiException

LOG = logging.getLogger("metax-gpu.slots")
POOL_LABEL = LABEL_SLOT_POOL                  # every Lease of a pool carries it: one list call sees them all
DEFAULT_DURATION = 30                         # seconds a holder that stopped renewing keeps its slot
# A waiter tries a freed home slot at a random point within TURN_SPREAD seconds, any other slot
# within the TURN_SPREAD after that: with W waiters over ``size`` home slots and an ADDED event
# that reaches the others within L seconds of the winner's create, a freed slot draws about
# 1 + (W / size) * L / TURN_SPREAD creates, and stays free for about TURN_SPREAD / (W / size + 1).
TURN_SPREAD = 1.0
# A slot whose take lost the race (409) counts as held in the view until the winner's event
# arrives, at most this many seconds (if that event came before the 409, nothing replaces it).
LOST_HOLD = 5


class SlotError(MetaxGpuError):
    """The Lease API failed (other than losing a race, which is just "no slot")."""


@dataclass(frozen=True)
class LeaseState:
    """One Lease of the pool as read."""

    name: str
    holder: str
    renewed: float             # renewTime, seconds since the epoch (0: never)
    duration: int
    version: str               # metadata.resourceVersion

    def expired(self, now: float) -> bool:
        return now > self.renewed + self.duration


@dataclass(frozen=True)
class Choice:
    """What :func:`choose` decided: ``create`` a missing slot, ``take_over`` an expired one,
    ``own`` one this holder already has (a restarted process), or ``none`` (all held: ``holders``)."""

    action: str
    name: Optional[str] = None
    version: Optional[str] = None
    holders: Sequence[str] = ()


def slot_names(prefix: str, size: int) -> List[str]:
    return ["%s-%d" % (prefix, i) for i in range(size)]


def choose(leases: Iterable[LeaseState], prefix: str, size: int, holder: str, now: float) -> Choice:
    """The slot to take, given the pool's Leases (pure).

    Live Leases of other holders count against ``size`` whatever their index: a
    pool shrunk while slots were held still admits no more than ``size``.
    """
    if size < 1:
        raise SlotError("a slot pool needs a size of at least 1 (got %d)" % size)
    pool = {lease.name: lease for lease in leases if lease.name.startswith(prefix + "-")}
    for lease in pool.values():
        if lease.holder == holder and not lease.expired(now):
            return Choice("own", lease.name, lease.version)
    live = sorted(lease.holder for lease in pool.values() if not lease.expired(now))
    if len(live) >= size:
        return Choice("none", holders=tuple(live))
    for name in slot_names(prefix, size):
        if name not in pool:
            return Choice("create", name)
        if pool[name].expired(now):
            return Choice("take_over", name, pool[name].version)
    return Choice("none", holders=tuple(live))


def home_slot(prefix: str, size: int, holder: str) -> str:
    """The slot ``holder`` tries first when several wait (a stable hash: the waiters spread evenly)."""
    return "%s-%d" % (prefix, zlib.crc32(holder.encode("utf-8")) % size)


def turn_pause(free: Sequence[str], home: str, spread: float, rnd: Callable[[], float]) -> float:
    """Seconds to let pass before trying one of the ``free`` slots: within ``spread`` for the home
    slot, within the ``spread`` after that for any other (``rnd``: uniform in [0, 1))."""
    return spread * rnd() if home in free else spread * (1.0 + rnd())


def micro_time(when: float) -> str:
    """A Lease's MicroTime (RFC 3339 with microseconds, UTC)."""
    stamp = datetime.datetime.fromtimestamp(when, datetime.timezone.utc)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _epoch(value: Any) -> float:
    """renewTime as JSON (a MicroTime string) -> seconds since the epoch."""
    if value is None:
        return 0.0
    text = str(value).rstrip("Z")
    head, _dot, frac = text.partition(".")
    base = datetime.datetime.strptime(head[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=datetime.timezone.utc)
    return base.timestamp() + (float("0." + frac) if frac.isdigit() else 0.0)


def lease_state(lease: Mapping[str, Any]) -> LeaseState:
    """A Lease, as the API server's JSON (a read's or a watch's), -> LeaseState."""
    meta, spec = lease.get("metadata") or {}, lease.get("spec") or {}
    return LeaseState(name=str(meta.get("name") or ""), holder=spec.get("holderIdentity") or "",
                      renewed=_epoch(spec.get("renewTime") or spec.get("acquireTime")),
                      duration=int(spec.get("leaseDurationSeconds") or DEFAULT_DURATION),
                      version=str(meta.get("resourceVersion") or ""))


class Slots:
    """A pool of ``size`` slots in ``namespace`` over ``api`` (kube/client.coordination_v1)."""

    def __init__(self, api: Any, namespace: str, prefix: str, size: int, holder: str,
                 duration: int = DEFAULT_DURATION, clock: Callable[[], float] = time.time) -> None:
        self.api = api
        self.namespace = namespace
        self.prefix = prefix
        self.size = size
        self.holder = holder
        self.duration = duration
        self.clock = clock
        self.held: Optional[str] = None
        self.version: Optional[str] = None        # resourceVersion of our last write
        self.holders: Sequence[str] = ()          # who held the pool when take() found no slot
        # the pool as a watch of it shows it (None: no watch fed it yet, take() lists)
        self.view: Optional[Dict[str, LeaseState]] = None
        self._seen = threading.Condition()
        self.home = home_slot(prefix, size, holder) if size > 0 else ""
        self.spread = TURN_SPREAD
        self.rnd: Callable[[], float] = random.random
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._renewer: Optional[threading.Thread] = None

    def _body(self, name: str, version: Optional[str] = None) -> dict:
        now = micro_time(self.clock())
        meta = {"name": name, "namespace": self.namespace, "labels": {POOL_LABEL: self.prefix}}
        if version:
            meta["resourceVersion"] = version
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
                "spec": {"holderIdentity": self.holder, "leaseDurationSeconds": self.duration,
                         "acquireTime": now, "renewTime": now}}

    def leases(self) -> List[LeaseState]:
        try:
            found = self.api.list_namespaced_lease(self.namespace, label_selector="%s=%s" % (POOL_LABEL, self.prefix))
        except ApiException as exc:
            raise SlotError("listing the %s leases: %s %s" % (self.prefix, exc.status, exc.reason))
        return [lease_state(item) for item in found.get("items") or []]

    # -- the watched view -----------------------------------------------------------
    def relisted(self, items: Iterable[Any]) -> None:
        """A watch (re)opened with this list of the pool's Leases (JSON): the view is that list."""
        with self._seen:
            self.view = {lease.name: lease for lease in (lease_state(item) for item in items)}
            self._seen.notify_all()

    def seen(self, kind: str, item: Any) -> None:
        """A watch event (``ADDED``/``MODIFIED``/``DELETED``, the Lease's JSON) into the view."""
        if not isinstance(item, Mapping) or item.get("metadata") is None:
            return
        state = lease_state(item)
        with self._seen:
            if self.view is None:      # not listed yet (or the watch broke): the next list says it all
                return
            if kind == "DELETED":
                self.view.pop(state.name, None)
            elif kind in ("ADDED", "MODIFIED"):
                self.view[state.name] = state
            self._seen.notify_all()

    def unwatched(self) -> None:
        """The watch broke: take() lists again until it reopens."""
        with self._seen:
            self.view = None
            self._seen.notify_all()

    def free(self, now: Optional[float] = None) -> List[str]:
        """The slots the view shows this holder could take now ([] when none, or no view)."""
        with self._seen:
            return self._free(self.clock() if now is None else now)

    def _free(self, now: float) -> List[str]:
        if self.view is None:
            return []
        choice = choose(self.view.values(), self.prefix, self.size, self.holder, now)
        if choice.action in ("none", "own"):
            return []
        live = {n for n, lease in self.view.items() if not lease.expired(now)}
        return [name for name in slot_names(self.prefix, self.size) if name not in live]

    def _next_expiry(self, now: float) -> Optional[float]:
        """Seconds until the next live Lease of the view expires (None: none to wait for)."""
        ahead = [lease.renewed + lease.duration - now for lease in (self.view or {}).values()
                 if not lease.expired(now) and lease.holder != self.holder]
        return max(0.05, min(ahead)) if ahead else None

    def wait_turn(self, stop: threading.Event, timeout: float) -> bool:
        """Block until it is this holder's turn to :meth:`take`: the view shows a slot free, and still
        does after :func:`turn_pause`. True then; False after ``timeout`` or on ``stop``. Without a
        view (no watch) only ``timeout`` ends it, and True: the caller retries blindly, the fallback."""
        deadline = time.monotonic() + timeout
        while not stop.is_set():
            with self._seen:
                if self.view is None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return True
                    self._seen.wait(min(remaining, 1.0))
                    continue
                free = self._free(self.clock())
                if not free:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                    expiry = self._next_expiry(self.clock())
                    # a second at most: ``stop`` is an Event, not this condition
                    self._seen.wait(min(remaining, expiry if expiry is not None else remaining, 1.0))
                    continue
            if stop.wait(turn_pause(free, self.home, self.spread, self.rnd)):
                return False
            if self.free():           # nobody was faster (their ADDED would have filled it)
                return True
        return False

    def _lost(self, name: str) -> None:
        """A take of ``name`` lost the race, so the view is behind the server there: until the
        winner's event arrives (it replaces this), the view counts the slot held for LOST_HOLD
        seconds -- else the waiter, seeing it free still, would wake and lose again and again."""
        with self._seen:
            if self.view is None:
                return
            have = self.view.get(name)
            if have is not None and have.version and not have.expired(self.clock()):
                return     # the winner's event came before the 409: the view shows the slot held already
            self.view[name] = LeaseState(name, "?", self.clock(), LOST_HOLD, "")

    def take(self) -> Optional[str]:
        """A slot's name, now held (renewed in the background until :meth:`release`); None when all
        ``size`` are held by others (``holders`` says by whom) or another taker won the race.
        With a watched view, chosen from it without a list (a stale view only costs a 409)."""
        if self.held:
            return self.held
        now = self.clock()
        with self._seen:
            # a lost race's mark past its hold (no resourceVersion: no Lease read) is not a Lease to take
            # over -- a replace without a version is refused (400) -- but a slot not known: tried as missing
            view = [lease for lease in self.view.values() if lease.version or not lease.expired(now)] \
                if self.view is not None else None
        choice = choose(view if view is not None else self.leases(), self.prefix, self.size, self.holder, now)
        self.holders = choice.holders
        if choice.action == "none" or choice.name is None:
            return None
        try:
            if choice.action == "create":
                written = self.api.create_namespaced_lease(self.namespace, self._body(choice.name))
            else:      # own (a restart of ours) or take_over: replaced with the version read
                written = self.api.replace_namespaced_lease(choice.name, self.namespace,
                                                            self._body(choice.name, choice.version))
        except ApiException as exc:
            if exc.status in (409, 422):     # another taker was first (exists / version moved on)
                self._lost(choice.name)
                return None
            raise SlotError("taking %s: %s %s" % (choice.name, exc.status, exc.reason))
        self.held, self.version = choice.name, written["metadata"]["resourceVersion"]
        if choice.action == "take_over":
            LOG.info("slot %s taken over from a holder that stopped renewing it", choice.name)
        self._start_renewing()
        return self.held

    def renew(self) -> bool:
        """Renew the held slot once; False when it was lost (someone took it over)."""
        with self._lock:
            if not self.held:
                return False
            try:
                written = self.api.replace_namespaced_lease(self.held, self.namespace,
                                                            self._body(self.held, self.version))
            except ApiException as exc:
                if exc.status in (404, 409):
                    LOG.warning("slot %s lost (%s)", self.held, exc.status)
                    self.held = self.version = None
                    return False
                raise SlotError("renewing %s: %s %s" % (self.held, exc.status, exc.reason))
            self.version = written["metadata"]["resourceVersion"]
            return True

    def release(self) -> None:
        """Give the slot back (a no-op when none is held or it was lost)."""
        self._stop.set()
        if self._renewer is not None and self._renewer is not threading.current_thread():
            self._renewer.join(timeout=5.0)
        self._renewer = None
        with self._lock:
            if not self.held:
                return
            name, version = self.held, self.version
            self.held = self.version = None
            try:
                self.api.delete_namespaced_lease(name, self.namespace,
                                                 body={"preconditions": {"resourceVersion": version}})
            except ApiException as exc:
                if exc.status not in (404, 409):     # gone, or someone else's now: not ours to delete
                    raise SlotError("releasing %s: %s %s" % (name, exc.status, exc.reason))

    def _start_renewing(self) -> None:
        self._stop.clear()

        def loop() -> None:
            while not self._stop.wait(self.duration / 3.0):
                try:
                    if not self.renew():
                        return
                except SlotError as exc:
                    LOG.warning("%s; retried", exc)
        self._renewer = threading.Thread(target=loop, name="slot-renew", daemon=True)
        self._renewer.start()
