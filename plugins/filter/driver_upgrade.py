# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Filters of the rolling driver upgrade (playbooks/driver_upgrade.yml): plan, label patch, validation.

Pure functions over Node objects (dicts from kubernetes.core.k8s_info), so the
whole rolling plan is computed, printed and unit-tested without a cluster. The
plan is the rollout planner's (module_utils/driver/rollout.py), the one the
operator's controller uses too; this file only maps the playbook's variables.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from ansible.errors import AnsibleFilterError

from ansible_collections.metax.gpu.plugins.module_utils import names as N
from ansible_collections.metax.gpu.plugins.module_utils.driver.package import (
    DriverPackageError, driver_matches, parse_declaration)
from ansible_collections.metax.gpu.plugins.module_utils.driver.rollout import (
    WAIT_HELD, WAIT_NOT_READY, WAIT_SKIP, Policy, PolicyError, count_of, plan_batches)
from ansible_collections.metax.gpu.plugins.module_utils.driver.rollout_node import label_version, node_ready, rollout_node
from ansible_collections.metax.gpu.plugins.module_utils.kube.evict import select as eviction_select
from ansible_collections.metax.gpu.plugins.module_utils.maintenance.plan import agent_label_removal
from ansible_collections.metax.gpu.plugins.module_utils.node_checks import gpu_node_problems

__all__ = ["budget", "node_ready", "driver_upgrade_plan", "driver_upgrade_validation", "driver_upgrade_failures",
           "driver_upgrade_host_map", "driver_upgrade_evictions", "driver_upgrade_node_plan",
           "metax_label_removal", "driver_version_parts", "driver_payload_declaration", "FilterModule"]

DOCUMENTATION = ""  # filters are documented in docs/day-two.md


def _labels(node: Mapping[str, Any]) -> Mapping[str, str]:
    return (node.get("metadata") or {}).get("labels") or {}


def budget(max_unavailable: Union[int, str], total: int) -> int:
    """``max_unavailable`` as a node count: an int, or a percentage of ``total`` rounded down (at least 1)."""
    try:
        return count_of(max_unavailable, total, "max_unavailable")
    except PolicyError as exc:
        raise AnsibleFilterError(str(exc))


def upgrade_policy(serial: int, max_unavailable: Union[int, str]) -> Policy:
    """The playbook's variables as the planner's policy (docs/day-two.md, "One planner").

    ``driver_upgrade_serial`` is ``maxParallel`` (each batch finishes before the
    next, so in flight = the batch), ``driver_upgrade_max_unavailable`` is
    ``maxUnavailable``; no ``upgradeSteps``; the play stops at the first failed
    batch (``maxFailureThreshold: 1``, ``fallback: pause``); a re-run of the
    playbook restarts the nodes an earlier run left with a state label.
    """
    try:
        if int(serial) < 1:
            raise AnsibleFilterError("serial must be at least 1 (got %s)" % serial)
    except (TypeError, ValueError):
        raise AnsibleFilterError("serial %r: expected a count" % (serial,))
    return Policy(max_parallel=int(serial), max_unavailable=max_unavailable, max_failures=1,
                  restart_unfinished=True)


