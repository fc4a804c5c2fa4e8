# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""A Kubernetes Node object (a dict, as kubernetes.core.k8s_info or the API client give it)
as the rollout planner sees it (:class:`.rollout.RolloutNode`). Pure."""

from __future__ import annotations

from typing import Any, Mapping, Optional

from .. import names as N
from ..maintenance.plan import cordon_record, held, node_view
from .rollout import RolloutNode


def labels_of(node: Mapping[str, Any]) -> Mapping[str, str]:
    return (node.get("metadata") or {}).get("labels") or {}


def annotations_of(node: Mapping[str, Any]) -> Mapping[str, str]:
    return (node.get("metadata") or {}).get("annotations") or {}


def node_ready(node: Mapping[str, Any]) -> bool:
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return False


def label_version(node: Mapping[str, Any]) -> Optional[str]:
    """The driver version gpu-label published (major.minor.patch), None when it has not."""
    labels = labels_of(node)
    parts = [labels.get(k) for k in (N.LABEL_DRIVER_MAJOR, N.LABEL_DRIVER_MINOR, N.LABEL_DRIVER_PATCH)]
    if not all(parts):
        return None
    return ".".join(str(p) for p in parts)


def declared_driver(node: Mapping[str, Any], payload: str) -> Optional[str]:
    """The kernel driver the payload ``payload`` installs, as the node's driver-manager of that payload
    declared it on the node (None: not yet: no pod of that payload has run a round there)."""
    annotations = annotations_of(node)
    if annotations.get(N.ANNOTATION_DRIVER_PAYLOAD_VERSION) != payload:
        return None
    return annotations.get(N.ANNOTATION_DRIVER_PAYLOAD_DRIVER) or payload


def rollout_node(node: Mapping[str, Any], target_version: Optional[str] = None,
                 payload: Optional[str] = None) -> RolloutNode:
    """The planner's view of ``node``.

    ``target_version`` is the kernel-driver version wanted; with ``payload``
    (the target payload's own version, the operator's way) it is the one
    that payload declares on this node (:func:`declared_driver`), and the node
    waits while it is not known.

    A cordon is the administrator's when it was recorded
    (``driver.upgrade.pre-cordoned``), or when the node is cordoned without an
    upgrade state of ours; a cordoned node with our state label and no record
    was cordoned by the upgrade (e.g. left ``failed`` by an earlier run),
    unless the upgrade was in place (``driver.upgrade.in-place``): then we
    never cordoned it. The maintenance protocol's ``maintenance.cordon`` record
    (``admin`` or ``ours``) says it outright, and ``held_by`` is the procedure
    holding the node (module_utils/maintenance), which the budget counts.
    """
    labels = labels_of(node)
    annotations = annotations_of(node)
    cordoned = bool((node.get("spec") or {}).get("unschedulable"))
    state = labels.get(N.LABEL_DRIVER_UPGRADE_STATE) or None
    recorded = N.ANNOTATION_PRE_CORDONED in annotations
    # whose the cordon is: the maintenance protocol's rule (its record; before it, the rule below)
    cordon = cordon_record(node_view(node), N.MAINTENANCE_OWNER_DRIVER_UPGRADE)
    in_place = annotations.get(N.ANNOTATION_DRIVER_UPGRADE_IN_PLACE) == "true"
    if payload is not None:
        target_version = declared_driver(node, payload)
    return RolloutNode(
        name=str((node.get("metadata") or {}).get("name")),
        ready=node_ready(node),
        cordoned=cordoned,
        admin_cordoned=recorded or (cordoned and cordon != N.MAINTENANCE_CORDON_OURS),
        state=state,
        skip=labels.get(N.LABEL_DRIVER_UPGRADE_SKIP) == "true",
        current_version=label_version(node),
        target_version=target_version,
        reason=annotations.get(N.ANNOTATION_DRIVER_UPGRADE_MESSAGE, ""),
        declared=payload is None or target_version is not None,
        in_place=in_place and state is not None,
        held_by=held(node),
    )
