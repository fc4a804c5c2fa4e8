# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The one list/watch of the collection: a small reflector over raw JSON.

List, then watch from the list's resourceVersion with bookmarks
(``allowWatchBookmarks``); a watch the server ends is resumed from the last
resourceVersion seen (an event's or a bookmark's), without a list; ``410
Gone`` (the version was compacted away) lists again at once; other failures
reconnect after a backoff (:mod:`..backoff`), from the same version or, when
the caller's view must not outlive a break (driver-manager's), from a new
list. An optional periodic resync lists again. A stop event ends it.

The decisions are :class:`WatchState`'s, pure and testable without a server;
:class:`ListWatch` is the loop around them, over a :class:`Source` (the
transport: :class:`RawSource` talks to the API server through the
``kubernetes`` client, tests use fakes) and a :class:`Handler` (what the
caller keeps: gpu-aware's node cache and weights, driver-manager's wakes).

Objects are the API server's JSON as dicts: the client's model classes cost
milliseconds per Node, and the handlers read a handful of fields.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Protocol, Tuple

from ..backoff import Backoff
from ..errors import MetaxGpuError
from .client import ApiException
from .pages import DEFAULT_PAGE_SIZE, raw_list

__all__ = ["Expired", "Handler", "ListWatch", "RawSource", "Source", "Step", "WatchError", "WatchPolicy",
           "WatchState", "classify"]

CONNECT_TIMEOUT = 10.0
LIST_READ_TIMEOUT = 120.0
# The server's end of a watch; the client's read timeout is this plus WATCH_SLACK, so a watch that
# hangs (no TCP keepalive in the client) is reopened instead of waiting forever.
WATCH_SLACK = 30.0
# A watch that ends sooner than this without an event is the server refusing to hold it: the
# next one waits a backoff delay instead of spinning.
SPIN_SECONDS = 1.0
OBJECT_EVENTS = ("ADDED", "MODIFIED", "DELETED")


class Expired(MetaxGpuError):
    """The resourceVersion is too old (HTTP 410 Gone, or a watch ERROR event with code 410): list again."""


class WatchError(MetaxGpuError):
    """The watch stream carried an ERROR event other than 410 (a reconnect, after a backoff)."""


class Source(Protocol):  # pragma: no cover - interface
    def list(self, resource_version: Optional[str]) -> Tuple[List[Dict[str, Any]], str]:
        """(items, the list's resourceVersion); ``resource_version`` "0" reads the server's cache."""

    def watch(self, resource_version: str, timeout_seconds: int) -> Iterator[Dict[str, Any]]:
        """Watch events ``{"type": ..., "object": {...}}`` until the server ends the watch."""

    def close(self) -> None:
        """Abort a watch in progress (called from another thread on shutdown)."""


class Handler(Protocol):  # pragma: no cover - interface
    def replace(self, items: List[Dict[str, Any]]) -> None:
        """The complete current set of objects (after a list)."""

    def apply(self, event_type: str, obj: Dict[str, Any]) -> None:
        """One ADDED / MODIFIED / DELETED event."""


# -- the decisions (pure) ---------------------------------------------------------------------

@dataclass(frozen=True)
class WatchPolicy:
    """How one watch behaves.

    ``list_version``: the list's resourceVersion ("0": from the API server's watch cache, which a
    quiet kind needs -- a consistent read is refused with 504 when that cache lags behind etcd;
    None: a consistent read). ``resync_seconds``: list again this often (None: never).
    ``relist_after_error``: a broken watch lists again (the view is rebuilt) instead of resuming
    from the version it had. ``watch_seconds``: the server's end of each watch.
    """

    list_version: Optional[str] = None
    resync_seconds: Optional[float] = None
    relist_after_error: bool = False
    watch_seconds: int = 300


@dataclass(frozen=True)
class Step:
    """What one watch event means: ``apply`` (an object event for the handler), ``bookmark``
    (only the resume point moves) or ``skip`` (not an object: ignored, the version kept)."""

    action: str
    event_type: str = ""
    obj: Optional[Dict[str, Any]] = None


def _version_of(obj: Any) -> Optional[str]:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    value = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
    return value if isinstance(value, str) and value else None


