# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Removing the labels and annotations under one prefix from Nodes (module ``metax.gpu.node_metadata``).

Uninstalling removes what our agents wrote on every node. One merge patch per
node that carries such keys (``null`` deletes a key), nodes without any left
alone, so a cluster of thousands of nodes costs one paged list plus a patch
per node we touched, not a task per node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional

from ..errors import MetaxGpuError

__all__ = ["NodeChange", "PrefixError", "changes", "check_prefix", "diff", "merge_patch"]

# Kubernetes' own prefixes: removing them would unmake the node (kubernetes.io/hostname, node-role...).
RESERVED = ("kubernetes.io/", "k8s.io/")


class PrefixError(MetaxGpuError):
    """A prefix that is not one DNS-subdomain prefix of our own."""


def check_prefix(prefix: str) -> str:
    """``prefix`` when it names one subdomain's keys (``example.com/``), else PrefixError: nothing is changed."""
    domain = prefix[:-1]
    if not prefix.endswith("/") or not domain or "/" in domain:
        raise PrefixError("prefix %r: expected a DNS subdomain followed by '/', such as 'metax-tech.com/'" % prefix)
    if any(prefix == r or prefix.endswith("." + r) for r in RESERVED):
        raise PrefixError("prefix %r is Kubernetes' own: its labels are not ours to remove" % prefix)
    return prefix


@dataclass(frozen=True)
class NodeChange:
    """The keys to remove from one node."""

    name: str
    labels: Dict[str, str] = field(default_factory=dict)        # key -> its value before removal
    annotations: Dict[str, str] = field(default_factory=dict)


def _under(values: Optional[Mapping[str, str]], prefix: str) -> Dict[str, str]:
    return {k: v for k, v in sorted((values or {}).items()) if k.startswith(prefix)}


def changes(nodes: Iterable[Mapping[str, Any]], prefix: str) -> List[NodeChange]:
    """For each node carrying a label or annotation under ``prefix``, what goes (nodes without any: none)."""
    out = []
    for node in nodes:
        meta = node.get("metadata") or {}
        labels, annotations = _under(meta.get("labels"), prefix), _under(meta.get("annotations"), prefix)
        if labels or annotations:
            out.append(NodeChange(meta.get("name", ""), labels, annotations))
    return out


def merge_patch(change: NodeChange) -> Dict[str, Any]:
    """The JSON merge patch removing the change's keys (``None`` deletes a key)."""
    meta: Dict[str, Any] = {}
    if change.labels:
        meta["labels"] = dict.fromkeys(change.labels)
    if change.annotations:
        meta["annotations"] = dict.fromkeys(change.annotations)
    return {"metadata": meta}


def diff(done: Iterable[NodeChange]) -> Dict[str, Any]:
    """Ansible's before/after: per node the removed keys with their values, then none of them."""
    done = list(done)
    return {"before": {c.name: {"labels": c.labels, "annotations": c.annotations} for c in done},
            "after": {c.name: {"labels": {}, "annotations": {}} for c in done}}
