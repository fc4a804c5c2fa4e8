# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""What a Node tells gpu-aware about its GPUs (DESIGN section 3).

gpu-device publishes three annotations on each Node:

* ``metax-tech.com/gpu.devices``: JSON list of devices with ``health``
  (``Healthy``/``Unhealthy``) and ``allocated`` (bool);
* ``metax-tech.com/gpu.topology.scores`` / ``.losses``: JSON objects keyed
  by count ``"1".."F"`` (F = free healthy devices now) with the integer score
  (higher is better) and loss (lower is better) of the best allocation of that
  size (scales in ``plugins/module_utils/gpu/scoring.py``).

From those, :func:`gpu_state` derives a :class:`GpuState`: how many devices
the node has in total, how many are free and healthy, and the per-count
tables. Sources, best first:

* free: healthy and unallocated entries of ``gpu.devices``; else the largest
  key of the scores table; else ``status.allocatable`` (the scheduler's own
  resource fit then accounts for the pods already there);
* total: the length of ``gpu.devices``; else ``status.capacity``; else
  ``status.allocatable``; else the free count.

A malformed annotation is skipped (the next source is used) and noted in
``GpuState.problems``; it never fails a request.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Tuple

from ..names import ANNOTATION_DEVICES, ANNOTATION_LOSSES, ANNOTATION_SCORES, RESOURCE_NAME
from .demand import QuantityError, json_type, quantity_count

# (devices, scores, losses, capacity, allocatable) as found on the Node.
NodeFields = Tuple[Optional[str], Optional[str], Optional[str], Any, Any]

_EMPTY: Mapping[str, Any] = {}


