# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""From the namespaced ClusterOperator of an older install to the cluster-scoped one, in place.

A CRD's scope cannot change, and Helm never upgrades a chart's crds/, so an
upgrade carries the CR over itself (the chart's migration Jobs run
``operator-controller --migrate``, docs/operator.md). Before the upgrade
(:meth:`Migration.run_before_upgrade`) the namespaced CRD only gets this
release's schema, so that Helm's update of the CR is validated by it. After:

1. wait until no controller of the older release runs (every pod of the
   operator-controller Deployment is of its newest ReplicaSet; the new
   controller acts only on a cluster-scoped CRD, so none acts meanwhile);
2. keep the CR in a ConfigMap (``clusteroperator-migration``): a Job cut off
   half-way finds it and finishes on its next run;
3. take the CR's ownerReferences off its objects and delete it with the
   Orphan policy, its finalizer removed (no cleanup runs): its DaemonSets and
   their pods stay as they are;
4. delete the namespaced CRD, apply the cluster-scoped one, create the CR
   with the same spec, labels and Helm annotations, and the old uid as its
   owner id (contract.owner_id): the pod templates the new controller renders
   are then the ones running, and no pod is recreated;
5. remove kopf's peering object and, when no other one is left, its CRD (an
   older install's; nothing of ours uses them any more).

:func:`carried_over` and :func:`old_controllers` are pure; :func:`run` is the I/O.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from .. import names
from ..errors import MetaxGpuError
from ..kube.client import ApiException
from .cluster import CLUSTER_KINDS, OWNED_KINDS, Cluster, ResourceNotFoundError

LOG = logging.getLogger("operator-controller.migrate")
CRD_NAME = "%s.%s" % (names.OPERATOR_PLURAL, names.OPERATOR_GROUP)
BACKUP_CONFIGMAP = "clusteroperator-migration"
BACKUP_KEY = "clusteroperator.json"
PEERING_CRD = "kopfpeerings.kopf.dev"
PEERING_NAME = "metax-operator"
CONTROLLER = "operator-controller"
RBAC_KINDS = frozenset(("Role", "RoleBinding"))
# annotations of the controller's handlers (kopf's progress and diff-base): the new CR starts afresh
DROPPED_PREFIXES = (names.OPERATOR_GROUP + "/", "kopf.zalando.org/")


class MigrationError(MetaxGpuError):
    """The ClusterOperator could not be carried over; nothing was lost (see the message)."""


def carried_over(old: Mapping[str, Any]) -> Dict[str, Any]:
    """The cluster-scoped CR to create for the namespaced ``old`` one (pure): same name, spec,
    labels and annotations (Helm's release annotations: the release keeps owning it), without
    the handlers' bookkeeping, and the old owner id (``old``'s uid unless it carries one)."""
    meta = old["metadata"]
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if not k.startswith(DROPPED_PREFIXES)}
    carried = (meta.get("annotations") or {}).get(names.ANNOTATION_OPERATOR_OWNER_ID) or meta["uid"]
    annotations[names.ANNOTATION_OPERATOR_OWNER_ID] = carried
    return {
        "apiVersion": old.get("apiVersion") or "%s/%s" % (names.OPERATOR_GROUP, names.OPERATOR_VERSION),
        "kind": names.OPERATOR_KIND,
        "metadata": {"name": meta["name"], "labels": dict(meta.get("labels") or {}), "annotations": annotations},
        "spec": old.get("spec") or {},
    }


def old_controllers(deployment: Mapping[str, Any], replica_sets: Sequence[Mapping[str, Any]],
                    pods: Sequence[Mapping[str, Any]]) -> List[str]:
    """The pods of ``deployment`` that are not of its newest ReplicaSet (an older release's
    controller, still running or terminating); [] when the rollout has left only new ones."""
    revision = (deployment["metadata"].get("annotations") or {}).get("deployment.kubernetes.io/revision")
    newest = next((rs for rs in replica_sets
                   if (rs["metadata"].get("annotations") or {}).get("deployment.kubernetes.io/revision") == revision),
                  None)
    if revision is None or newest is None:
        return sorted(p["metadata"]["name"] for p in pods)   # the controller has not rolled out yet
    current = (newest["metadata"].get("labels") or {}).get("pod-template-hash")
    return sorted(p["metadata"]["name"] for p in pods
                  if (p["metadata"].get("labels") or {}).get("pod-template-hash") != current)


