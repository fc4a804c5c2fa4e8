# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""State gpu-aware keeps from the Kubernetes API: the node cache and the weights.

:class:`ListWatch` is a small reflector: list, then watch from the list's
resourceVersion (with bookmarks); a watch that ends is resumed from the last
resourceVersion seen; ``410 Gone`` (the version was compacted away) and the
periodic resync list again; errors reconnect with capped exponential backoff.
The transport (:class:`Source`) is injected: :mod:`.kube` talks to the API
server, tests use fakes.

Handlers receive plain JSON dicts. The node cache keeps only each node's
:class:`~.nodeinfo.GpuState`, not the Node objects.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Protocol, Sequence, Set, Tuple

from ..backoff import Backoff
from ..errors import MetaxGpuError
from ..names import GPU_AWARE_CONFIGMAP
from .metrics import ExtenderMetrics
from .nodeinfo import GpuState, StateCache, metadata_field, node_fields, node_name
from .policy import WeightError, Weights, weights_from_configmap


class Expired(MetaxGpuError):
    """The resourceVersion is too old (HTTP 410 Gone): list again."""


class Source(Protocol):  # pragma: no cover - interface
    def list(self) -> Tuple[List[Dict[str, Any]], str]:
        """(items, resourceVersion)."""

    def watch(self, resource_version: str, timeout_seconds: int) -> Iterator[Dict[str, Any]]:
        """Watch events ``{"type": ..., "object": {...}}`` until the server ends the watch."""

    def close(self) -> None:
        """Abort a watch in progress (called from another thread on shutdown)."""


class Handler(Protocol):  # pragma: no cover - interface
    def replace(self, items: List[Dict[str, Any]]) -> None:
        """The complete current set of objects (after a list)."""

    def apply(self, event_type: str, obj: Dict[str, Any]) -> None:
        """One ADDED / MODIFIED / DELETED event."""


class ListWatch:
    """Keep ``handler`` in step with one resource; runs in its own daemon thread."""

    def __init__(self, resource: str, source: Source, handler: Handler, metrics: ExtenderMetrics,
                 logger: logging.Logger, resync_seconds: float = 300.0, watch_seconds: int = 240,
                 backoff: Optional[Backoff] = None, settle_gc: bool = False) -> None:
        self.resource = resource
        self.settle_gc = settle_gc
        self.source = source
        self.handler = handler
        self.metrics = metrics
        self.log = logger
        self.resync_seconds = max(1.0, float(resync_seconds))
        self.watch_seconds = max(1, int(watch_seconds))
        self.backoff = backoff or Backoff(initial=0.5, cap=30.0)
        self.stopping = threading.Event()
        self.thread: Optional[threading.Thread] = None
        self.lists = 0

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

    def _list(self) -> str:
        items, version = self.source.list()
        self.handler.replace(items)
        count = len(items)
        del items
        if self.settle_gc:
            # The cache is long-lived: take it out of the cyclic collector's scans, so that full
            # collections during requests stay short (the objects are still freed by refcount).
            gc.collect()
            gc.freeze()
        self.lists += 1
        self.metrics.relists.inc(self.resource)
        self.log.debug("listed %d %s at resourceVersion %s", count, self.resource, version)
        return version

    def run(self) -> None:
        version: Optional[str] = None
        listed_at = 0.0
        while not self.stopping.is_set():
            try:
                if version is None or time.monotonic() - listed_at >= self.resync_seconds:
                    version = self._list()
                    listed_at = time.monotonic()
                    self.backoff.reset()
                remaining = self.resync_seconds - (time.monotonic() - listed_at)
                timeout = max(1, int(min(self.watch_seconds, remaining)))
                started = time.monotonic()
                events = 0
                for event in self.source.watch(version, timeout):
                    if self.stopping.is_set():
                        return
                    events += 1
                    version = self._event(event, version)
                    if time.monotonic() - listed_at >= self.resync_seconds:
                        break
                if events == 0 and time.monotonic() - started < 1.0 and not self.stopping.is_set():
                    # The server ended the watch at once: do not spin.
                    self.stopping.wait(self.backoff.next_delay())
            except Expired:
                self.log.info("%s watch: resourceVersion %s expired, listing again", self.resource, version)
                version = None
            except Exception as exc:  # pylint: disable=broad-except
                if self.stopping.is_set():
                    return
                self.metrics.watch_restarts.inc(self.resource)
                delay = self.backoff.next_delay()
                self.log.warning("%s list/watch failed (%s); retrying in %.1fs", self.resource,
                                 _short(exc), delay)
                self.stopping.wait(delay)

    def _event(self, event: Mapping[str, Any], version: Optional[str]) -> Optional[str]:
        kind = event.get("type")
        obj = event.get("object")
        if kind == "ERROR":
            code = obj.get("code") if isinstance(obj, Mapping) else None
            if code == 410:
                raise Expired()
            message = obj.get("message") if isinstance(obj, Mapping) else obj
            raise RuntimeError("watch error %s: %s" % (code, message))
        if not isinstance(obj, dict):
            return version
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            try:
                self.handler.apply(kind, obj)
            except Exception:  # pylint: disable=broad-except
                self.log.exception("%s: handling a %s event failed", self.resource, kind)
        return metadata_field(obj, "resourceVersion") or version


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return "%s: %s" % (type(exc).__name__, text[0][:300] if text else "")


