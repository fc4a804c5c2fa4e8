# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The component contract of the GPU Operator: one small record per component.

The controller's core knows components only through :class:`Component`; the
driver, MACA and container-runtime components of later issues are new records
in ``components.py`` (and, for their objects, a chart they render from), not
changes to the controller. A component says

- what it renders: the objects of a chart labelled
  ``app.kubernetes.io/name: <name>`` (the chart is the one definition of how an
  agent deploys, so the operator renders the same chart the GPU Extensions
  scheme installs, see docs/design-decisions.md);
- which readiness label it owns (``ready_label``): the controller sets it to
  ``"true"`` on a node once the component's pod there is Ready, and removes it
  otherwise;
- what must be ready before it (``requires``): readiness labels that become
  part of its pods' node selector, only for components that are deployed;
- what its cleanup removes from a node (``cleanup_labels`` /
  ``cleanup_annotations``, keys or prefixes ending in ``/`` or ``.``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Mapping, Optional, Tuple

from .. import names
from ..kube.node import strip_change


@dataclass(frozen=True)
class Component:
    """One deployable part of the GPU Operator scheme."""

    name: str                       # object name and app.kubernetes.io/name label
    spec_key: str                   # field of ClusterOperator.spec (the real product's name)
    values_key: str                 # key of the chart values (the manual's name)
    chart: str                      # chart under files/charts that renders its objects
    image: str                      # default image name in the registry
    kind: str = "DaemonSet"         # the workload kind whose readiness is the component's
    ready_label: Optional[str] = None
    requires: Tuple[str, ...] = ()  # readiness labels (of other components) needed first
    gpu_nodes_only: bool = False    # runs only where gpu-label found MetaX GPUs
    minimal: bool = False           # part of minimal mode
    default_deploy: bool = True
    cleanup_labels: Tuple[str, ...] = ()
    cleanup_annotations: Tuple[str, ...] = ()
    # chart values the component is switched on with, besides rendering its
    # objects (gpu-aware is optional in the Extensions chart)
    enable_values: Mapping[str, object] = field(default_factory=dict)
    # node annotations where its agent reports why it cannot do its work on that
    # node (driver-manager: driver in use, invalid driver-config entry): the
    # component's Degraded condition names each node with its message
    message_annotations: Tuple[str, ...] = ()

    def owned_labels(self) -> Tuple[str, ...]:
        """Every node label key or prefix the component's cleanup removes."""
        own = (self.ready_label,) if self.ready_label else ()
        return own + tuple(key for key in self.cleanup_labels if key != self.ready_label)


def deployed(component: Component, spec: Mapping[str, object]) -> bool:
    """Whether the ClusterOperator spec deploys the component (minimal mode wins over ``deploy``)."""
    if spec.get("minimal") and not component.minimal:
        return False
    section = spec.get(component.spec_key)
    if isinstance(section, Mapping) and "deploy" in section:
        return bool(section["deploy"])
    return component.default_deploy


def gate_selector(component: Component, registry: Iterable[Component],
                  spec: Mapping[str, object]) -> Dict[str, str]:
    """Node selector labels gating ``component``: GPU nodes, then the readiness of what it needs.

    A required label is kept only when a *deployed* component owns it: in
    minimal mode, or with that component off, nothing would ever set it, so the
    chain skips it (the manual's minimal mode: driver and MACA installed by hand).
    """
    selector: Dict[str, str] = {}
    if component.gpu_nodes_only:
        selector[names.LABEL_GPU_INSTALLED] = "true"
    owners = {c.ready_label: c for c in registry if c.ready_label}
    for label in component.requires:
        owner = owners.get(label)
        if owner is not None and deployed(owner, spec):
            selector[label] = "true"
    return selector


def cleanup_patch(labels: Mapping[str, str], annotations: Mapping[str, str],
                  registry: Iterable[Component]) -> Dict[str, Dict[str, None]]:
    """The merge-patch ``metadata`` removing what the components' cleanup owns on one node ({} = nothing):
    kube/node.py's one strip routine over the components' patterns."""
    components = list(registry)
    label_patterns = [p for c in components for p in c.owned_labels()]
    annotation_patterns = [p for c in components for p in c.cleanup_annotations]
    change = strip_change({"metadata": {"labels": labels, "annotations": annotations}}, label_patterns,
                          annotation_patterns)
    return change.metadata_patch() if change is not None else {}


@dataclass(frozen=True)
class AdministratorOwned:
    """An object the controller creates once and then leaves to the administrator.

    The manual tells the administrator to edit it with kubectl (driver-config:
    3.2.3, the vfnums; gpu-aware-plugin: 2.1.5 step 4, the weights): created
    when absent (or deleted), never applied again nor put back by drift repair.
    What the ClusterOperator asks of it later is not applied: ``reason`` is the
    Event and condition saying so, ``seeded_by`` the fields of the spec that
    only seed it (docs/operator.md "Objects the administrator owns").
    """

    kind: str
    name: str
    seeded_by: str
    reason: str


# The one definition of what the administrator owns; every other object of a
# component is put back when edited or deleted.
ADMINISTRATOR_OWNED: Tuple[AdministratorOwned, ...] = (
    AdministratorOwned("ConfigMap", names.DRIVER_CONFIGMAP,
                       "spec.driver.vfnumsConfig (and moduleParams, nodeModuleParams)", "VfnumsConfigNotApplied"),
    AdministratorOwned("ConfigMap", names.GPU_AWARE_CONFIGMAP,
                       "spec.gpuAware.scoreWeight and lossWeight", "GpuAwareWeightsNotApplied"),
)


def administrator_owned(obj: Mapping[str, object]) -> Optional[AdministratorOwned]:
    """The entry of ADMINISTRATOR_OWNED naming ``obj`` (kind and name), if any."""
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    return next((a for a in ADMINISTRATOR_OWNED if a.kind == obj.get("kind") and a.name == name), None)


def being_deleted(obj: Mapping[str, Any]) -> bool:
    """Whether ``obj`` is going: the API server has set its deletionTimestamp (its finalizers still run)."""
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


def owner_id(owner: Mapping[str, object]) -> str:
    """The value of the owner label on what ``owner`` (a ClusterOperator) owns: its uid, or the uid
    of the namespaced CR it was carried over from (the migration keeps it, so that no pod template changes)."""
    meta = owner["metadata"]
    if not isinstance(meta, Mapping):
        raise TypeError("a ClusterOperator's metadata is an object, not %r" % (meta,))
    annotations = meta.get("annotations")
    carried = annotations.get(names.ANNOTATION_OPERATOR_OWNER_ID) if isinstance(annotations, Mapping) else None
    return str(carried or meta["uid"])
