# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""gpu-aware's two verbs, ``filter`` and ``prioritize``, from request bytes to
(status, body chunks): no HTTP here (extender/server.py carries them).

Thread-safe. A NodeNames request (``nodeCacheCapable: true``) is answered
from the node cache, a Nodes request from the nodes it carries.
"""

from __future__ import annotations

import logging
from itertools import compress
from typing import Any, Dict, List, Optional, Tuple, Union

from .cache import NodeCache, WeightsHolder
from .demand import PodSpecError, pod_demand
from .metrics import ExtenderMetrics
from .nodeinfo import GpuState, StateCache, metadata_field, node_fields
from .policy import filter_nodes, filter_outcome, prioritize, scores_from_tables
from .wire import (
    BadRequest, ParsedArgs, error_result, filter_result_names, filter_result_nodes, parse_args,
    priority_list)

Response = Tuple[int, List[bytes]]
Body = Union[bytes, bytearray]      # bodies are read into a bytearray as they arrive


class ExtenderService:
    """filter / prioritize from request bytes to (status, body chunks). Thread-safe."""

    def __init__(self, weights: WeightsHolder, metrics: ExtenderMetrics, logger: logging.Logger,
                 nodes: Optional[NodeCache] = None, states: Optional[StateCache] = None) -> None:
        self.weights = weights
        self.metrics = metrics
        self.log = logger
        self.nodes = nodes
        self.states = states or StateCache()
        self._reported: Dict[Tuple[str, ...], bool] = {}
        self._last_demand: Tuple[Optional[Dict[str, Any]], int] = (None, 0)

    # ------------------------------------------------------------- helpers
    def _extract(self, node: Dict[str, Any]) -> GpuState:
        state = self.states.state(node_fields(node))
        if state.problems and state.problems not in self._reported:
            self._reported[state.problems] = True
            self.metrics.annotation_errors.inc()
            self.log.warning("node %s: unusable annotation (%s)", metadata_field(node, "name"),
                             "; ".join(state.problems))
        return state

    def ready(self) -> bool:
        return self.nodes is None or self.nodes.synced.is_set()

    def _parse(self, body: Body) -> Tuple[ParsedArgs, int]:
        args = parse_args(body, self._extract)
        # parse_args hands prioritize the very Pod object filter decoded (wire.POD_MEMO): its demand
        # is known then. The tuple is read once, so a concurrent request never pairs a Pod with
        # another's demand; holding the Pod keeps its id from being reused.
        pod, demand = self._last_demand
        if pod is args.pod:
            return args, demand
        try:
            demand = pod_demand(args.pod)
        except PodSpecError as exc:
            raise BadRequest(str(exc)) from None
        self._last_demand = (args.pod, demand)
        return args, demand

    def _cache(self) -> NodeCache:
        """The node cache for a NodeNames request, or :class:`_CacheUnavailable`."""
        if self.nodes is None:
            raise _CacheUnavailable("gpu-aware runs without a node cache (--no-node-cache); "
                                    "set nodeCacheCapable: false in the scheduler's extender configuration")
        if not self.nodes.synced.is_set():
            raise _CacheUnavailable("gpu-aware's node cache has not synced with the API server yet")
        return self.nodes

    @staticmethod
    def _pod_ref(args: ParsedArgs) -> str:
        return "%s/%s" % (metadata_field(args.pod, "namespace") or "", metadata_field(args.pod, "name") or "")

    # --------------------------------------------------------------- verbs
    def filter(self, body: Body) -> Response:
        try:
            args, demand = self._parse(body)
        except BadRequest as exc:
            return 400, [error_result(str(exc))]
        names = args.names
        if args.node_names_form:
            try:
                cache = self._cache()
            except _CacheUnavailable as exc:
                return 200, [error_result(str(exc))]
            fits = cache.fits(names, demand)
            outcome = filter_outcome(demand, names, fits, cache.state_of)
        else:
            outcome = filter_nodes(demand, names, args.extracted)
        self.metrics.nodes.labels("passed").inc(len(outcome.passed))
        if outcome.failed:
            self.metrics.nodes.labels("failed").inc(len(outcome.failed))
        if outcome.unresolvable:
            self.metrics.nodes.labels("unresolvable").inc(len(outcome.unresolvable))
        if self.log.isEnabledFor(logging.DEBUG):
            self.log.debug("filter %s: demand %d, %d nodes, %d pass, %d fail, %d unresolvable", self._pod_ref(args),
                           demand, len(names), len(outcome.passed), len(outcome.failed),
                           len(outcome.unresolvable))
        if args.node_names_form:
            return 200, [filter_result_names(list(compress(names, fits)), outcome.failed, outcome.unresolvable,
                                             args.plain_names)]
        return 200, filter_result_nodes(args, outcome.passed, outcome.failed, outcome.unresolvable)

    def prioritize(self, body: Body) -> Response:
        try:
            args, demand = self._parse(body)
        except BadRequest as exc:
            return 400, [error_result(str(exc))]
        weights = self.weights.current
        if args.node_names_form:
            try:
                cache = self._cache()
            except _CacheUnavailable as exc:
                return 503, [error_result(str(exc))]
            if demand <= 0:
                scores = prioritize(demand, [None] * len(args.names), weights)
            else:
                scores = scores_from_tables(cache.tables(args.names, demand), weights)
        else:
            scores = prioritize(demand, args.extracted, weights)
        if self.log.isEnabledFor(logging.DEBUG):
            best = sorted(zip(scores, args.names), reverse=True)[:5]
            self.log.debug("prioritize %s: demand %d, weights %s/%s, top %s", self._pod_ref(args), demand,
                           weights.score, weights.loss, best)
        return 200, [priority_list(args.names, scores, args.plain_names)]


class _CacheUnavailable(Exception):
    pass