def driver_upgrade_plan(nodes: Sequence[Mapping[str, Any]], names: Sequence[str], serial: int = 1,
                        max_unavailable: Union[int, str] = "25%") -> Dict[str, Any]:
    """Batches for the nodes ``names`` (inventory order): the rollout planner
    (module_utils/driver/rollout.py) played forward, each batch assumed to succeed.

    - a node labelled ``driver.upgrade.skip=true`` is skipped;
    - a NotReady node is skipped (its agents cannot validate it) and counts as unavailable;
    - a node another procedure holds for maintenance (set_vfnum, driver-manager, the health ladder:
      module_utils/maintenance) counts as unavailable and is listed in ``held`` (the role refuses to start);
    - a cordoned node counts as unavailable and is upgraded without spending budget; it stays cordoned
      (``pre_cordoned``) unless an earlier run of ours cordoned it (state label set, no pre-cordon record:
      ``resumed``, e.g. a node left ``failed`` and re-run after a fix);
    - a batch holds at most ``serial`` nodes, and the nodes it makes unavailable plus those already
      unavailable never exceed ``max_unavailable`` (a count or a % of the nodes in ``names``).
    """
    policy = upgrade_policy(serial, max_unavailable)
    by_name = {(n.get("metadata") or {}).get("name"): n for n in nodes}
    missing = [name for name in names if name not in by_name]
    if missing:
        raise AnsibleFilterError("not Kubernetes nodes: %s (check metax_gpu_node_name)" % ", ".join(missing))
    views = [rollout_node(by_name[name]) for name in names]
    try:
        plan = plan_batches(views, policy)
    except PolicyError as exc:
        raise AnsibleFilterError(str(exc).replace("maxUnavailable", "max_unavailable"))
    first = plan.first
    held = ["%s (%s)" % (v.name, v.held_by) for v in views if v.name in first.reasons(WAIT_HELD)]
    # a node another procedure holds is the first thing to say (the role refuses to start on it), even
    # when its hold is what uses the budget up
    if plan.blocked and not held:
        raise AnsibleFilterError(
            "max_unavailable %s (= %d of %d nodes) is used up: already unavailable %s; nothing can be "
            "cordoned" % (max_unavailable, first.max_unavailable, len(names), ", ".join(first.unavailable)))
    todo = [v for v in views if not v.skip and v.ready]
    return {"batches": [list(batch) for batch in plan.batches],
            "skipped": list(first.reasons(WAIT_SKIP)), "not_ready": list(first.reasons(WAIT_NOT_READY)),
            "held": held,
            "pre_cordoned": [v.name for v in todo if v.admin_cordoned],
            "resumed": [v.name for v in todo if v.cordoned and not v.admin_cordoned],
            "max_unavailable": first.max_unavailable, "already_unavailable": list(first.unavailable),
            "batch_budget": first.budget}


# The three filters below each replace a set_fact loop that combined one node per item: at 2,000 nodes such
# a loop copies a growing dict 2,000 times, one Ansible task item each (the host map alone took 191 s on
# the 2-core VM). One pass in Python takes milliseconds (docs/scale.md, "The rolling-upgrade planner").

def driver_upgrade_host_map(hosts: Sequence[str], hostvars: Mapping[str, Any]) -> Dict[str, Dict[str, str]]:
    """Kubernetes node name -> ``{"host": inventory host, "root": metax_gpu_host_root}`` for ``hosts``."""
    out: Dict[str, Dict[str, str]] = {}
    for host in hosts:
        hv = hostvars[host]
        out[str(hv.get("metax_gpu_node_name") or host)] = {
            "host": host, "root": str(hv.get("metax_gpu_host_root") or "/")}
    return out


def driver_upgrade_evictions(pods: Sequence[Mapping[str, Any]], names: Sequence[str],
                             drain: bool = False) -> Dict[str, List[str]]:
    """Node name -> the pods (namespace/name) metax.gpu.evict_gpu_pods would evict there, for ``names``.

    From one list of every pod (metax.gpu.kube_list) instead of one list per node: the same selection
    (module_utils/kube/evict.py ``select``) applied to each node's share.
    """
    by_node: Dict[str, List[Mapping[str, Any]]] = {name: [] for name in names}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if node in by_node:
            by_node[node].append(pod)
    return {name: eviction_select(node_pods, drain) for name, node_pods in by_node.items()}


def _item_name(result: Mapping[str, Any]) -> Any:
    """The node a loop result is for: its ``item``, or its item's ``item`` (a loop over another loop's results)."""
    item = result.get("item")
    return item.get("item") if isinstance(item, Mapping) else item


def _rollback_package(check: Optional[Mapping[str, Any]]) -> str:
    plan = (check or {}).get("plan")
    if not plan or (check or {}).get("failed") or not plan.get("package"):
        return ""
    return str(plan["package"].get("path") or "")


