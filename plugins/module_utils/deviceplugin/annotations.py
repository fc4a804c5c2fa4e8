# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The node annotations gpu-device publishes (DESIGN section 3).

``metax-tech.com/gpu.topology.scores``  {"1": s1, ..., "N": sN}: communication
    score of the best allocation of n devices from those free and healthy now
``metax-tech.com/gpu.topology.losses``  same keys: topology damage that
    allocation would cause to the devices left free
Contract (issue 12; HAMi's metax plugin reads exactly these two tables as a
Go ``map[int]int`` and ranks with ``2000 - losses[n]`` / ``2000 - scores[n]``):

The two tables are serialised by :func:`~..gpu.allocator.topology_annotations`
(the tested serialiser: clamping, padding and :func:`~..gpu.allocator.bounded_loss`):

- keys ``"1"`` .. ``"C"``, C = device capacity of the node (healthy or not),
  always present on a node with devices; ``{}`` only on a node without devices;
- a size that cannot be served now (more than the free healthy devices)
  carries the worst values: score 0 and loss :data:`MAX_LOSS`;
- scores in 0..1000 (higher = better communication), losses in 0..1000
  (lower = less damage); a servable size never reaches :data:`MAX_LOSS`;
- losses are a monotone compression of the allocator's weighted cut, so
  within one node the order of sizes and candidate sets is unchanged (ties
  may appear only between very large cuts).

``metax-tech.com/gpu.devices``          [{"id", "index", "bdf", "uuid", "gpu",
    "vf", "numa", "link_group", "link_kind", "health", "allocated"}, ...]

:func:`node_annotations` is pure; :class:`AnnotationPublisher` keeps the Node
in step in the background and retries while the apiserver is away, so the
device plugin never waits for it.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Callable, Dict, FrozenSet, List, Mapping, Optional

from ..backoff import Backoff
from ..kube.client import core_v1
from ..kube.node import OwnNode, merge_patch as node_merge_patch
from ..gpu.allocator import topology_annotations
from . import constants as C
from .devices import Snapshot

LOG = logging.getLogger("gpu-device.annotations")


def _compact(value) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=False)


def device_entries(snapshot: Snapshot, allocated: FrozenSet[str]) -> List[dict]:
    """The ``gpu.devices`` list: present devices by index, then devices gone from the bus."""
    inventory = snapshot.inventory
    group_of: Dict[int, int] = {}
    kind_of: Dict[int, str] = {}
    if inventory is not None:
        for number, group in enumerate(inventory.topology.link_groups):
            for gpu_index in group.gpu_indices:
                group_of[gpu_index] = number
                kind_of[gpu_index] = group.kind
    present = sorted((a for a in snapshot.devices if a.device is not None), key=lambda a: a.device.index if a.device is not None else -1)
    gone = [a for a in snapshot.devices if a.device is None]
    out = []
    for adv in present + gone:
        dev = adv.device
        out.append({
            "id": adv.id,
            "index": dev.index if dev else None,
            "bdf": dev.bdf if dev else adv.id,
            "uuid": dev.uuid if dev else None,
            "gpu": dev.gpu_index if dev else None,
            "vf": dev.is_vf if dev else None,
            "numa": adv.numa_node,
            "link_group": group_of.get(dev.gpu_index) if dev else None,
            "link_kind": kind_of.get(dev.gpu_index) if dev else None,
            "health": C.HEALTHY if adv.healthy else C.UNHEALTHY,
            "allocated": adv.id in allocated,
        })
    return out


def free_indices(snapshot: Snapshot, allocated: FrozenSet[str]) -> List[int]:
    """Indices (in the snapshot's inventory) of devices that are healthy, present and not allocated."""
    inventory = snapshot.inventory
    if inventory is None:
        return []
    index_of = {d.id: d.index for d in inventory.devices}
    return sorted(index_of[a.id] for a in snapshot.devices
                  if a.healthy and a.id in index_of and a.id not in allocated)


def node_annotations(snapshot: Snapshot, allocated: FrozenSet[str]) -> Dict[str, str]:
    """The three annotations for the current devices and allocations."""
    inventory = snapshot.inventory
    out = topology_annotations(inventory.topology if inventory is not None else None,
                               free_indices(snapshot, allocated), capacity=len(snapshot.devices))
    out[C.ANNOTATION_DEVICES] = _compact(device_entries(snapshot, allocated))
    return out