def classify(event: Mapping[str, Any]) -> Step:
    """One raw watch event -> its Step; an ERROR event raises (Expired for 410, else WatchError)."""
    kind = str(event.get("type") or "")
    obj = event.get("object")
    if kind == "ERROR":
        code = obj.get("code") if isinstance(obj, Mapping) else None
        if code == 410:
            raise Expired("resourceVersion too old (410 Gone)")
        message = obj.get("message") if isinstance(obj, Mapping) else obj
        raise WatchError("watch error %s: %s" % (code, message))
    if kind == "BOOKMARK":
        return Step("bookmark", kind)
    if kind in OBJECT_EVENTS and isinstance(obj, dict):
        return Step("apply", kind, obj)
    return Step("skip", kind)


class WatchState:
    """Where a watch resumes from and when it lists: every transition of the loop, pure
    (``now`` is passed in: monotonic seconds)."""

    def __init__(self, policy: WatchPolicy) -> None:
        self.policy = policy
        self.version: Optional[str] = None      # the resume point; None: list first
        self.listed_at: Optional[float] = None

    def must_list(self, now: float) -> bool:
        """A list is due: none yet, the version was lost (410, a break), or the resync time came."""
        if self.version is None or self.listed_at is None:
            return True
        resync = self.policy.resync_seconds
        return resync is not None and now - self.listed_at >= resync

    def listed(self, version: str, now: float) -> None:
        self.version = version or None
        self.listed_at = now

    def watch_timeout(self, now: float) -> int:
        """The server-side timeout of the next watch: watch_seconds, cut to the next resync."""
        seconds = float(self.policy.watch_seconds)
        if self.policy.resync_seconds is not None and self.listed_at is not None:
            seconds = min(seconds, self.policy.resync_seconds - (now - self.listed_at))
        return max(1, int(seconds))

    def seen(self, event: Mapping[str, Any]) -> Step:
        """One event of the stream: the resume point moves to its object's version (a bookmark's too)."""
        step = classify(event)
        if step.action in ("apply", "bookmark"):
            self.version = _version_of(event.get("object")) or self.version
        return step

    def ended(self, events: int, elapsed: float) -> bool:
        """The server ended the watch: resumed from ``version``; True when it ended at once without an
        event (wait a backoff delay before the next, do not spin)."""
        return events == 0 and elapsed < SPIN_SECONDS

    def expired(self) -> None:
        """410 Gone: the version is no longer served: list again."""
        self.version = None

    def failed(self) -> bool:
        """The list or the watch broke; True when the view is dropped and rebuilt by a list."""
        if self.policy.relist_after_error or self.listed_at is None:
            self.version = None
            return True
        return False


# -- the loop (I/O) ---------------------------------------------------------------------------

def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return "%s: %s" % (type(exc).__name__, text[0][:300] if text else "")


