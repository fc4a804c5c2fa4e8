# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The operator-controller's work, independent of kopf's wiring: reconcile the ClusterOperator
into the components, put back what drifted, clean up, roll the driver and compute the status.

One I/O object, :class:`~.cluster.Cluster`; the rest is the pure modules around it (render,
status, notes, driver_rollout). agents/operator_handlers.py registers these methods as kopf
handlers; agents/operator_controller.py is the process (docs/operator.md).
"""

from __future__ import annotations

import logging
import threading
from typing import AbstractSet, Any, Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple

from .. import names
from ..errors import MetaxGpuError
from ..vfnum import config as vfnum_config
from ..vfnum.plan import VfnumError
from . import render
from .apis import OPTIONAL_KINDS, Kind, helm_api_versions
from .cluster import Cluster
from .components import DRIVER, REGISTRY
from .contract import Component, administrator_owned, being_deleted, deployed, owner_id
from .driver_rollout import RolloutPlan
from .notes import not_applied_condition, seed_digest
from .vfio import vfio_conditions
from .status import (
    component_status, ignored_fields, node_messages, overall, readiness_labels, waiting_nodes,
    with_transition_times)

try:
    import yaml
except ImportError:
    yaml = None

LOG = logging.getLogger("operator-controller")


class Retry(MetaxGpuError):
    """Not yet: try again in ``delay`` seconds (the kopf wiring makes it a kopf.TemporaryError)."""

    def __init__(self, message: str, delay: float = 2.0) -> None:
        super().__init__(message)
        self.delay = delay


class Operator:
    """The controller's work, independent of kopf's wiring (kopf calls these)."""

    def __init__(self, cluster: Cluster, helm: str, chart_dir: str,
                 registry: Sequence[Component] = REGISTRY) -> None:
        self.cluster = cluster
        self.helm = helm
        self.chart_dir = chart_dir
        self.registry = tuple(registry)
        # The objects of one version (uid, generation) of the CR, by
        # object_key: the drift watch compares owned objects with them. A
        # standby that becomes active renders the CR it sees now, never the
        # older one it may have reconciled at startup. The lock keeps a
        # repair from applying one version while a reconcile applies another.
        self._desired: Dict[str, Dict[str, Any]] = {}
        self._desired_version: Optional[Tuple[str, int]] = None
        self._reconciled_version: Optional[Tuple[str, int]] = None
        # the optional kinds (ServiceMonitor, PrometheusRule) the last reconcile rendered with
        self._reconciled_served: Optional[FrozenSet[Kind]] = None
        self._unrepairable: Dict[str, str] = {}
        self._lock = threading.RLock()

    def _render(self, body: Mapping[str, Any], served: FrozenSet[Kind]) -> Dict[str, List[Dict[str, Any]]]:
        """The objects of ``body`` (a cluster-scoped ClusterOperator: the components go to the
        controller's namespace), the administrator's own marked as created once."""
        spec = body.get("spec") or {}
        namespace = self.cluster.namespace
        rendered = render.helm_template(self.helm, self.chart_dir, render.chart_values(spec, self.registry),
                                        namespace, api_versions=helm_api_versions(served))
        desired = render.desired_objects(rendered, spec, body, self.registry, namespace)
        for objects in desired.values():
            for obj in objects:
                if administrator_owned(obj) is not None:
                    annotations = obj["metadata"].setdefault("annotations", {})
                    annotations[names.ANNOTATION_OPERATOR_APPLY] = "create-only"
                    annotations[names.ANNOTATION_OPERATOR_CREATED_FROM] = seed_digest(obj)
        return desired

    def _remember(self, body: Mapping[str, Any], desired: Mapping[str, List[Dict[str, Any]]]) -> None:
        meta = body["metadata"]
        self._desired = {render.object_key(o): o for objects in desired.values() for o in objects}
        self._desired_version = (meta["uid"], meta.get("generation", 0))
        self._unrepairable = {}

    def reconcile(self, body: Dict[str, Any]) -> Dict[str, int]:
        """Apply every deployed component's objects in chain order; remove what is off.

        Discovery is asked afresh each time, so a Prometheus operator installed
        (or removed) since the last reconcile is seen by this one.
        """
        # One reconcile at a time, discovery and render included: a render made
        # with an older answer must not apply or prune after a newer one.
        with self._lock:
            if not self._still_current(body):
                # A late caller (a CRD event handled after the CR was deleted) must not
                # recreate what the cleanup removed: cluster-scoped objects would be orphaned.
                return {"applied": 0, "deleted": 0}
            served = self.cluster.served.get(refresh=True)
            desired = self._render(body, served)
            self._remember(body, desired)
            counts = self._apply_all(body, desired, served)
            self._reconciled_version = self._desired_version
            self._reconciled_served = served
            return counts

    def _still_current(self, body: Mapping[str, Any]) -> bool:
        """Whether the ClusterOperator ``body`` still exists as that object (same uid) and is not being deleted."""
        fresh = self.cluster.get(body)
        return fresh is not None and not being_deleted(fresh) and fresh["metadata"].get("uid") == body["metadata"]["uid"]

    def apis_changed(self, owner: Optional[Mapping[str, Any]], handled: bool = True) -> Optional[Dict[str, int]]:
        """An optional kind's CRD changed: reconcile when what the cluster serves is not what the
        last reconcile rendered with (None: nothing to do). A CR change not yet handled reconciles anyway."""
        if not owner or being_deleted(owner) or not handled:
            return None
        served = self.cluster.served.get(refresh=True)
        with self._lock:
            if served == self._reconciled_served:
                return None
        return self.reconcile(dict(owner))

    def audit_unwatched(self, owner: Optional[Mapping[str, Any]], watched: AbstractSet[str],
                        handled: bool = True) -> List[Tuple[str, str, str]]:
        """Repair by reading, not by watching, the objects of optional kinds no drift event came for yet.

        kopf starts a kind's watch when a CRD event's rescan of the group finds
        the kind in discovery; discovery is updated after the CRD's last event
        (kubernetes/kubernetes#125471), so the scan can miss it and the watch
        never starts until a restart. Until an event of the kind arrives (its
        watch runs), each status round reads those objects (two GETs each)
        and puts back what is gone or changed: (kind, name, action) per repair.
        """
        optional = {kind for _api_version, kind in OPTIONAL_KINDS} - set(watched)
        with self._lock:
            candidates = [o for o in self._desired.values() if o["kind"] in optional]
        repaired = []
        for obj in candidates:
            action = self.repair("DELETED", obj, owner, handled)   # DELETED: compare with the live object
            if action:
                repaired.append((obj["kind"], obj["metadata"]["name"], action))
        return repaired

    def _apply_all(self, body: Dict[str, Any], desired: Mapping[str, List[Dict[str, Any]]],
                   served: FrozenSet[Kind]) -> Dict[str, int]:
        spec = body.get("spec") or {}
        uid = owner_id(body)
        counts = {"applied": 0, "deleted": 0}
        for component in self.registry:
            objects = desired[component.name]
            for obj in objects:
                if render.create_only(obj) and self.cluster.get(obj) is not None:
                    continue  # the administrator's now (driver-config, gpu-aware-plugin): never applied again
                self.cluster.apply(obj)
            counts["applied"] += len(objects)
            keep = ["%s/%s/%s" % (o["kind"], o["metadata"].get("namespace") or "", o["metadata"]["name"])
                    for o in objects]
            counts["deleted"] += self.cluster.prune(uid, component, keep, served)
            if not deployed(component, spec):
                self.cleanup_nodes([component], uid)
        # objects of ours under an earlier version's component names (an upgraded operator)
        counts["deleted"] += self.cluster.prune_former(uid, [c.name for c in self.registry], served)
        return counts

    def repair(self, event_type: Optional[str], live: Mapping[str, Any],
               owner: Optional[Mapping[str, Any]], handled: bool = True) -> Optional[str]:
        """Put back an owned object that was edited or deleted; what was done (None: nothing drifted).

        Called for every event of an owned object with the ClusterOperator as
        the watch last saw it (``owner``); the comparison is local, so the
        events of a healthy cluster (status updates, our own applies) cost no
        API call, and an idle cluster none at all. Only an event that differs
        costs a read of the object, and only a real difference a write.
        ``handled``: kopf's handlers finished this version of the CR (else a
        reconcile is pending, and it applies everything anyway, unless this
        process has just finished one of it, before kopf recorded that).
        """
        key = render.object_key(live)
        meta = live.get("metadata") or {}
        if not owner or being_deleted(owner):
            return None  # no CR, or it is going: the finalizer removes everything
        if (meta.get("labels") or {}).get(names.LABEL_OPERATOR_OWNER) != owner_id(owner):
            return None
        with self._lock:  # held by a reconcile while it applies: a repair waits for it
            version = (owner["metadata"]["uid"], owner["metadata"].get("generation", 0))
            if not handled and self._reconciled_version != version:
                return None
            if self._desired_version != version:
                self._remember(owner, self._render(owner, self.cluster.served.get()))
            desired = self._desired.get(key)
            if desired is None:
                return None  # not (or no longer) ours to keep: pruned, component off, CR going
            if event_type != "DELETED" and (being_deleted(live) or not render.drifted(live, desired)
                                            or render.create_only(desired)):
                return None
            # An event may be older than our last apply (a status update queued
            # before it): only the object as it is now says whether it drifted,
            # and only a CR that still is this version may have it back (the
            # watch of the CR can lag behind the uninstall hook's delete).
            fresh = self.cluster.get(owner)
            if fresh is None or being_deleted(fresh) or \
                    (fresh["metadata"]["uid"], fresh["metadata"].get("generation", 0)) != version:
                return None
            current = self.cluster.get(desired)
            if current is None:
                action = "recreated"
            elif render.create_only(desired):
                return None
            elif not render.drifted(current, desired):
                return None
            elif self._unrepairable.get(key) == _version(current.get("metadata") or {}):
                return None  # applied once already for this version and still different: see below
            else:
                action = "restored"
            result = self.cluster.apply(desired)
            if render.drifted(result, desired):
                # A field server-side apply cannot take back (an element another
                # manager added to a list of ours): applying again would change
                # nothing, so wait until the object changes again.
                self._unrepairable[key] = _version(result.get("metadata") or {})
                LOG.warning("%s still differs from what the controller applies after a repair", key)
            return action

    def cleanup_nodes(self, components: Sequence[Component], uid: str) -> List[str]:
        """Strip what ``components`` own from the nodes, once none of their pods runs."""
        for component in components:
            if self.cluster.pods(uid, component):
                raise Retry("pods of %s are still terminating" % component.name)
        labels = [p for c in components for p in c.owned_labels()]
        annotations = [p for c in components for p in c.cleanup_annotations]
        nodes = self.cluster.nodes()
        # Switched off mid-rollout: our cordons lifted; a failed node keeps its cordon and marks.
        failed = self.cluster.hand_back_nodes(nodes) if DRIVER in components else []
        return self.cluster.strip_nodes(labels, annotations, skip=failed, nodes=nodes)

    def cleanup(self, body: Dict[str, Any]) -> List[str]:
        """Everything of ours goes: objects, then every metax-tech.com/ node label and annotation."""
        uid = owner_id(body)
        with self._lock:  # a reconcile under way finishes first; any later one sees the CR going
            self.cluster.prune(uid, None)
        if self.cluster.pods(uid):
            raise Retry("component pods are still terminating")
        nodes = self.cluster.nodes()
        self.cluster.hand_back_nodes(nodes)     # our cordons lifted; everything else of ours goes below
        return self.cluster.strip_nodes([names.PREFIX], [names.PREFIX], nodes=nodes)

    def roll_driver(self, body: Mapping[str, Any], now: float) -> Optional[RolloutPlan]:
        """One round of the rolling driver upgrade when the driver component is deployed (None: it is not).

        The planner finishes validated nodes and starts the next ones
        (clusteroperator/driver_rollout.py); the last ``status.driverUpgrade``
        goes back in, so a running step pause survives a controller restart.
        An upgradePolicy it cannot act on changes nothing (``plan.error``).
        """
        spec = body.get("spec") or {}
        if not any(c.spec_key == "driver" and deployed(c, spec) for c in self.registry):
            return None
        previous = (body.get("status") or {}).get("driverUpgrade")
        plan = self.cluster.roll_driver(spec, now, previous)
        for patch in plan.patches:
            LOG.info("driver upgrade: %s %s", patch.action, patch.node)
        return plan

    def status(self, body: Dict[str, Any], now: str, rollout: Optional[RolloutPlan] = None) -> Dict[str, Any]:
        """The status the CR should carry now (facts read; nothing written but readiness labels).

        ``rollout``: this round's driver upgrade (:meth:`roll_driver`), reported
        in ``status.driverUpgrade``; its error makes the driver component Degraded.
        """
        spec = body.get("spec") or {}
        uid = owner_id(body)
        nodes = self.cluster.nodes()
        old = body.get("status") or {}
        old_components = {c.get("name"): c for c in old.get("components") or []}
        entries = []
        for component in self.registry:
            on = deployed(component, spec)
            workload = self.cluster.workload(component) if on else None
            pods = self.cluster.pods(uid, component) if on else []
            waiting = waiting_nodes(component, self.registry, spec, nodes) if on else {}
            problems = node_messages(component, nodes) if on else {}
            if on and component.spec_key == "driver":
                problems.update(self.driver_config_problems(self.cluster.namespace, nodes))
                if rollout is not None and rollout.error:
                    problems["upgradePolicy"] = rollout.error
            entry = component_status(component, spec, workload, pods, waiting, problems)
            entry["conditions"] = with_transition_times(
                entry["conditions"], (old_components.get(component.name) or {}).get("conditions"), now)
            entries.append(entry)
            if on:
                for node, labels in readiness_labels(component, pods, nodes).items():
                    self.cluster.patch_node_metadata(node, {"labels": labels})
        gpu_nodes = [n for n in nodes
                     if (n["metadata"].get("labels") or {}).get(names.LABEL_GPU_INSTALLED) == "true"]
        device = next((e for e in entries if e["name"] == names.DAEMONSET_GPU_DEVICE), None)
        out = {
            "observedGeneration": body["metadata"].get("generation", 0),
            "conditions": with_transition_times(overall(entries, ignored_fields(body)) + self.not_applied(body)
                                                + vfio_conditions(spec, nodes), old.get("conditions"), now),
            "nodes": {"total": len(nodes), "gpu": len(gpu_nodes), "ready": device["ready"] if device else 0},
            "components": entries,
        }
        if rollout is not None and rollout.status:
            out["driverUpgrade"] = rollout.status
        return out

    def not_applied(self, body: Mapping[str, Any]) -> List[Dict[str, str]]:
        """A condition per administrator-owned object whose seed in the CR changed since it was
        created (``driver.vfnumsConfig`` -> driver-config): what the CR asks is not applied, the
        administrator edits the object itself. An object created before the digest existed gets
        the digest of the CR as it is now (its annotation only: the content stays theirs)."""
        version = (body["metadata"]["uid"], body["metadata"].get("generation", 0))
        with self._lock:
            if self._desired_version != version:
                return []   # no render of this version yet: the next round, after the reconcile
            desired = [o for o in self._desired.values() if administrator_owned(o) is not None]
        out = []
        for obj in desired:
            live = self.cluster.get(obj)
            if live is None:
                continue
            recorded = ((live.get("metadata") or {}).get("annotations") or {}).get(names.ANNOTATION_OPERATOR_CREATED_FROM)
            wanted = obj["metadata"]["annotations"][names.ANNOTATION_OPERATOR_CREATED_FROM]
            if not recorded:
                self.cluster.annotate(obj, {names.ANNOTATION_OPERATOR_CREATED_FROM: wanted})
                continue
            note = not_applied_condition(obj, recorded, wanted, self.cluster.namespace)
            if note:
                out.append(note)
        return out

    def driver_config_problems(self, namespace: str, nodes: Sequence[Mapping[str, Any]]) -> Dict[str, str]:
        """driver-config entries for nodes that do not exist: no driver-manager runs there to refuse them."""
        live = self.cluster.get({"apiVersion": "v1", "kind": "ConfigMap",
                                 "metadata": {"name": names.DRIVER_CONFIGMAP, "namespace": namespace}})
        text = ((live or {}).get("data") or {}).get(vfnum_config.NODE_VFNUMS_KEY) or ""
        try:
            unknown = vfnum_config.unknown_nodes(yaml.safe_load(text), [n["metadata"]["name"] for n in nodes])
        except (yaml.YAMLError, VfnumError) as exc:
            return {names.DRIVER_CONFIGMAP: "%s is invalid: %s" % (vfnum_config.NODE_VFNUMS_KEY, exc)}
        return {node: "%s names a node that does not exist" % vfnum_config.NODE_VFNUMS_KEY for node in unknown}


def _version(meta: Mapping[str, Any]) -> str:
    """What changes when an object's content does (generation where the kind has one: not on status)."""
    return str(meta.get("generation") or meta.get("resourceVersion") or "")
