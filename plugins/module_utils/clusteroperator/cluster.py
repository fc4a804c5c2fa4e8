# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The operator's I/O with the API server: apply, prune, node cleanup, the facts status needs.

Everything here is a thin call of the ``kubernetes`` client (guarded import,
see kube/client.py); decisions are made by the pure functions of
``render``, ``contract`` and ``status``.
"""

from __future__ import annotations

import hashlib
from typing import Any, Dict, FrozenSet, Iterable, List, Mapping, Optional, Sequence, Tuple

from .. import names
from ..errors import MetaxGpuError
from ..kube.client import HAS_KUBERNETES, ApiException, KubeClientError, json_api
from ..kube.node import patch_metadata, strip_changes
from ..kube.pages import raw_list
from .apis import (DEVICE_CLASS, OPTIONAL_KINDS, PROMETHEUS_RULE, SERVICE_MONITOR, Kind, ServedKinds, delete_policy,
                   group_versions, owned_kinds, served_of)
from .contract import Component
from .driver_rollout import RolloutPlan, driver_rollout, handback_patches

try:
    from kubernetes.dynamic import DynamicClient
    from kubernetes.dynamic.exceptions import ResourceNotFoundError
except ImportError:
    DynamicClient = None  # type: ignore[assignment,misc]
    ResourceNotFoundError = LookupError  # type: ignore[assignment,misc]

# What a component may own: (apiVersion, kind), cluster-scoped last so that
# nothing namespaced is left pointing at a deleted role. The OPTIONAL_KINDS
# (the Prometheus operator's) only where the cluster serves them.
OWNED_KINDS: Tuple[Kind, ...] = (
    ("apps/v1", "DaemonSet"), ("apps/v1", "Deployment"), ("v1", "Service"), ("v1", "ConfigMap"),
    SERVICE_MONITOR, PROMETHEUS_RULE,
    ("rbac.authorization.k8s.io/v1", "RoleBinding"), ("rbac.authorization.k8s.io/v1", "Role"),
    ("v1", "ServiceAccount"),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"), ("rbac.authorization.k8s.io/v1", "ClusterRole"),
    # container-runtime's RuntimeClass metax (issue 38)
    ("node.k8s.io/v1", "RuntimeClass"),
    # gpu-dra's DeviceClasses (issue 41), where resource.k8s.io/v1 is served (an optional kind)
    DEVICE_CLASS,
)
CLUSTER_KINDS = frozenset(("ClusterRole", "ClusterRoleBinding", "RuntimeClass", "DeviceClass"))
# Objects per list request of the status round's node and pod lists (docs/scale.md).
LIST_PAGE = 500


def _raw_pages(call: Any, *args: Any, **params: Any) -> List[Dict[str, Any]]:
    """Every item of a ``list_*`` call of kube/rest.JsonApi, LIST_PAGE per request, decoded from the raw JSON
    (kube/pages.raw_list).

    The status round reads every node and each DaemonSet's pods (one per GPU node) every
    STATUS_INTERVAL; the client's models, built and then sanitized back to dicts, took 3-5x the CPU
    and 2.2-2.4x the heap of the JSON itself at 2,000 GPU nodes (docs/scale.md, "operator-controller").
    """
    return raw_list(call, *args, page_size=LIST_PAGE, **params).items


def event_for(owner: Mapping[str, Any], event_type: str, reason: str, message: str, now: str) -> Dict[str, Any]:
    """The Event (pure): named by its owner, reason and message, so that a repeat is the same
    object; in ``names.OPERATOR_EVENT_NAMESPACE``, as Kubernetes files the events of
    cluster-scoped objects, with an involvedObject that has no namespace (what `kubectl describe`
    of a cluster-scoped object selects on)."""
    meta = owner["metadata"]
    digest = hashlib.sha256(("%s/%s/%s" % (meta["uid"], reason, message)).encode("utf-8")).hexdigest()[:16]
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": "%s.%s" % (meta["name"], digest), "namespace": names.OPERATOR_EVENT_NAMESPACE},
        "involvedObject": {"apiVersion": "%s/%s" % (names.OPERATOR_GROUP, names.OPERATOR_VERSION),
                           "kind": names.OPERATOR_KIND, "name": meta["name"], "uid": meta["uid"],
                           "resourceVersion": meta.get("resourceVersion")},
        "type": event_type, "reason": reason, "message": message[:1024],
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        "source": {"component": names.OPERATOR_FIELD_MANAGER},
    }


class PodsRemain(MetaxGpuError):
    """Pods of deleted components still run; cleaning node labels now would race their agents."""


class Cluster:
    """The API calls of the operator-controller over one ApiClient."""

    def __init__(self, api_client: Any, namespace: str) -> None:
        if not HAS_KUBERNETES or DynamicClient is None:
            raise KubeClientError("the 'kubernetes' Python package is required (requirements/agents.txt)")
        self.api = api_client
        self.namespace = namespace
        self.dynamic = DynamicClient(api_client)
        self.core = self.apps = json_api(api_client)
        self.served = ServedKinds(self.served_kinds)

    def served_kinds(self) -> FrozenSet[Kind]:
        """The OPTIONAL_KINDS the API server serves now: one discovery request per group/version
        (404: the group is not served; the dynamic client's own discovery would re-read every group)."""
        served: FrozenSet[Kind] = frozenset()
        for api_version in group_versions(OPTIONAL_KINDS):
            try:
                found = self.dynamic.request("GET", "/apis/" + api_version).to_dict()
            except ApiException as exc:
                if exc.status == 404:
                    continue
                raise
            kinds = [r.get("kind") for r in found.get("resources") or [] if "/" not in r.get("name", "")]
            served |= served_of(api_version, kinds)
        return served

    def owned_kinds(self, refresh: bool = False) -> Tuple[Kind, ...]:
        return owned_kinds(OWNED_KINDS, self.served.get(refresh))

    def _resource(self, api_version: str, kind: str) -> Any:
        return self.dynamic.resources.get(api_version=api_version, kind=kind)

    def apply(self, obj: Mapping[str, Any]) -> Dict[str, Any]:
        """Server-side apply as the operator's field manager (forced: the operator owns these objects);
        the object as the API server now has it."""
        resource = self._resource(obj["apiVersion"], obj["kind"])
        result = resource.server_side_apply(body=dict(obj), name=obj["metadata"]["name"],
                                            namespace=obj["metadata"].get("namespace"),
                                            field_manager=names.OPERATOR_FIELD_MANAGER, force_conflicts=True)
        return result.to_dict() if hasattr(result, "to_dict") else dict(result or {})

    def get(self, obj: Mapping[str, Any]) -> Optional[Dict[str, Any]]:
        """The object named like ``obj`` as the API server has it now (None: there is none)."""
        resource = self._resource(obj["apiVersion"], obj["kind"])
        try:
            return resource.get(name=obj["metadata"]["name"], namespace=obj["metadata"].get("namespace")).to_dict()
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def annotate(self, obj: Mapping[str, Any], annotations: Mapping[str, Optional[str]]) -> None:
        """Merge ``annotations`` into the live object named like ``obj`` (its content untouched)."""
        resource = self._resource(obj["apiVersion"], obj["kind"])
        resource.patch(name=obj["metadata"]["name"], namespace=obj["metadata"].get("namespace"),
                       body={"metadata": {"annotations": dict(annotations)}},
                       content_type="application/merge-patch+json")

    def post_event(self, owner: Mapping[str, Any], event_type: str, reason: str, message: str, now: str) -> None:
        """A core/v1 Event about the cluster-scoped ClusterOperator ``owner``, where `kubectl describe
        clusteroperator` finds it (event_for: namespace ``default``, no involvedObject namespace);
        the same event again counts up, as Kubernetes' recorder does."""
        event = event_for(owner, event_type, reason, message, now)
        name, namespace = event["metadata"]["name"], event["metadata"]["namespace"]
        try:
            self.core.create_namespaced_event(namespace, event)
            return
        except ApiException as exc:
            if exc.status != 409:
                raise
        old = self.core.read_namespaced_event(name, namespace)
        self.core.patch_namespaced_event(name, namespace, {"count": int(old.get("count") or 1) + 1,
                                                           "lastTimestamp": now})

    def crd_scope(self, name: str) -> Optional[str]:
        """``spec.scope`` of the CRD ``name`` (None: there is none)."""
        resource = self._resource("apiextensions.k8s.io/v1", "CustomResourceDefinition")
        try:
            return resource.get(name=name).to_dict()["spec"]["scope"]
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _owned(self, owner_uid: str, component: Optional[Component],
               served: Optional[FrozenSet[Kind]] = None) -> List[Tuple[Any, Mapping[str, Any]]]:
        selector = "%s=%s" % (names.LABEL_OPERATOR_OWNER, owner_uid)
        if component is not None:
            selector += ",app.kubernetes.io/name=%s" % component.name
        found = []
        kinds = self.owned_kinds() if served is None else owned_kinds(OWNED_KINDS, served)
        for api_version, kind in kinds:
            namespace = None if kind in CLUSTER_KINDS else self.namespace
            try:
                resource = self._resource(api_version, kind)
                items = resource.get(namespace=namespace, label_selector=selector).items
            except (ApiException, ResourceNotFoundError) as exc:
                # an optional kind's CRD deleted since discovery last answered: nothing of it is left
                if (api_version, kind) in OPTIONAL_KINDS and getattr(exc, "status", 404) == 404:
                    continue
                raise
            for item in items:
                found.append((resource, item.to_dict()))
        return found

    def prune(self, owner_uid: str, component: Optional[Component], keep: Iterable[str] = (),
              served: Optional[FrozenSet[Kind]] = None) -> int:
        """Delete the owner's objects (of one component, or all) except ``keep`` (kind/namespace/name keys).

        ``served``: the optional kinds ``keep`` was rendered with. Only those are
        listed, so a render made before a CRD appeared never prunes the objects
        of that kind a newer render has just created (None: what discovery says now).
        """
        keep_set = set(keep)
        deleted = 0
        for resource, item in self._owned(owner_uid, component, served):
            meta = item["metadata"]
            key = "%s/%s/%s" % (item["kind"], meta.get("namespace") or "", meta["name"])
            if key in keep_set:
                continue
            deleted += self._delete_owned(resource, meta)
        return deleted

    @staticmethod
    def _delete_owned(resource: Any, meta: Mapping[str, Any]) -> int:
        """Delete one owned object with its kind's propagation policy; 1, or 0 when it was gone already."""
        try:
            resource.delete(name=meta["name"], namespace=meta.get("namespace"),
                            body={"propagationPolicy": delete_policy((resource.group_version, resource.kind))})
        except ApiException as exc:
            if exc.status != 404:
                raise
            return 0
        return 1

    def prune_former(self, owner_uid: str, components: Iterable[str],
                     served: Optional[FrozenSet[Kind]] = None) -> int:
        """Delete the owner's objects whose component (``app.kubernetes.io/name``) is none of ``components``.

        An earlier version of ours named them otherwise (issue 38: ``gpu-device`` became
        ``metax-gpu-device``, MetaX's name): no component's :meth:`prune` lists them, and an old
        device-plugin DaemonSet left running beside the new one would register the same resource twice.
        """
        current = set(components)
        deleted = 0
        for resource, item in self._owned(owner_uid, None, served):
            meta = item["metadata"]
            if (meta.get("labels") or {}).get("app.kubernetes.io/name") in current:
                continue
            deleted += self._delete_owned(resource, meta)
        return deleted

    def pods(self, owner_uid: str, component: Optional[Component] = None) -> List[Dict[str, Any]]:
        selector = "%s=%s" % (names.LABEL_OPERATOR_OWNER, owner_uid)
        if component is not None:
            selector += ",app.kubernetes.io/name=%s" % component.name
        # a DaemonSet's pods: one per GPU node
        return _raw_pages(self.core.list_namespaced_pod, self.namespace, label_selector=selector)

    def nodes(self) -> List[Dict[str, Any]]:
        return _raw_pages(self.core.list_node)

    def workload(self, component: Component) -> Optional[Dict[str, Any]]:
        read = self.apps.read_namespaced_daemon_set if component.kind == "DaemonSet" \
            else self.apps.read_namespaced_deployment
        try:
            return read(component.name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def patch_node_metadata(self, node: str, metadata: Mapping[str, Any]) -> None:
        """A merge patch of ``node``'s labels and annotations (kube/node.py)."""
        patch_metadata(self.core, node, metadata.get("labels"), metadata.get("annotations"))

    def roll_driver(self, spec: Mapping[str, Any], now: float,
                    previous: Optional[Mapping[str, Any]] = None) -> RolloutPlan:
        """One reconcile of the rolling driver upgrade: the nodes read, ``driver_rollout``'s patches
        applied (finishing ones first, as it orders them); the caller writes ``plan.status``
        to ``status.driverUpgrade`` and passes it back as ``previous`` next time."""
        plan = driver_rollout(spec, self.nodes(), now, previous)
        for patch in plan.patches:
            self.core.patch_node(patch.node, patch.body)
        return plan

    def hand_back_nodes(self, nodes: Sequence[Mapping[str, Any]]) -> List[str]:
        """The driver component goes mid-rollout: the started nodes of ``nodes`` finished
        (driver_rollout.handback_patches); the failed ones, left as they are, named."""
        patches, failed = handback_patches(nodes)
        for patch in patches:
            self.core.patch_node(patch.node, patch.body)
        return failed

    def strip_nodes(self, label_patterns: Sequence[str], annotation_patterns: Sequence[str],
                    skip: Sequence[str] = (), nodes: Optional[Sequence[Mapping[str, Any]]] = None) -> List[str]:
        """Remove matching labels and annotations from every node (``nodes``: as just read) but
        ``skip``; the nodes changed (kube/node.py's one strip routine)."""
        changed = strip_changes(self.nodes() if nodes is None else nodes, label_patterns, annotation_patterns, skip)
        for change in changed:
            self.patch_node_metadata(change.name, change.metadata_patch())
        return [change.name for change in changed]
