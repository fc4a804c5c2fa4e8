# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""State gpu-aware keeps from the Kubernetes API: the node cache and the weights.

Both are handlers of the collection's one list/watch (:mod:`..kube.watch`):
list, then watch from the list's resourceVersion with bookmarks, resumed from
the last version seen; ``410 Gone`` and the periodic resync list again;
errors reconnect with capped exponential backoff. :func:`list_watch` sets it
up as gpu-aware runs it; the transport is :class:`..kube.watch.RawSource`
(tests use fakes).

Handlers receive plain JSON dicts. The node cache keeps only each node's
:class:`~.nodeinfo.GpuState`, not the Node objects.
"""

from __future__ import annotations

import gc
import logging
import threading
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from ..backoff import Backoff
from ..kube.client import core_v1
from ..kube.watch import Handler, ListWatch, RawSource, Source, WatchPolicy
from ..names import GPU_AWARE_CONFIGMAP
from .metrics import ExtenderMetrics
from .nodeinfo import GpuState, StateCache, node_fields, node_name
from .policy import WeightError, Weights, weights_from_configmap


# Items per list page of the node list. A Node decodes in 50-150 us here (4 KB with our annotations;
# real nodes with image lists are larger), so a page holds the GIL for a few milliseconds.
LIST_PAGE_SIZE = 50


def list_watch(resource: str, source: Source, handler: Handler, metrics: ExtenderMetrics, logger: logging.Logger,
               resync_seconds: float = 300.0, watch_seconds: int = 240, backoff: Optional[Backoff] = None,
               settle_gc: bool = False) -> ListWatch:
    """gpu-aware's watch of one resource (:class:`..kube.watch.ListWatch`): a consistent list, resumed
    from the last version after a failure, listed again every ``resync_seconds``; the relists and
    restarts counted in ``metrics``.

    ``settle_gc``: the cache is long-lived: after each list it leaves the cyclic collector's scans,
    so that full collections during requests stay short (the objects are still freed by refcount).
    """
    def listed(_count: int) -> None:
        if settle_gc:
            gc.collect()
            gc.freeze()
        metrics.relists.labels(resource).inc()

    policy = WatchPolicy(list_version=None, resync_seconds=max(1.0, float(resync_seconds)),
                         relist_after_error=False, watch_seconds=max(1, int(watch_seconds)))
    return ListWatch(resource, source, handler, logger, policy, backoff or Backoff(initial=0.5, cap=30.0),
                     listed=listed, restarted=lambda: metrics.watch_restarts.labels(resource).inc())


def node_source(api_client: Any) -> RawSource:
    """Every Node, read in pages of LIST_PAGE_SIZE."""
    return RawSource(core_v1(api_client).list_node, page_size=LIST_PAGE_SIZE)


def configmap_source(api_client: Any, namespace: str, name: str) -> RawSource:
    """The one ConfigMap ``namespace/name`` (a list and watch by ``metadata.name``)."""
    core = core_v1(api_client)

    def call(**kwargs: Any) -> Any:
        return core.list_namespaced_config_map(namespace, **kwargs)

    return RawSource(call, field_selector="metadata.name=" + name)


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
        self.metrics.cache_nodes.set(len(fresh))
        if not self.synced.is_set():
            self.log.info("node cache synced: %d nodes", len(fresh))
        self.synced.set()
        self.metrics.cache_synced.set(1)

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
        self.metrics.cache_nodes.set(len(self._nodes))

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
        self.metrics.weight.labels("score").set(self.current.score)
        self.metrics.weight.labels("loss").set(self.current.loss)

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
            self.metrics.config_valid.set(0)
            self.log.error("ConfigMap %s/%s rejected, keeping scoreWeight=%s lossWeight=%s: %s",
                           self.namespace, self.name, self.current.score, self.current.loss, exc)
            return False
        self.last_error = None
        self.metrics.config_valid.set(1)
        self._set(weights)
        return True

    def absent(self) -> None:
        self.last_error = None
        self.metrics.config_valid.set(1)
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
