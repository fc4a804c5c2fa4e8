# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""driver-config's ``node-vfnums`` (manual section 3.2.3): parse, pick a node's entry, check it (pure).

The key holds YAML ``nodes: {<node>: {vfnum: N}}``. Each node's driver-manager
reads its own entry (:func:`node_entry`) and checks it against its GPUs with
:func:`.plan.plan` (allowed values, ``sriov_totalvfs``, ``gpu.sriov=forbidden``);
an entry for a node that does not exist is the controller's to refuse
(:func:`unknown_nodes`): no driver-manager runs there to notice it.
"""

from __future__ import annotations

from typing import Any, Iterable, List, Mapping, Optional

from .plan import ALLOWED_VFNUMS, VfnumError

NODE_VFNUMS_KEY = "node-vfnums"


def nodes_of(doc: Any) -> Mapping[str, Any]:
    """The ``nodes`` map of a parsed ``node-vfnums`` document ({} for an empty key)."""
    if doc is None:
        return {}
    if not isinstance(doc, Mapping):
        raise VfnumError("node-vfnums must be a map with a 'nodes' key, got %s" % type(doc).__name__)
    nodes = doc.get("nodes") or {}
    if not isinstance(nodes, Mapping):
        raise VfnumError("node-vfnums: 'nodes' must map node names to {vfnum: N}")
    return nodes


def node_entry(doc: Any, node: str) -> Optional[int]:
    """The vfnum asked for ``node`` (None: no entry, the node is left as it is).

    Raises VfnumError for an entry that is not ``{vfnum: <one of 0,1,2,4,8>}``.
    """
    entry = nodes_of(doc).get(node)
    if entry is None:
        return None
    if not isinstance(entry, Mapping) or "vfnum" not in entry:
        raise VfnumError("node-vfnums: the entry of %s must be {vfnum: N}, got %r" % (node, entry))
    value = entry["vfnum"]
    if isinstance(value, bool) or not isinstance(value, int) or value not in ALLOWED_VFNUMS:
        raise VfnumError("node-vfnums: vfnum %r for %s is not one of %s"
                         % (value, node, ", ".join(str(v) for v in ALLOWED_VFNUMS)))
    return value


def unknown_nodes(doc: Any, node_names: Iterable[str]) -> List[str]:
    """Entries naming no node of the cluster, sorted."""
    known = set(node_names)
    return sorted(str(name) for name in nodes_of(doc) if name not in known)
