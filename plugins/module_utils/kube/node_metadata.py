# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Removing the labels and annotations under one prefix from Nodes (module ``metax.gpu.node_metadata``).

Uninstalling removes what our agents wrote on every node. One merge patch per
node that carries such keys (``null`` deletes a key), nodes without any left
alone, so a cluster of thousands of nodes costs one paged list plus a patch
per node we touched, not a task per node. The stripping itself is
:mod:`.node`'s (the one routine, shared with the operator's cleanup); here
only what the module adds: the prefix check and Ansible's diff.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping

from ..errors import MetaxGpuError
from .node import NodeChange, strip_changes

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


def changes(nodes: Iterable[Mapping[str, Any]], prefix: str) -> List[NodeChange]:
    """For each node carrying a label or annotation under ``prefix``, what goes (nodes without any: none)."""
    return strip_changes(nodes, [prefix], [prefix])


def merge_patch(change: NodeChange) -> Dict[str, Any]:
    """The JSON merge patch removing the change's keys (``None`` deletes a key)."""
    return {"metadata": change.metadata_patch()}


def diff(done: Iterable[NodeChange]) -> Dict[str, Any]:
    """Ansible's before/after: per node the removed keys with their values, then none of them."""
    done = list(done)
    return {"before": {c.name: {"labels": c.labels, "annotations": c.annotations} for c in done},
            "after": {c.name: {"labels": {}, "annotations": {}} for c in done}}
