# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""What the controller's status round adds to clusteroperator/status.py: the notes to the
administrator (an administrator-owned object whose seed in the CR changed) and the merge patch
that writes a status. Pure: no I/O."""

from __future__ import annotations

import hashlib
import json
from typing import AbstractSet, Any, Dict, List, Mapping, Optional

from .contract import ADMINISTRATOR_OWNED, administrator_owned
from .status import condition

# The conditions that are notes to the administrator: a Warning Event when one appears.
NOTE_REASONS = frozenset(a.reason for a in ADMINISTRATOR_OWNED)


def newly_true(old: Mapping[str, Any], new: Mapping[str, Any], types: AbstractSet[str]) -> List[Dict[str, Any]]:
    """The conditions of ``types`` that are True in ``new`` and were not (with that message) in ``old``."""
    before = {(c.get("type"), c.get("status"), c.get("message")) for c in old.get("conditions") or []}
    return [c for c in new.get("conditions") or []
            if c["type"] in types and c["status"] == "True" and (c["type"], "True", c.get("message")) not in before]


def status_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> Dict[str, Any]:
    """The merge patch that makes the status ``new``: what ``status.driverUpgrade`` no longer says
    (a step pause over, the driver component switched off) is removed explicitly, since a merge
    patch keeps every key it does not name (and the status would then never equal ``new``)."""
    out = dict(new)
    before, after = old.get("driverUpgrade"), new.get("driverUpgrade")
    if before and after is None:
        out["driverUpgrade"] = None
    elif isinstance(before, Mapping) and isinstance(after, Mapping):
        out["driverUpgrade"] = dict(after, **{k: None for k in before if k not in after})
    return out


def seed_digest(obj: Mapping[str, Any]) -> str:
    """What an administrator-owned object is created from (its data), as a short stable digest."""
    text = json.dumps({k: obj.get(k) for k in ("data", "binaryData", "spec")}, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def not_applied_condition(obj: Mapping[str, Any], recorded: str, wanted: str,
                          namespace: str) -> Optional[Dict[str, str]]:
    """The condition saying the CR's change of what seeds ``obj`` is not applied (None: no change)."""
    owned = administrator_owned(obj)
    if owned is None or recorded == wanted:
        return None
    name = obj["metadata"]["name"]
    return condition(owned.reason, True, owned.reason,
                     "%s changed after %s was created; %s is the administrator's and is not changed by the "
                     "controller: edit it with `kubectl -n %s edit %s %s`"
                     % (owned.seeded_by, name, name, namespace, owned.kind.lower(), name))
