# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Filters of the rolling driver upgrade (playbooks/driver_upgrade.yml): plan, label patch, validation.

Pure functions over Node objects (dicts from kubernetes.core.k8s_info), so the
whole rolling plan is computed, printed and unit-tested without a cluster.
"""

from __future__ import annotations

import math
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from ansible.errors import AnsibleFilterError

from ansible_collections.metax.gpu.plugins.filter.gpu_extensions import gpu_node_problems
from ansible_collections.metax.gpu.plugins.module_utils import names as N

DOCUMENTATION = ""  # filters are documented in docs/day-two.md


def _labels(node: Mapping[str, Any]) -> Mapping[str, str]:
    return (node.get("metadata") or {}).get("labels") or {}


def node_ready(node: Mapping[str, Any]) -> bool:
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return False


def budget(max_unavailable: Union[int, str], total: int) -> int:
    """``max_unavailable`` as a node count: an int, or a percentage of ``total`` rounded down (at least 1)."""
    text = str(max_unavailable).strip()
    if text.endswith("%"):
        try:
            pct = float(text[:-1])
        except ValueError:
            raise AnsibleFilterError("max_unavailable %r: expected a count or a percentage" % max_unavailable)
        return max(1, int(math.floor(total * pct / 100.0)))
    try:
        count = int(text)
    except ValueError:
        raise AnsibleFilterError("max_unavailable %r: expected a count or a percentage" % max_unavailable)
    if count < 1:
        raise AnsibleFilterError("max_unavailable must be at least 1 (got %s)" % count)
    return count


def driver_upgrade_plan(nodes: Sequence[Mapping[str, Any]], names: Sequence[str], serial: int = 1,
                        max_unavailable: Union[int, str] = "25%") -> Dict[str, Any]:
    """Batches for the nodes ``names`` (inventory order).

    - a node labelled ``driver.upgrade.skip=true`` is skipped;
    - a NotReady node is skipped (its agents cannot validate it) and counts as unavailable;
    - a cordoned node counts as unavailable and is upgraded without spending budget; it stays cordoned
      (``pre_cordoned``) unless an earlier run of ours cordoned it (state label set, no pre-cordon record:
      ``resumed``, e.g. a node left ``failed`` and re-run after a fix);
    - a batch holds at most ``serial`` nodes, and the nodes it makes unavailable plus those already
      unavailable never exceed ``max_unavailable`` (a count or a % of the nodes in ``names``).
    """
    if int(serial) < 1:
        raise AnsibleFilterError("serial must be at least 1 (got %s)" % serial)
    by_name = {(n.get("metadata") or {}).get("name"): n for n in nodes}
    missing = [name for name in names if name not in by_name]
    if missing:
        raise AnsibleFilterError("not Kubernetes nodes: %s (check metax_gpu_node_name)" % ", ".join(missing))
    limit = budget(max_unavailable, len(names))
    skipped: List[str] = []
    not_ready: List[str] = []
    pre_cordoned: List[str] = []
    resumed: List[str] = []
    todo: List[str] = []
    for name in names:
        node = by_name[name]
        if _labels(node).get(N.LABEL_DRIVER_UPGRADE_SKIP) == "true":
            skipped.append(name)
        elif not node_ready(node):
            not_ready.append(name)
        else:
            cordoned = bool((node.get("spec") or {}).get("unschedulable"))
            recorded = N.ANNOTATION_PRE_CORDONED in ((node.get("metadata") or {}).get("annotations") or {})
            # cordoned by an earlier run of ours (state label, no record of an admin's cordon): ours to undo
            ours = cordoned and not recorded and N.LABEL_DRIVER_UPGRADE_STATE in _labels(node)
            if recorded or (cordoned and not ours):
                pre_cordoned.append(name)
            elif ours:
                resumed.append(name)
            todo.append(name)
    unavailable = [n for n in names if n in not_ready or n in pre_cordoned or n in resumed or (
        n in skipped and ((by_name[n].get("spec") or {}).get("unschedulable") or not node_ready(by_name[n])))]
    room = limit - len(unavailable)
    fresh = [n for n in todo if n not in pre_cordoned and n not in resumed]
    if fresh and room < 1:
        raise AnsibleFilterError(
            "max_unavailable %s (= %d of %d nodes) is used up: already unavailable %s; nothing can be "
            "cordoned" % (max_unavailable, limit, len(names), ", ".join(unavailable)))
    batches: List[List[str]] = []
    current: List[str] = []
    spent = 0
    for name in todo:
        cost = 0 if name in pre_cordoned or name in resumed else 1
        if current and (len(current) >= int(serial) or spent + cost > room):
            batches.append(current)
            current, spent = [], 0
        current.append(name)
        spent += cost
    if current:
        batches.append(current)
    return {"batches": batches, "skipped": skipped, "not_ready": not_ready, "pre_cordoned": pre_cordoned, "resumed": resumed,
            "max_unavailable": limit, "already_unavailable": unavailable, "batch_budget": max(room, 0)}


def metax_label_removal(labels: Optional[Mapping[str, str]]) -> Dict[str, None]:
    """Merge patch removing gpu-label's metax-tech.com/ labels; the day-two labels stay."""
    return {k: None for k in (labels or {}) if k.startswith(N.LABEL_PREFIX) and k not in N.DAY_TWO_LABELS}


def driver_version_parts(version: str) -> List[str]:
    return re.findall(r"\d+", str(version))[:3]


def driver_upgrade_validation(node: Mapping[str, Any], version: Optional[str] = None) -> List[str]:
    """Problems of a node after its driver work: gpu-label's labels, capacity, allocatable, version."""
    problems = list(gpu_node_problems(node))
    labels = _labels(node)
    if version:
        want = driver_version_parts(version)
        have = [labels.get(k) for k in (N.LABEL_DRIVER_MAJOR, N.LABEL_DRIVER_MINOR, N.LABEL_DRIVER_PATCH)]
        if have[:len(want)] != want:
            problems.append("driver labels say %s, expected %s" % (".".join(str(h) for h in have), ".".join(want)))
    if labels.get(N.LABEL_DRIVER_READY) != "true":
        problems.append("%s is %s" % (N.LABEL_DRIVER_READY, labels.get(N.LABEL_DRIVER_READY, "missing")))
    return sorted(set(problems))


def driver_upgrade_failures(nodes: Sequence[Mapping[str, Any]], node_plan: Mapping[str, Mapping[str, Any]]) -> List[str]:
    """Names of the nodes (of ``node_plan``) that do not validate against their planned version."""
    out: List[str] = []
    for node in nodes:
        name = str((node.get("metadata") or {}).get("name"))
        if name in node_plan and driver_upgrade_validation(node, node_plan[name].get("to")):
            out.append(name)
    return sorted(out)


class FilterModule:
    """metax.gpu driver upgrade filters."""

    def filters(self):
        return {
            "driver_upgrade_plan": driver_upgrade_plan,
            "driver_upgrade_validation": driver_upgrade_validation,
            "driver_upgrade_failures": driver_upgrade_failures,
            "metax_label_removal": metax_label_removal,
            "driver_version_parts": driver_version_parts,
        }