def driver_upgrade_node_plan(names: Sequence[str], changes: Sequence[Mapping[str, Any]],
                             rollback_checks: Sequence[Mapping[str, Any]], evictions: Mapping[str, List[str]],
                             pre_cordoned: Sequence[str]) -> Dict[str, Dict[str, Any]]:
    """What each node of ``names`` goes through: driver from/to and steps (from metax.gpu.driver in check
    mode, ``changes``), the pods to evict, the package to roll back to (``rollback_checks``), pre-cordoned.

    ``from``/``to`` are payload versions (what is installed, what a rollback reinstalls);
    ``to_driver`` is the kernel driver ``to`` declares, which the validation compares with the
    node's labels (MetaX's payload 2.29.0.13 installs 2.12.13; ours: the same number).

    ``changes`` and ``rollback_checks`` are the registered loop results (``item`` = node name, or the
    change result whose ``item`` is the node name); a node
    without a change result (not asked: ``driver_upgrade_check_nodes: false`` in check mode) has
    ``from``/``to`` None and no steps.
    """
    change_of = {_item_name(r): r for r in changes}
    rollback_of = {_item_name(r): r for r in rollback_checks}
    cordoned = set(pre_cordoned)
    out: Dict[str, Dict[str, Any]] = {}
    for name in names:
        plan = (change_of.get(name) or {}).get("plan") or {}
        out[name] = {"from": plan.get("from_version"), "to": plan.get("to_version"),
                     "to_driver": plan.get("to_driver_version") or plan.get("to_version"),
                     "steps": plan.get("steps", []),
                     "evict": list(evictions.get(name, [])), "rollback_package": _rollback_package(rollback_of.get(name)),
                     "pre_cordoned": name in cordoned}
    return out


def metax_label_removal(labels: Optional[Mapping[str, str]]) -> Dict[str, None]:
    """Merge patch removing gpu-label's metax-tech.com/ labels; the day-two labels stay (the maintenance
    protocol's rule: metax.gpu.node_maintenance's remove_agent_labels)."""
    return agent_label_removal(labels)


def driver_version_parts(version: str) -> List[str]:
    return re.findall(r"\d+", str(version))[:3]


def driver_upgrade_validation(node: Mapping[str, Any], version: Optional[str] = None) -> List[str]:
    """Problems of a node after its driver work: gpu-label's labels, capacity, allocatable, version.

    ``version`` is the kernel driver expected (the node plan's ``to_driver``: what the payload
    declares), compared with the labels by ``package.driver_matches``, the one comparison.
    """
    problems = list(gpu_node_problems(node))
    labels = _labels(node)
    if version and not driver_matches(label_version(node), version):
        have = [labels.get(k) for k in (N.LABEL_DRIVER_MAJOR, N.LABEL_DRIVER_MINOR, N.LABEL_DRIVER_PATCH)]
        problems.append("driver labels say %s, expected %s" % (".".join(str(h) for h in have),
                                                               ".".join(driver_version_parts(version))))
    if labels.get(N.LABEL_DRIVER_READY) != "true":
        problems.append("%s is %s" % (N.LABEL_DRIVER_READY, labels.get(N.LABEL_DRIVER_READY, "missing")))
    return sorted(set(problems))


def driver_payload_declaration(text: str) -> Dict[str, Optional[str]]:
    """A payload's declaration (``version=``, ``driver=`` lines) as ``{"version", "driver"}``: the driver
    module's own parser, so the role names the copied file by the version the nodes will read."""
    try:
        found = parse_declaration(str(text), "driver_upgrade_declaration")
    except DriverPackageError as exc:
        raise AnsibleFilterError(str(exc))
    return {"version": found.version, "driver": found.driver_version}


def driver_upgrade_failures(nodes: Sequence[Mapping[str, Any]], node_plan: Mapping[str, Mapping[str, Any]]) -> List[str]:
    """Names of the nodes (of ``node_plan``) that do not validate against their planned kernel driver."""
    out: List[str] = []
    for node in nodes:
        name = str((node.get("metadata") or {}).get("name"))
        plan = node_plan.get(name)
        if plan is not None and driver_upgrade_validation(node, plan.get("to_driver") or plan.get("to")):
            out.append(name)
    return sorted(out)


class FilterModule:
    """metax.gpu driver upgrade filters."""

    def filters(self):
        return {
            "driver_upgrade_plan": driver_upgrade_plan,
            "driver_upgrade_validation": driver_upgrade_validation,
            "driver_upgrade_failures": driver_upgrade_failures,
            "driver_upgrade_host_map": driver_upgrade_host_map,
            "driver_upgrade_evictions": driver_upgrade_evictions,
            "driver_upgrade_node_plan": driver_upgrade_node_plan,
            "metax_label_removal": metax_label_removal,
            "driver_version_parts": driver_version_parts,
            "driver_payload_declaration": driver_payload_declaration,
        }
