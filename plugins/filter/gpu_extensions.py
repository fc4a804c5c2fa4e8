# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Filters of the metax.gpu.verify role: what is wrong with a GPU node or the agents.

Pure functions over the objects kubernetes.core.k8s_info and metax.gpu.kube_list return, so the role's
checks (the manual's section 2.1.3) are unit-tested without a cluster.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ansible_collections.metax.gpu.plugins.module_utils import names as N

# gpu-label's labels on a node with MetaX GPUs and a loaded driver (manual Table 2.7).
REQUIRED_LABELS = (
    N.LABEL_GPU_INSTALLED, N.LABEL_DRIVER_READY, N.LABEL_DRIVER_MAJOR, N.LABEL_DRIVER_MINOR,
    N.LABEL_DRIVER_PATCH, N.LABEL_DRIVER_MODE, N.LABEL_GPU_FAMILY, N.LABEL_GPU_MEMORY,
    N.LABEL_GPU_PRODUCT, N.LABEL_GPU_SRIOV, N.LABEL_GPU_VFNUM,
)


def _int(value: Any) -> int:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return -1


def gpu_node_problems(node: Mapping[str, Any]) -> List[str]:
    """Problems of one Node object: missing labels, capacity != devices x vfnum, allocatable != healthy."""
    meta = node.get("metadata") or {}
    labels: Mapping[str, str] = meta.get("labels") or {}
    annotations: Mapping[str, str] = meta.get("annotations") or {}
    status = node.get("status") or {}
    problems: List[str] = []
    missing = [key for key in REQUIRED_LABELS if key not in labels]
    if missing:
        problems.append("missing labels " + ", ".join(missing))
    if labels.get(N.LABEL_GPU_INSTALLED) == "false":
        problems.append("gpu-label found no MetaX GPU (%s=false)" % N.LABEL_GPU_INSTALLED)
    if labels.get(N.LABEL_DRIVER_READY) == "false":
        problems.append("the MetaX driver is not loaded (%s=false)" % N.LABEL_DRIVER_READY)
    count = _int(labels.get(N.LABEL_GPU_COUNT))
    vfnum = _int(labels.get(N.LABEL_GPU_VFNUM, "0"))
    capacity = _int((status.get("capacity") or {}).get(N.RESOURCE_NAME))
    allocatable = _int((status.get("allocatable") or {}).get(N.RESOURCE_NAME))
    if capacity < 0:
        problems.append("no %s in capacity (is gpu-device running on the node?)" % N.RESOURCE_NAME)
    elif count >= 0:
        expected = count * vfnum if vfnum > 0 else count
        if capacity != expected:
            problems.append("capacity %s=%d, expected %d (%d GPUs x vfnum %d)"
                            % (N.RESOURCE_NAME, capacity, expected, count, vfnum))
    raw = annotations.get(N.ANNOTATION_DEVICES)
    if raw is not None and capacity >= 0:
        try:
            devices = json.loads(raw)
            healthy = sum(1 for d in devices if isinstance(d, dict) and d.get("health") == "Healthy")
        except ValueError:
            problems.append("annotation %s is not JSON" % N.ANNOTATION_DEVICES)
        else:
            if allocatable != healthy:
                problems.append("allocatable %s=%d, expected %d healthy devices"
                                % (N.RESOURCE_NAME, allocatable, healthy))
    elif capacity >= 0 and allocatable > capacity:
        problems.append("allocatable %d exceeds capacity %d" % (allocatable, capacity))
    return problems


def _node_line(name: Any, node: Optional[Mapping[str, Any]]) -> str:
    """'' when the node is fine, else one line naming it and what is wrong."""
    if node is None:
        return "node %s: not in the cluster (check metax_gpu_node_name)" % name
    problems = gpu_node_problems(node)
    return "node %s: %s" % (name, "; ".join(problems)) if problems else ""


def gpu_node_report(result: Mapping[str, Any]) -> str:
    """One line for a k8s_info loop result of a node: '' when the node is fine."""
    name = result.get("item", "?")
    resources: Sequence[Dict[str, Any]] = result.get("resources") or []
    # A lookup that answered carries "resources" (empty for a missing node) even when the task
    # failed only because its until: condition never held; without it the API call itself failed.
    if result.get("failed") and "resources" not in result:
        return "node %s: cannot be read (%s)" % (name, result.get("msg", "k8s_info failed"))
    return _node_line(name, resources[0] if resources else None)


def gpu_nodes_report(nodes: Sequence[Mapping[str, Any]], names: Sequence[str]) -> List[str]:
    """One line per node of ``names`` that is missing from ``nodes`` (a list of every Node) or has
    a problem, in the order of ``names``; [] when every one is fine."""
    by_name = {(node.get("metadata") or {}).get("name"): node for node in nodes}
    return [line for line in (_node_line(name, by_name.get(name)) for name in names) if line]


def daemonset_problems(daemonsets: Sequence[Mapping[str, Any]]) -> List[str]:
    """Not-ready DaemonSets: 'name: R of D pods ready'."""
    out = []
    for ds in daemonsets:
        status = ds.get("status") or {}
        desired = _int(status.get("desiredNumberScheduled", 0))
        ready = _int(status.get("numberReady", 0))
        if ready != desired:
            out.append("%s: %d of %d pods ready" % (ds.get("metadata", {}).get("name", "?"), ready, desired))
    return out


class FilterModule:
    """metax.gpu verification filters."""

    def filters(self):
        return {
            "gpu_node_problems": gpu_node_problems,
            "gpu_node_report": gpu_node_report,
            "gpu_nodes_report": gpu_nodes_report,
            "daemonset_problems": daemonset_problems,
        }