def merge_patch(annotations: Mapping[str, Optional[str]]) -> dict:
    """A JSON merge patch (RFC 7386) setting only these annotations (kube/node.py's)."""
    return node_merge_patch(annotations=annotations)


class AnnotationPublisher:
    """Patch the Node's annotations whenever :meth:`trigger` reports a change.

    ``compute()`` returns the desired annotations; ``patch(annotations)``
    writes them (raises on failure). Failures are retried with backoff while
    the device plugin keeps serving. Every ``resync`` seconds without a change
    the Node is read (``read()``: its annotations) and written again only if
    it no longer carries what was published (repairing manual edits): at
    steady state nothing is written (docs/scale.md measured 12 PATCH per node
    per hour when every resync wrote). Without ``read``, or when the read
    fails (an older ClusterRole without ``get``), the resync writes as before.
    """

    def __init__(self, compute: Callable[[], Dict[str, str]], patch: Callable[[Dict[str, str]], None],
                 stop: threading.Event, resync: float = 300.0,
                 on_result: Optional[Callable[[bool], None]] = None,
                 read: Optional[Callable[[], Mapping[str, str]]] = None) -> None:
        self.compute = compute
        self.patch = patch
        self.read = read
        self.resync_reads = 0
        self.stop = stop
        self.resync = resync
        self.on_result = on_result
        self._wake = threading.Event()
        self.published: Optional[Dict[str, str]] = None
        self.failures = 0
        self.writes = 0
        self._thread: Optional[threading.Thread] = None

    def trigger(self) -> None:
        self._wake.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="annotations", daemon=True)
        self._thread.start()

    def join(self, timeout: float = 5.0) -> None:
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def run(self) -> None:
        backoff = Backoff(initial=1.0, cap=30.0)
        while not self.stop.is_set():
            self._wake.clear()
            try:
                desired = self.compute()
            except Exception as exc:  # pylint: disable=broad-except
                LOG.exception("cannot compute the node annotations: %s", exc)
                desired = None
            if desired is not None and desired != self.published:
                try:
                    self.patch(desired)
                except Exception as exc:  # pylint: disable=broad-except
                    self.failures += 1
                    delay = backoff.next_delay()
                    LOG.warning("cannot patch the node annotations (retrying in %.1fs): %s", delay, exc)
                    if self.on_result:
                        self.on_result(False)
                    self._sleep(delay)
                    continue
                backoff.reset()
                self.published = desired
                self.writes += 1
                if self.on_result:
                    self.on_result(True)
                LOG.info("node annotations updated", extra={"fields": {
                    "scores": desired.get(C.ANNOTATION_SCORES), "losses": desired.get(C.ANNOTATION_LOSSES)}})
            if self._wake.wait(self.resync):
                continue
            self.published = self._still_published(self.published)

    def _still_published(self, published: Optional[Dict[str, str]]) -> Optional[Dict[str, str]]:
        """On resync: ``published`` when the Node still carries it (no write), else None (write again)."""
        if published is None or self.read is None:
            return None
        self.resync_reads += 1
        try:
            current = self.read()
        except Exception as exc:  # pylint: disable=broad-except  # 403 on an older ClusterRole, apiserver away
            LOG.debug("cannot read the node on resync, writing the annotations again: %s", exc)
            return None
        if all(current.get(key) == value for key, value in published.items()):
            return published
        LOG.info("node annotations changed by someone else: writing them again")
        return None

    def _sleep(self, delay: float) -> None:
        """Sleep ``delay`` unless stopping (changes do not cut a backoff short)."""
        self.stop.wait(delay)


def kube_node_annotations(api_client, node_name: str,
                          timeout: float = 10.0) -> Callable[[], Mapping[str, str]]:
    """``read()`` for :class:`AnnotationPublisher`: the Node's annotations (RBAC: ``get`` on nodes; kube/node.py)."""
    return OwnNode(core_v1(api_client), node_name, timeout).annotations


def kube_node_patcher(api_client, node_name: str, timeout: float = 10.0) -> Callable[[Dict[str, str]], None]:
    """``patch(annotations)`` for :class:`AnnotationPublisher`: a merge patch of only these annotations (kube/node.py)."""
    own = OwnNode(core_v1(api_client), node_name, timeout)

    def patch(annotations: Dict[str, str]) -> None:
        own.patch(annotations=annotations)
    return patch
