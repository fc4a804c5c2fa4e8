# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Filters of the metax.gpu.set_vfnum role: GPU pods of a node, the batch budget, is the node done.

Pure functions over the objects kubernetes.core.k8s_info returns, unit-tested
without a cluster (tests/unit/vfnum/test_vfnum_filters.py).
"""

from __future__ import annotations

from typing import Any, Iterable, List, Mapping, Sequence, Union

from ansible.errors import AnsibleFilterError

from ansible_collections.metax.gpu.plugins.module_utils import names as N
from ansible_collections.metax.gpu.plugins.module_utils.driver.rollout import PolicyError, count_of
from ansible_collections.metax.gpu.plugins.module_utils.driver.rollout_node import node_ready
from ansible_collections.metax.gpu.plugins.module_utils.kube.pods import gpu_pods
from ansible_collections.metax.gpu.plugins.module_utils.maintenance.plan import held
from ansible_collections.metax.gpu.plugins.module_utils.node_checks import gpu_node_problems


def vfnum_gpu_pods(pods: Iterable[Mapping[str, Any]]) -> List[str]:
    """``namespace/name`` of the pods (of one node) that request metax-tech.com/gpu and have not ended."""
    return gpu_pods(pods)


def _unavailable(node: Mapping[str, Any]) -> bool:
    if (node.get("spec") or {}).get("unschedulable"):
        return True
    if held(node) is not None:        # another procedure's maintenance (or an earlier run's own)
        return True
    return not node_ready(node)


def vfnum_budget(nodes: Sequence[Mapping[str, Any]], candidates: Sequence[str], batch: Sequence[str],
                 max_unavailable: Union[int, str]) -> List[str]:
    """Why this batch may not start (empty: it may).

    ``candidates`` are the GPU nodes of the play; those already unavailable
    (cordoned, NotReady, or held for maintenance: paused agents) count against
    ``max_unavailable`` (a number or ``N%`` of the candidates) with the batch.
    """
    text = str(max_unavailable).strip()
    try:
        # the rule is driver/rollout's (driver_upgrade's budget filter is the same call)
        limit = count_of(max_unavailable, len(candidates), "max_unavailable")
    except PolicyError as exc:
        raise AnsibleFilterError(str(exc))
    by_name = {(n.get("metadata") or {}).get("name"): n for n in nodes}
    missing = sorted(name for name in batch if name not in by_name)
    if missing:
        return ["node(s) %s not found in the cluster" % ", ".join(missing)]
    down = sorted(name for name in candidates if name in by_name and name not in batch
                  and _unavailable(by_name[name]))
    if len(down) + len(batch) > limit:
        return ["max_unavailable %s allows %d node(s) down; %d already are (%s) and the batch adds %d (%s)"
                % (text, limit, len(down), ", ".join(down) or "none", len(batch), ", ".join(batch))]
    return []


def vfnum_node_problems(node: Mapping[str, Any], vfnum: int) -> List[str]:
    """What still differs from a node whose GPUs all have ``vfnum`` VFs: labels, capacity, allocatable."""
    problems = gpu_node_problems(node)
    labels = (node.get("metadata") or {}).get("labels") or {}
    if labels.get(N.LABEL_GPU_VFNUM) != str(vfnum):
        problems.append("label %s=%s, expected %d" % (N.LABEL_GPU_VFNUM, labels.get(N.LABEL_GPU_VFNUM), vfnum))
    if N.LABEL_AGENTS_PAUSED in labels:
        problems.append("the node agents are still paused (%s)" % N.LABEL_AGENTS_PAUSED)
    return problems


def vfnum_state(node: Mapping[str, Any]) -> str:
    """The node's set_vfnum state label (names.LABEL_VFNUM_STATE); ``success`` when it has none."""
    return ((node.get("metadata") or {}).get("labels") or {}).get(N.LABEL_VFNUM_STATE) or "success"


class FilterModule:
    def filters(self):
        return {
            "vfnum_gpu_pods": vfnum_gpu_pods,
            "vfnum_budget": vfnum_budget,
            "vfnum_node_problems": vfnum_node_problems,
            "vfnum_state": vfnum_state,
        }