# Request sizes the node cache indexes (a node with VFs can have 64 devices); larger
# requests fall back to per-name comparisons.
INDEXED_COUNTS = 64


class NodeCache:
    """Node name -> :class:`GpuState`, for NodeNames requests (``nodeCacheCapable: true``).

    Besides the states it keeps two indices per request size ``n`` (1..:data:`INDEXED_COUNTS`):
    the set of names that can serve ``n`` devices now, and name -> (score, loss) for ``n``. A
    request then costs one C-level lookup per name instead of Python work per node.

    One writer (the node ListWatch thread); readers need no lock: after a list every structure
    is replaced whole, after an event the node's entries are updated one by one (a reader may
    see a node half-updated for that instant, which is no different from seeing it a moment
    earlier or later).
    """

    def __init__(self, states: StateCache, metrics: ExtenderMetrics, logger: logging.Logger) -> None:
        self.states = states
        self.metrics = metrics
        self.log = logger
        self._nodes: Dict[str, GpuState] = {}
        self._fit: Dict[str, int] = {}
        self._fits: List[Set[str]] = [set() for _count in range(INDEXED_COUNTS + 1)]
        self._tables: List[Dict[str, Tuple[int, int]]] = [{} for _count in range(INDEXED_COUNTS + 1)]
        self.synced = threading.Event()

    def _state(self, node: Mapping[str, Any]) -> GpuState:
        return self.states.state(node_fields(node))

    @staticmethod
    def _index(name: str, state: GpuState, fits: List[Set[str]], tables: List[Dict[str, Tuple[int, int]]]) -> None:
        for count in range(1, min(state.fit, INDEXED_COUNTS) + 1):
            fits[count].add(name)
        for count, pair in state.pairs.items():
            if count <= INDEXED_COUNTS:
                tables[count][name] = pair

    @staticmethod
    def _unindex(name: str, state: GpuState, fits: List[Set[str]],
                 tables: List[Dict[str, Tuple[int, int]]]) -> None:
        for count in range(1, min(state.fit, INDEXED_COUNTS) + 1):
            fits[count].discard(name)
        for count in state.pairs:
            if count <= INDEXED_COUNTS:
                tables[count].pop(name, None)

    def replace(self, items: Iterable[Dict[str, Any]]) -> None:
        fresh: Dict[str, GpuState] = {}
        for node in items:
            if isinstance(node, dict):
                name = node_name(node)
                if name:
                    fresh[name] = self._state(node)
        fits: List[Set[str]] = [set() for _count in range(INDEXED_COUNTS + 1)]
        tables: List[Dict[str, Tuple[int, int]]] = [{} for _count in range(INDEXED_COUNTS + 1)]
        for name, state in fresh.items():
            self._index(name, state, fits, tables)
        self._fit = {name: state.fit for name, state in fresh.items()}
        self._fits = fits
        self._tables = tables
        self._nodes = fresh
        self.metrics.cache_nodes.set(value=len(fresh))
        if not self.synced.is_set():
            self.log.info("node cache synced: %d nodes", len(fresh))
        self.synced.set()
        self.metrics.cache_synced.set(value=1)

    def apply(self, event_type: str, obj: Dict[str, Any]) -> None:
        name = node_name(obj)
        if not name:
            return
        old = self._nodes.get(name)
        if event_type == "DELETED":
            self._nodes.pop(name, None)
            self._fit.pop(name, None)
            if old is not None:
                self._unindex(name, old, self._fits, self._tables)
        else:
            state = self._state(obj)
            if old is not state:
                if old is not None:
                    self._unindex(name, old, self._fits, self._tables)
                self._index(name, state, self._fits, self._tables)
                self._fit[name] = state.fit
                self._nodes[name] = state
        self.metrics.cache_nodes.set(value=len(self._nodes))

    def get(self, name: str) -> Optional[GpuState]:
        return self._nodes.get(name)

    @property
    def state_of(self) -> Callable[[str], Optional[GpuState]]:
        """``get`` for one request: the current dict's own method, a C call per name (filter asks it about
        every failing node). A list replaces the dict whole, so a request keeps one consistent view."""
        return self._nodes.get

    def lookup(self, names: Iterable[str]) -> List[Optional[GpuState]]:
        return list(map(self._nodes.get, names))

    def fits(self, names: Sequence[str], demand: int) -> List[bool]:
        """Per name: known and able to serve ``demand`` devices now (``filter_nodes``'s test)."""
        if demand <= 0:
            return list(map(self._nodes.__contains__, names))
        if demand <= INDEXED_COUNTS:
            return list(map(self._fits[demand].__contains__, names))
        get = self._fit.get
        return [get(name, -1) >= demand for name in names]

    def tables(self, names: Sequence[str], demand: int) -> List[Optional[Tuple[int, int]]]:
        """Per name: the (score, loss) entry for ``demand`` devices, None when unknown."""
        if 0 < demand <= INDEXED_COUNTS:
            return list(map(self._tables[demand].get, names))
        get = self._nodes.get
        return [None if state is None else state.pairs.get(demand) for state in map(get, names)]

    def __len__(self) -> int:
        return len(self._nodes)


