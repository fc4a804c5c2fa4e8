# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""From a ClusterOperator to the objects to apply: the chart renders, this module adapts.

:func:`helm_template` is the I/O edge (``helm template`` of a chart the
controller image carries). :func:`desired_objects` is pure: it picks each
deployed component's objects out of the rendered chart and adds what the
operator owns: the readiness gate in the node selector, the CR's image, pull
policy and resources, the ``podTemplateSpec`` overrides, the owner label and,
for namespaced objects, the ownerReference to the CR.
"""

from __future__ import annotations

import copy
import json
import subprocess
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

from .. import names
from ..errors import MetaxGpuError
from .components import GPU_DEVICE, REGISTRY
from .contract import Component, administrator_owned, deployed, gate_selector, owner_id
from .mapping import image_reference, spec_to_extension_values
from .podtemplate import apply_overrides

CLUSTER_SCOPED = frozenset(("ClusterRole", "ClusterRoleBinding", "RuntimeClass", "DeviceClass"))
WORKLOADS = frozenset(("DaemonSet", "Deployment"))
# Helm's own labels: the operator, not Helm, manages these objects.
HELM_LABELS = ("app.kubernetes.io/managed-by", "helm.sh/chart")
RELEASE = names.OPERATOR_CR_NAME


class RenderError(MetaxGpuError):
    """The chart could not be rendered from the ClusterOperator."""


def helm_template(helm: str, chart_dir: str, values: Mapping[str, Any], namespace: str,
                  release: str = RELEASE, timeout: float = 60.0,
                  api_versions: Sequence[str] = ()) -> List[Dict[str, Any]]:
    """The objects ``helm template`` renders (JSON values on stdin; YAML is JSON's superset).

    ``api_versions``: what the chart's ``.Capabilities.APIVersions.Has`` may
    find beyond helm's built-in list (``apis.helm_api_versions``: the optional
    kinds discovery found); ``helm template`` does not ask the cluster.
    """
    try:
        import yaml
    except ImportError as exc:  # the controller image has PyYAML (requirements/agents.txt)
        raise RenderError("PyYAML is required to read helm's output: %s" % exc)
    command = [helm, "template", release, chart_dir, "--namespace", namespace, "--values", "-"]
    for api_version in api_versions:
        command += ["--api-versions", api_version]
    proc = subprocess.run(command, input=json.dumps(dict(values)), capture_output=True, text=True,
                          timeout=timeout, check=False)
    if proc.returncode != 0:
        raise RenderError("helm template %s failed: %s" % (chart_dir, proc.stderr.strip()))
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def chart_values(spec: Mapping[str, Any], registry: Sequence[Component] = REGISTRY) -> Dict[str, Any]:
    """The Extensions chart's values for ``spec`` (gpu-device's selector = its readiness gate)."""
    return spec_to_extension_values(spec, gate_selector(GPU_DEVICE, registry, spec))


def component_of(obj: Mapping[str, Any], registry: Iterable[Component]) -> Optional[Component]:
    label = (obj.get("metadata", {}).get("labels") or {}).get("app.kubernetes.io/name")
    return next((c for c in registry if c.name == label), None)


def owner_reference(owner: Mapping[str, Any]) -> Dict[str, Any]:
    meta = owner["metadata"]
    return {"apiVersion": "%s/%s" % (names.OPERATOR_GROUP, names.OPERATOR_VERSION),
            "kind": names.OPERATOR_KIND, "name": meta["name"], "uid": meta["uid"],
            "controller": True, "blockOwnerDeletion": True}


def _relabel(meta: Dict[str, Any], owner_uid: str) -> None:
    labels = {k: v for k, v in (meta.get("labels") or {}).items() if k not in HELM_LABELS}
    labels["app.kubernetes.io/managed-by"] = names.OPERATOR_FIELD_MANAGER
    labels[names.LABEL_OPERATOR_OWNER] = owner_uid
    meta["labels"] = labels


def adapt(obj: Mapping[str, Any], component: Component, spec: Mapping[str, Any],
          owner: Mapping[str, Any], registry: Sequence[Component], namespace: Optional[str] = None) -> Dict[str, Any]:
    """One rendered object as the operator applies it (``namespace``: the components'; the
    ClusterOperator is cluster-scoped, so not its own: by default the one the chart rendered)."""
    out = copy.deepcopy(dict(obj))
    meta = out.setdefault("metadata", {})
    _relabel(meta, owner_id(owner))
    if out["kind"] in CLUSTER_SCOPED:
        meta.pop("namespace", None)
    else:
        meta["namespace"] = namespace or meta.get("namespace") or owner["metadata"].get("namespace")
        meta["ownerReferences"] = [owner_reference(owner)]
    if out["kind"] not in WORKLOADS:
        return out
    section = spec.get(component.spec_key) or {}
    template = out["spec"]["template"]
    _relabel(template.setdefault("metadata", {}), owner_id(owner))
    pod = template["spec"]
    pod["nodeSelector"] = dict(pod.get("nodeSelector") or {}, **gate_selector(component, registry, spec))
    image = section.get("image") or {}
    for container in pod["containers"]:
        if container["name"] != component.name:
            continue
        container["image"] = image_reference(spec, component)
        container["imagePullPolicy"] = image.get("pullPolicy", "IfNotPresent")
        if section.get("resources"):
            container["resources"] = copy.deepcopy(section["resources"])
    out["spec"]["template"] = apply_overrides(template, spec.get("podTemplateSpec"), section.get("podTemplateSpec"))
    return out


def desired_objects(rendered: Iterable[Mapping[str, Any]], spec: Mapping[str, Any], owner: Mapping[str, Any],
                    registry: Sequence[Component] = REGISTRY,
                    namespace: Optional[str] = None) -> Dict[str, List[Dict[str, Any]]]:
    """Objects per deployed component, in chain order (components that are off map to [])."""
    result: Dict[str, List[Dict[str, Any]]] = {c.name: [] for c in registry}
    for obj in rendered:
        component = component_of(obj, registry)
        if component is None or not deployed(component, spec):
            continue
        result[component.name].append(adapt(obj, component, spec, owner, registry, namespace))
    return result


# An object for the administrator to edit (driver-config, gpu-aware-plugin: the one
# list is contract.ADMINISTRATOR_OWNED): applied when absent, never applied again nor
# put back by the drift watch.
ANNOTATION_APPLY = names.ANNOTATION_OPERATOR_APPLY


def create_only(obj: Mapping[str, Any]) -> bool:
    return administrator_owned(obj) is not None


def object_key(obj: Mapping[str, Any]) -> str:
    meta = obj["metadata"]
    return "%s/%s/%s/%s" % (obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"])


def contains(live: Any, desired: Any) -> bool:
    """Whether ``live`` still holds every field ``desired`` sets, with the same value.

    What the API server adds (defaults, status, other managers' fields in a
    map) is not drift, nor what it leaves out (an empty ``nodeSelector``); lists must keep their length (server-side apply
    replaces an atomic list whole, and a missing or extra element of ours is
    drift). Pure: the drift check of the controller's watch on owned objects.
    """
    if isinstance(desired, Mapping):
        return isinstance(live, Mapping) and all(
            _zero(v) if live.get(k) is None else contains(live[k], v) for k, v in desired.items())
    if isinstance(desired, list):
        return isinstance(live, list) and len(live) == len(desired) and all(
            contains(a, b) for a, b in zip(live, desired))
    if isinstance(live, (int, float)) and isinstance(desired, str) or \
            isinstance(desired, (int, float)) and isinstance(live, str):
        return str(live) == str(desired)  # int-or-string fields (ports, maxUnavailable)
    return bool(live == desired)


def _zero(value: Any) -> bool:
    """A value the API server omits when stored (Go's omitempty: an empty map, list or string, false, 0)."""
    if isinstance(value, bool):
        return not value
    return value is None or (isinstance(value, int) and value == 0) or value in ({}, [], "")


def drifted(live: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """An owned object no longer is what the controller applied (its spec, data, labels, owner)."""
    return not contains(live, desired)
