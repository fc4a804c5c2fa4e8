# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""driver-config's ``vfio`` entry, in the shape a real 0.9.2 install carries it (pure).

The key (:data:`..names.DRIVER_CONFIG_VFIO_KEY`) holds a YAML list::

    - nodeName: vm
      gpus: "6,7"          # GPU indices as mx-smi numbers them, comma-separated, or "all"

The caller parses the YAML (the agent has PyYAML; this module stays standard
library). Each node's vfio-manager reads its own entry (:func:`node_selection`);
an entry naming a node the cluster does not have is the controller's to report
(:func:`unknown_nodes`): no vfio-manager runs there to notice it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

from .plan import PassthroughError

ALL = "all"


@dataclass(frozen=True)
class Selection:
    """The GPUs a node hands to VMs: every GPU, or these indices (mx-smi's numbering)."""

    all: bool = False
    indices: Tuple[int, ...] = ()

    def describe(self) -> str:
        return ALL if self.all else ",".join(str(i) for i in self.indices)


def parse_gpus(text: Any, where: str = "gpus") -> Selection:
    """``"all"`` or ``"6,7"`` (an int alone is accepted: YAML reads ``gpus: 6`` as one)."""
    if isinstance(text, bool):
        raise PassthroughError("%s must be \"all\" or GPU indices like \"6,7\", got %r" % (where, text))
    if isinstance(text, int):
        text = str(text)
    if not isinstance(text, str) or not text.strip():
        raise PassthroughError("%s must be \"all\" or GPU indices like \"6,7\", got %r" % (where, text))
    if text.strip().lower() == ALL:
        return Selection(all=True)
    indices: List[int] = []
    for part in text.split(","):
        item = part.strip()
        if not item.isdigit():
            raise PassthroughError("%s: %r is not a GPU index (expected \"all\" or indices like \"6,7\")"
                                   % (where, item))
        if int(item) not in indices:
            indices.append(int(item))
    return Selection(indices=tuple(sorted(indices)))


def entries(doc: Any) -> Dict[str, Selection]:
    """Node name -> selection of a parsed ``vfio`` value ({} for an empty key)."""
    if doc is None or doc == "":
        return {}
    if not isinstance(doc, list):
        raise PassthroughError("vfio must be a list of {nodeName, gpus} items, got %s" % type(doc).__name__)
    out: Dict[str, Selection] = {}
    for position, item in enumerate(doc):
        if not isinstance(item, Mapping) or not isinstance(item.get("nodeName"), str) or not item["nodeName"]:
            raise PassthroughError("vfio item %d must be {nodeName: <node>, gpus: \"<indices>|all\"}, got %r"
                                   % (position, item))
        extra = sorted(str(k) for k in item if k not in ("nodeName", "gpus"))
        if extra:
            raise PassthroughError("vfio item %d (%s): unknown key(s) %s" % (position, item["nodeName"], ", ".join(extra)))
        node = item["nodeName"]
        if node in out:
            raise PassthroughError("vfio names node %s twice" % node)
        if "gpus" not in item:
            raise PassthroughError("vfio item %d (%s) has no gpus" % (position, node))
        out[node] = parse_gpus(item["gpus"], "vfio %s gpus" % node)
    return out


def node_selection(doc: Any, node: str) -> Optional[Selection]:
    """The GPUs ``node`` hands to VMs (None: no entry, every GPU stays with containers)."""
    return entries(doc).get(node)


def unknown_nodes(doc: Any, node_names: Iterable[str]) -> List[str]:
    """Entries naming no node of the cluster, sorted."""
    known = set(node_names)
    return sorted(name for name in entries(doc) if name not in known)