class WeightsHolder:
    """The weights in use: the flags until the ConfigMap is read, then the ConfigMap's.

    A rejected ConfigMap keeps the last good weights, logs an error and sets
    ``gpu_aware_config_valid`` to 0 (``gpu_aware_config_errors_total`` counts
    rejections). A deleted ConfigMap returns to the flags.
    """

    def __init__(self, flags: Weights, metrics: ExtenderMetrics, logger: logging.Logger,
                 namespace: str = "", name: str = GPU_AWARE_CONFIGMAP) -> None:
        self.flags = flags
        self.current = flags
        self.metrics = metrics
        self.log = logger
        self.namespace = namespace
        self.name = name
        self.last_error: Optional[str] = None
        self._publish()

    def _publish(self) -> None:
        self.metrics.weight.set("score", value=self.current.score)
        self.metrics.weight.set("loss", value=self.current.loss)

    def _set(self, weights: Weights) -> None:
        if weights != self.current:
            self.log.info("weights: scoreWeight=%s lossWeight=%s (from %s)", weights.score, weights.loss,
                          weights.source)
            self.current = weights
            self.metrics.config_reloads.inc()
            self._publish()

    def configmap(self, data: Optional[Mapping[str, Any]]) -> bool:
        """Apply a ConfigMap's ``data``; False (and the old weights kept) when it is invalid."""
        source = "configmap %s/%s" % (self.namespace, self.name)
        try:
            weights = weights_from_configmap(data, self.flags, source)
        except WeightError as exc:
            self.last_error = str(exc)
            self.metrics.config_errors.inc()
            self.metrics.config_valid.set(value=0)
            self.log.error("ConfigMap %s/%s rejected, keeping scoreWeight=%s lossWeight=%s: %s",
                           self.namespace, self.name, self.current.score, self.current.loss, exc)
            return False
        self.last_error = None
        self.metrics.config_valid.set(value=1)
        self._set(weights)
        return True

    def absent(self) -> None:
        self.last_error = None
        self.metrics.config_valid.set(value=1)
        if self.current != self.flags:
            self.log.info("ConfigMap %s/%s absent: back to the flag weights", self.namespace, self.name)
        self._set(self.flags)

    # Handler interface (ListWatch over the one ConfigMap)
    def replace(self, items: List[Dict[str, Any]]) -> None:
        for item in items:
            if node_name(item) == self.name:
                self.configmap(item.get("data"))
                return
        self.absent()

    def apply(self, event_type: str, obj: Dict[str, Any]) -> None:
        if node_name(obj) != self.name:
            return
        if event_type == "DELETED":
            self.absent()
        else:
            self.configmap(obj.get("data"))