@dataclass(frozen=True)
class GpuState:
    """A node's GPUs as gpu-aware sees them. Immutable, shared between nodes with equal inputs."""

    total: int                                  # devices on the node (any health)
    free: int                                   # free healthy devices now
    scores: Optional[Mapping[int, int]] = None  # count -> score (higher is better)
    losses: Optional[Mapping[int, int]] = None  # count -> loss (lower is better)
    source: str = "none"                        # where `free` came from: devices|scores|allocatable|none
    problems: Tuple[str, ...] = ()              # annotations that could not be used
    # Derived, for the hot paths: count -> (score, loss) for the counts both tables have, and the
    # largest request the node can serve now (min of free and total).
    pairs: Mapping[int, Tuple[int, int]] = field(default_factory=dict, compare=False, repr=False)
    fit: int = field(default=0, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.scores is not None and self.losses is not None and not self.pairs:
            losses = self.losses
            object.__setattr__(self, "pairs", {n: (s, losses[n]) for n, s in self.scores.items() if n in losses})
        object.__setattr__(self, "fit", min(self.free, self.total))

    def table(self, count: int) -> Optional[Tuple[int, int]]:
        """(score, loss) for a request of ``count`` devices, or None when either is unknown."""
        return self.pairs.get(count)


NO_GPU = GpuState(total=0, free=0)


def _parse_table(text: Any) -> Dict[int, int]:
    if not isinstance(text, str):
        raise ValueError("not a string")
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    table: Dict[int, int] = {}
    for key, item in value.items():
        count = int(key)
        if count < 1 or str(count) != key.strip():
            raise ValueError("key %r is not a count" % key)
        if isinstance(item, bool) or not isinstance(item, int):
            raise ValueError("value for %r is not an integer" % key)
        table[count] = item
    return table


def _parse_devices(text: Any) -> Tuple[int, int]:
    """(total, free healthy) from the ``gpu.devices`` annotation."""
    if not isinstance(text, str):
        raise ValueError("not a string")
    value = json.loads(text)
    if not isinstance(value, list):
        raise ValueError("not a JSON list")
    free = 0
    for device in value:
        if not isinstance(device, dict):
            raise ValueError("device entry is not an object")
        health = device.get("health")
        if isinstance(health, str) and health.lower() == "healthy" and not device.get("allocated"):
            free += 1
    return len(value), free


def _count(value: Any) -> Optional[int]:
    if value is None:
        return None
    try:
        return quantity_count(value)
    except QuantityError:
        return None


def gpu_state(fields: NodeFields) -> GpuState:
    """Pure: the :class:`GpuState` of a node from its annotation texts and resource quantities."""
    devices_text, scores_text, losses_text, capacity, allocatable = fields
    problems = []
    total: Optional[int] = None
    free: Optional[int] = None
    source = "none"
    if devices_text is not None:
        try:
            total, free = _parse_devices(devices_text)
            source = "devices"
        except (ValueError, TypeError) as exc:
            problems.append("%s: %s" % (ANNOTATION_DEVICES, exc))
    scores: Optional[Dict[int, int]] = None
    losses: Optional[Dict[int, int]] = None
    if scores_text is not None:
        try:
            scores = _parse_table(scores_text)
        except (ValueError, TypeError) as exc:
            problems.append("%s: %s" % (ANNOTATION_SCORES, exc))
    if losses_text is not None:
        try:
            losses = _parse_table(losses_text)
        except (ValueError, TypeError) as exc:
            problems.append("%s: %s" % (ANNOTATION_LOSSES, exc))
    capacity_count = _count(capacity)
    allocatable_count = _count(allocatable)
    if free is None and scores is not None:
        # unservable sizes are published with score 0 (issue 12 contract)
        free = max((n for n, v in scores.items() if v > 0), default=0)
        source = "scores"
    if free is None and allocatable_count is not None:
        free = allocatable_count
        source = "allocatable"
    if free is None:
        free = 0
    if total is None:
        for candidate in (capacity_count, allocatable_count):
            if candidate is not None:
                total = candidate
                break
        else:
            total = free
    if scores is None or losses is None:
        scores = losses = None
    return GpuState(total=total, free=free, scores=scores, losses=losses, source=source,
                    problems=tuple(problems))


def metadata_field(obj: Any, key: str) -> Optional[str]:
    """A non-empty string under ``metadata`` (name, resourceVersion...), else None."""
    if isinstance(obj, Mapping):
        metadata = obj.get("metadata")
        if isinstance(metadata, Mapping):
            value = metadata.get(key)
            if isinstance(value, str) and value:
                return value
    return None


def node_name(node: Mapping[str, Any]) -> Optional[str]:
    return metadata_field(node, "name")


def node_fields(node: Mapping[str, Any]) -> NodeFields:
    """The inputs of :func:`gpu_state` from a Node object (a parsed JSON dict)."""
    metadata = node.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    status = node.get("status")
    if not isinstance(annotations, Mapping):
        annotations = _EMPTY
    if not isinstance(status, Mapping):
        status = _EMPTY
    capacity = status.get("capacity") or _EMPTY
    allocatable = status.get("allocatable") or _EMPTY
    return (annotations.get(ANNOTATION_DEVICES), annotations.get(ANNOTATION_SCORES),
            annotations.get(ANNOTATION_LOSSES),
            capacity.get(RESOURCE_NAME) if isinstance(capacity, Mapping) else None,
            allocatable.get(RESOURCE_NAME) if isinstance(allocatable, Mapping) else None)


_ANNOTATIONS_READ = (ANNOTATION_DEVICES, ANNOTATION_SCORES, ANNOTATION_LOSSES)
# Quantity texts already parsed (a cluster has a handful: "8", "4", "16"...); bounded.
_GOOD_QUANTITIES: Dict[Any, bool] = {}


def _quantity_problem(value: Any) -> Optional[str]:
    if value is None or (isinstance(value, str) and value in _GOOD_QUANTITIES):
        return None
    try:
        quantity_count(value)
    except QuantityError as exc:
        return str(exc)
    if isinstance(value, str) and len(_GOOD_QUANTITIES) < 1024:
        _GOOD_QUANTITIES[value] = True
    return None


def node_problem(node: Mapping[str, Any]) -> Optional[str]:
    """What is wrong with the fields of a request's Node that gpu-aware reads, as
    ``"<path>: <problem>"`` relative to the Node (``metadata.annotations``...), or None.

    Wrong JSON types and unparseable quantities: a Go client cannot decode such a
    Node, so kube-scheduler never sends one. The *content* of gpu-device's
    annotations is not checked here: an unusable table is the node's problem, not
    the request's (see :func:`gpu_state`).
    """
    metadata = node.get("metadata")
    if isinstance(metadata, Mapping):
        annotations = metadata.get("annotations")
        if annotations is not None:
            if not isinstance(annotations, Mapping):
                return "metadata.annotations: expected an object or null, got %s" % json_type(annotations)
            for key in _ANNOTATIONS_READ:
                value = annotations.get(key)
                if value is not None and not isinstance(value, str):
                    return 'metadata.annotations["%s"]: expected a string, got %s' % (key, json_type(value))
    status = node.get("status")
    if status is None:
        return None
    if not isinstance(status, Mapping):
        return "status: expected an object or null, got %s" % json_type(status)
    for part in ("capacity", "allocatable"):
        resources = status.get(part)
        if resources is None:
            continue
        if not isinstance(resources, Mapping):
            return "status.%s: expected an object or null, got %s" % (part, json_type(resources))
        problem = _quantity_problem(resources.get(RESOURCE_NAME))
        if problem is not None:
            return 'status.%s["%s"]: %s' % (part, RESOURCE_NAME, problem)
    return None


class StateCache:
    """Memoises :func:`gpu_state` by its inputs.

    Consecutive requests carry the same annotation texts for most nodes; this
    keeps gpu-aware from re-parsing them. Bounded: cleared when it reaches
    ``limit`` entries. Safe to share between threads (a lost insert only costs
    a re-parse).
    """

    def __init__(self, limit: int = 50000) -> None:
        self.limit = limit
        self._entries: Dict[NodeFields, GpuState] = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def state(self, fields: NodeFields) -> GpuState:
        try:
            found = self._entries.get(fields)
        except TypeError:            # an unhashable value (a list where a string belongs)
            return gpu_state(fields)
        if found is not None:
            self.hits += 1
            return found
        self.misses += 1
        state = gpu_state(fields)
        with self._lock:
            if len(self._entries) >= self.limit:
                self._entries = {}
            self._entries[fields] = state
        return state

    def __len__(self) -> int:
        return len(self._entries)