class ListWatch:
    """Keep ``handler`` in step with one resource until :meth:`stop` (or ``stop`` is set).

    ``listed(count)`` is called after each list (the caller's metrics, or settling its heap),
    ``restarted()`` after each failure; a handler with a ``broken()`` method hears when its
    view is dropped (the next list rebuilds it). A handler's exception on one event is logged,
    not a break of the watch.
    """

    def __init__(self, resource: str, source: Source, handler: Handler, logger: logging.Logger,
                 policy: WatchPolicy = WatchPolicy(), backoff: Optional[Backoff] = None,
                 stop: Optional[threading.Event] = None, listed: Optional[Callable[[int], None]] = None,
                 restarted: Optional[Callable[[], None]] = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.resource = resource
        self.source = source
        self.handler = handler
        self.log = logger
        self.state = WatchState(policy)
        self.backoff = backoff or Backoff(initial=0.5, cap=30.0)
        self.stopping = stop if stop is not None else threading.Event()
        self.on_listed = listed
        self.on_restarted = restarted
        self.clock = clock
        self.thread: Optional[threading.Thread] = None
        self.lists = 0
        self.restarts = 0

    def start(self) -> "ListWatch":
        self.thread = threading.Thread(target=self.run, name="listwatch-" + self.resource, daemon=True)
        self.thread.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        self.stopping.set()
        try:
            self.source.close()
        except Exception:  # pylint: disable=broad-except
            pass
        if self.thread is not None:
            self.thread.join(timeout)

    def _list(self) -> None:
        items, version = self.source.list(self.state.policy.list_version)
        self.handler.replace(items)
        count = len(items)
        del items
        self.state.listed(version, self.clock())
        self.backoff.reset()
        self.lists += 1
        if self.on_listed is not None:
            self.on_listed(count)
        self.log.debug("listed %d %s at resourceVersion %s", count, self.resource, version)

    def _watch(self) -> None:
        state = self.state
        started = self.clock()
        events = 0
        for event in self.source.watch(state.version or "", state.watch_timeout(started)):
            if self.stopping.is_set():
                return
            events += 1
            step = state.seen(event)
            if step.action == "apply" and step.obj is not None:
                try:
                    self.handler.apply(step.event_type, step.obj)
                except Exception:  # pylint: disable=broad-except
                    self.log.exception("%s: handling a %s event failed", self.resource, step.event_type)
            if state.must_list(self.clock()):
                return
        if events:
            self.backoff.reset()
        elif state.ended(events, self.clock() - started) and not self.stopping.is_set():
            self.stopping.wait(self.backoff.next_delay())

    def _broken(self) -> None:
        broken = getattr(self.handler, "broken", None)
        if callable(broken):
            broken()

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                if self.state.must_list(self.clock()):
                    self._list()
                self._watch()
            except Expired:
                self.log.info("%s watch: resourceVersion %s expired, listing again", self.resource, self.state.version)
                self.state.expired()
                self._broken()
            except Exception as exc:  # pylint: disable=broad-except  # urllib3/socket errors of many kinds
                if self.stopping.is_set():
                    return
                self.restarts += 1
                if self.on_restarted is not None:
                    self.on_restarted()
                if self.state.failed():
                    self._broken()
                delay = self.backoff.next_delay()
                self.log.warning("%s list/watch failed (%s); retrying in %.1fs", self.resource, _short(exc), delay)
                self.stopping.wait(delay)


# -- the transport: the kubernetes client, raw JSON --------------------------------------------

def _lines(resp: Any) -> Iterator[bytes]:
    """The newline-delimited JSON of a watch response."""
    pending = b""
    for chunk in resp.stream(amt=None, decode_content=False):
        if not chunk:
            continue
        parts = (pending + chunk).split(b"\n")
        pending = parts.pop()
        for line in parts:
            if line.strip():
                yield line
    if pending.strip():
        yield pending


class RawSource:
    """A :class:`Source` over one ``list_*`` method of the ``kubernetes`` client, read as raw JSON.

    ``call`` is e.g. ``core.list_node`` or ``functools.partial(core.list_namespaced_config_map, ns)``;
    ``params`` are fixed query parameters such as ``field_selector``. Lists are read ``page_size``
    items at a time (:func:`.pages.list_all`: an expired continue token starts over).
    """

    def __init__(self, call: Callable[..., Any], page_size: int = DEFAULT_PAGE_SIZE, **params: Any) -> None:
        self.call = call
        self.page_size = page_size
        self.params = params
        self._lock = threading.Lock()
        self._current: Optional[Any] = None

    def list(self, resource_version: Optional[str] = None) -> Tuple[List[Dict[str, Any]], str]:
        # In pages, not one response: decoding a page is one C call that holds the GIL, so the
        # requests served meanwhile wait for one page (a few ms), not for the whole list (hundreds
        # of ms at 2,000 nodes, docs/scale.md). A list with a limit is a consistent snapshot.
        try:
            listing = raw_list(self.call, page_size=self.page_size, resource_version=resource_version,
                               timeout=(CONNECT_TIMEOUT, LIST_READ_TIMEOUT), **self.params)
        except ApiException as exc:
            if getattr(exc, "status", 0) == 410:
                raise Expired("the list's resourceVersion expired (410 Gone)") from None
            raise
        return listing.items, listing.resource_version

    def watch(self, resource_version: str, timeout_seconds: int) -> Iterator[Dict[str, Any]]:
        try:
            resp = self.call(watch=True, resource_version=resource_version, allow_watch_bookmarks=True,
                             timeout_seconds=int(timeout_seconds), _preload_content=False,
                             _request_timeout=(CONNECT_TIMEOUT, float(timeout_seconds) + WATCH_SLACK), **self.params)
        except ApiException as exc:
            if getattr(exc, "status", 0) == 410:
                raise Expired("the watch's resourceVersion expired (410 Gone)") from None
            raise
        with self._lock:
            self._current = resp
        try:
            for line in _lines(resp):
                event = json.loads(line)
                if isinstance(event, dict):
                    yield event
        finally:
            with self._lock:
                self._current = None
            try:
                resp.close()
                resp.release_conn()
            except Exception:  # pylint: disable=broad-except
                pass

    def close(self) -> None:
        """Wake a blocked watch read (shutdown)."""
        with self._lock:
            resp = self._current
        if resp is None:
            return
        for holder in (getattr(resp, "connection", None), getattr(resp, "_connection", None)):
            sock = getattr(holder, "sock", None)
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        try:
            resp.close()
        except Exception:  # pylint: disable=broad-except
            pass
