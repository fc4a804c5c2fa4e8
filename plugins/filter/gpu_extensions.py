# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Filters of the metax.gpu.verify role: what is wrong with a GPU node or the agents.

Pure functions over the objects kubernetes.core.k8s_info and metax.gpu.kube_list return, so the role's
checks (the manual's section 2.1.3) are unit-tested without a cluster.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

from ansible_collections.metax.gpu.plugins.module_utils.node_checks import REQUIRED_LABELS, as_int, gpu_node_problems

__all__ = ["REQUIRED_LABELS", "gpu_node_problems", "gpu_node_report", "gpu_nodes_report", "daemonset_problems",
           "FilterModule"]


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
        desired = as_int(status.get("desiredNumberScheduled", 0))
        ready = as_int(status.get("numberReady", 0))
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