def with_scope(crd: Mapping[str, Any], scope: str) -> Dict[str, Any]:
    """``crd`` (as the chart ships it) with ``scope`` (pure)."""
    out = json.loads(json.dumps(crd))
    out["spec"]["scope"] = scope
    return out


def without_owner(refs: Sequence[Mapping[str, Any]], uid: str) -> Optional[List[Dict[str, Any]]]:
    """ownerReferences without those to ``uid`` (None: there were none to remove)."""
    kept = [dict(r) for r in refs if r.get("uid") != uid]
    return None if len(kept) == len(refs) else kept


class Migration:
    """The steps of the module docstring over a :class:`Cluster` (its namespace: the release's)."""

    def __init__(self, cluster: Cluster, crd_path: str, timeout: float = 600.0, pause: float = 2.0,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> None:
        self.cluster = cluster
        self.crd_path = crd_path
        self.timeout = timeout
        self.pause = pause
        self._sleep = sleep
        self._clock = clock
        self.namespace = cluster.namespace

    def _resource(self, api_version: str, kind: str) -> Any:
        return self.cluster.dynamic.resources.get(api_version=api_version, kind=kind)

    def _wait(self, what: str, done: Callable[[], bool]) -> None:
        deadline = self._clock() + self.timeout
        while not done():
            if self._clock() > deadline:
                raise MigrationError("timed out after %ds waiting for %s" % (self.timeout, what))
            self._sleep(self.pause)

    def _get(self, api_version: str, kind: str, name: str, namespace: Optional[str] = None) -> Optional[Dict[str, Any]]:
        try:
            return self._resource(api_version, kind).get(name=name, namespace=namespace).to_dict()
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def run_before_upgrade(self) -> int:
        """The pre-upgrade step: the older namespaced CRD gets this release's schema, scope kept, so
        that Helm's update of the CR (still namespaced until the post-upgrade step) is validated by
        the new schema (a real 0.9.2 values file's `vfnumsConfig.nodes` level, the kept keys) and not
        refused or pruned by the old one. A scope change here would break Helm's update instead: Helm
        maps the release's objects before the pre-upgrade hooks run."""
        self.cluster.dynamic.resources.invalidate_cache()
        live = self._get("apiextensions.k8s.io/v1", "CustomResourceDefinition", CRD_NAME)
        if live is None or live["spec"]["scope"] != "Namespaced":
            return 0
        live["spec"] = with_scope(self._crd_file(), "Namespaced")["spec"]
        for key in ("managedFields",):
            live["metadata"].pop(key, None)
        self._resource("apiextensions.k8s.io/v1", "CustomResourceDefinition").replace(body=live)
        LOG.info("CRD %s: this release's schema, still namespaced until the upgrade's last step", CRD_NAME)
        return 0

    def _crd_file(self) -> Dict[str, Any]:
        try:
            import yaml   # the controller image has PyYAML (requirements/agents.txt)
        except ImportError as exc:   # the house rule: third-party imports guarded
            raise MigrationError("reading %s needs PyYAML (%s)" % (self.crd_path, exc)) from exc
        with open(self.crd_path) as stream:
            docs = [d for d in yaml.safe_load_all(stream) if d]
        return next(d for d in docs if d["metadata"]["name"] == CRD_NAME)

    def run(self) -> int:
        # the dynamic client's discovery is cached on disk across processes: a cache from before
        # the CRD changed would still say "namespaced" (and refuse a create without a namespace)
        self.cluster.dynamic.resources.invalidate_cache()
        scope = self.cluster.crd_scope(CRD_NAME)
        if scope == "Namespaced":
            self.wait_for_old_controllers()
            self.carry_over()
        else:
            self.finish()   # nothing namespaced: a run cut off after the CRD changed finishes here
        self.remove_peering()
        return 0

    def wait_for_old_controllers(self) -> None:
        def gone() -> bool:
            deployment = self._get("apps/v1", "Deployment", CONTROLLER, self.namespace)
            if deployment is None:
                return True
            selector = ",".join("%s=%s" % kv for kv in deployment["spec"]["selector"]["matchLabels"].items())
            sets = self._resource("apps/v1", "ReplicaSet").get(namespace=self.namespace, label_selector=selector)
            pods = self._resource("v1", "Pod").get(namespace=self.namespace, label_selector=selector)
            left = old_controllers(deployment, [r.to_dict() for r in sets.items], [p.to_dict() for p in pods.items])
            if left:
                LOG.info("waiting for the older controller's pods to go: %s", ", ".join(left))
            return not left
        self._wait("the older release's operator-controller pods to go", gone)

    def _custom(self) -> Any:
        return self._resource("%s/%s" % (names.OPERATOR_GROUP, names.OPERATOR_VERSION), names.OPERATOR_KIND)

    def carry_over(self) -> None:
        custom = self._custom()
        items = [i.to_dict() for i in custom.get().items]   # every namespace
        ours = [i for i in items if i["metadata"]["name"] == names.OPERATOR_CR_NAME]
        if len(ours) > 1:
            raise MigrationError("%d namespaced ClusterOperators named %s (%s): a cluster-scoped one can be only "
                                 "one; delete all but the one to keep, then run the upgrade again" % (
                                     len(ours), names.OPERATOR_CR_NAME,
                                     ", ".join(i["metadata"]["namespace"] for i in ours)))
        others = [i for i in items if i["metadata"]["name"] != names.OPERATOR_CR_NAME]
        if others:
            raise MigrationError("ClusterOperators not named %s exist (%s): the controller never acted on them; "
                                 "delete them, then run the upgrade again" % (
                                     names.OPERATOR_CR_NAME, ", ".join("%s/%s" % (i["metadata"]["namespace"],
                                                                                  i["metadata"]["name"]) for i in others)))
        if ours:
            old = ours[0]
            self.keep(carried_over(old))
            self.release(old)
        self.replace_crd()
        self.finish()

    def keep(self, new: Mapping[str, Any]) -> None:
        """The CR to create, kept in the release namespace until it exists (step 2)."""
        body = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": BACKUP_CONFIGMAP, "namespace": self.namespace,
                             "labels": {"app.kubernetes.io/name": CONTROLLER}},
                "data": {BACKUP_KEY: json.dumps(new, sort_keys=True)}}
        self.cluster.apply(body)
        LOG.info("ClusterOperator %s kept in ConfigMap %s/%s", new["metadata"]["name"], self.namespace, BACKUP_CONFIGMAP)

    def release(self, old: Mapping[str, Any]) -> None:
        """Step 3: its objects no longer owned by it, the CR gone without its finalizer's cleanup."""
        uid = old["metadata"]["uid"]
        for api_version, kind in OWNED_KINDS:
            if kind in CLUSTER_KINDS or kind in RBAC_KINDS:
                # cluster-scoped: no ownerReference to a namespaced owner; Roles: patching one needs
                # every right it grants (escalation), and the Orphan deletion below clears them anyway
                continue
            try:
                resource = self._resource(api_version, kind)
                items = resource.get(namespace=self.namespace).items
            except ApiException as exc:
                if exc.status == 404:
                    continue   # an optional kind the cluster does not serve
                raise
            except ResourceNotFoundError:
                continue
            for item in items:
                obj = item.to_dict()
                refs = without_owner(obj["metadata"].get("ownerReferences") or [], uid)
                if refs is None:
                    continue
                resource.patch(name=obj["metadata"]["name"], namespace=self.namespace,
                               content_type="application/merge-patch+json",
                               body={"metadata": {"ownerReferences": refs or None}})
        custom = self._custom()
        name, namespace = old["metadata"]["name"], old["metadata"]["namespace"]
        try:
            custom.delete(name=name, namespace=namespace, body={"propagationPolicy": "Orphan"})
        except ApiException as exc:
            if exc.status != 404:
                raise

        def gone() -> bool:
            live = self._get(custom.group_version, names.OPERATOR_KIND, name, namespace)
            if live is None:
                return True
            finalizers = live["metadata"].get("finalizers") or []
            if names.OPERATOR_FINALIZER in finalizers:
                custom.patch(name=name, namespace=namespace, content_type="application/merge-patch+json",
                             body={"metadata": {"finalizers": [f for f in finalizers if f != names.OPERATOR_FINALIZER]
                                                or None}})
            return False
        self._wait("the namespaced ClusterOperator to go", gone)
        LOG.info("namespaced ClusterOperator %s/%s deleted, its objects orphaned", namespace, name)

    def replace_crd(self) -> None:
        """Step 4's CRD: the namespaced one deleted, the cluster-scoped one of ``crd_path`` applied."""
        crds = self._resource("apiextensions.k8s.io/v1", "CustomResourceDefinition")
        try:
            crds.delete(name=CRD_NAME)
        except ApiException as exc:
            if exc.status != 404:
                raise
        self._wait("the namespaced CRD to go", lambda: self.cluster.crd_scope(CRD_NAME) is None)
        self.cluster.apply(self._crd_file())

        def established() -> bool:
            crd = self._get("apiextensions.k8s.io/v1", "CustomResourceDefinition", CRD_NAME)
            conditions = ((crd or {}).get("status") or {}).get("conditions") or []
            return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)
        self._wait("the cluster-scoped CRD to be established", established)
        self.cluster.dynamic.resources.invalidate_cache()
        LOG.info("CRD %s is cluster-scoped", CRD_NAME)

    def finish(self) -> None:
        """Step 4's CR, from the kept copy (none: nothing to carry over)."""
        kept = self._get("v1", "ConfigMap", BACKUP_CONFIGMAP, self.namespace)
        if kept is None:
            return
        new = json.loads(kept["data"][BACKUP_KEY])
        try:
            self._custom().create(body=new)
            LOG.info("ClusterOperator %s created, cluster-scoped, owner id %s", new["metadata"]["name"],
                     new["metadata"]["annotations"][names.ANNOTATION_OPERATOR_OWNER_ID])
        except ApiException as exc:
            if exc.status != 409:
                raise
            LOG.info("ClusterOperator %s exists already", new["metadata"]["name"])
        self._resource("v1", "ConfigMap").delete(name=BACKUP_CONFIGMAP, namespace=self.namespace)

    def remove_peering(self) -> None:
        """Step 5: kopf's peering object of the older controller, and its CRD when nothing else uses it."""
        if self._get("apiextensions.k8s.io/v1", "CustomResourceDefinition", PEERING_CRD) is None:
            return
        try:
            peerings = self._resource("kopf.dev/v1", "KopfPeering")
        except ResourceNotFoundError:
            return
        try:
            peerings.delete(name=PEERING_NAME, namespace=self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
        if not peerings.get().items:
            self._resource("apiextensions.k8s.io/v1", "CustomResourceDefinition").delete(name=PEERING_CRD)
            LOG.info("CRD %s deleted (no peering object left)", PEERING_CRD)


def run(cluster: Cluster, crd_path: str, timeout: float = 600.0, phase: str = "post-upgrade") -> int:
    """``operator-controller --migrate [--migrate-phase pre-upgrade]``."""
    migration = Migration(cluster, crd_path, timeout)
    return migration.run_before_upgrade() if phase == "pre-upgrade" else migration.run()
