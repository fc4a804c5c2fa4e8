# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""operator-controller: reconciles the ClusterOperator into the components (manual section 3).

    python -m ansible_collections.metax.gpu.plugins.module_utils.agents.operator_controller \\
        [--namespace metax-operator] [--chart-dir DIR] [--helm helm] [--crd FILE] [--kubeconfig F] \\
        [--health-port 8080] [--metrics-port 9400] [--lease NAME] | --cleanup | --migrate

Built on kopf: handlers for create/update/resume, the finalizer (cleanup of
every object and every ``metax-tech.com/`` node label and annotation before
the CR goes), retries with backoff (``kopf.TemporaryError``), a status timer
that writes only when the status changed, a watch on the objects it owns that
puts back an edited or deleted one (drift; not the administrator's own,
contract.ADMINISTRATOR_OWNED). Of two replicas one acts: the leader of a
coordination.k8s.io Lease (kube/leader.py), which alone runs kopf; a replica
that loses the Lease exits. The ClusterOperator is cluster-scoped, as the real
one. ``--cleanup`` runs the finalizer's work once and removes the finalizer
(the chart's pre-delete hook: uninstall cleans up even when the controller is
down); ``--migrate`` carries an older install's namespaced ClusterOperator over
(clusteroperator/migrate.py, the chart's migration Job). See docs/operator.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import json
import logging
import http.server
import os
import signal
import socket
import threading
import time
from typing import AbstractSet, Any, Dict, FrozenSet, Iterator, List, Mapping, Optional, Sequence, Set, Tuple

from .. import names
from ..clusteroperator import render
from ..clusteroperator.apis import OPTIONAL_CRDS, OPTIONAL_KINDS, Kind, helm_api_versions
from ..clusteroperator.cluster import Cluster
from ..clusteroperator.driver_rollout import RolloutPlan
from ..kube.client import ApiException
from ..kube.leader import LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD, LeaderElector, still_leading
from ..clusteroperator import migrate
from ..clusteroperator.components import DRIVER, REGISTRY
from ..clusteroperator.contract import ADMINISTRATOR_OWNED, Component, administrator_owned, deployed, owner_id
from ..vfnum import config as vfnum_config
from ..vfnum.plan import VfnumError
from ..clusteroperator.vfio import vfio_conditions
from ..clusteroperator.status import (
    component_status, condition, ignored_fields, node_messages, overall, readiness_labels, same_status,
    waiting_nodes, with_transition_times)
from .common import UsageError, add_common_flags, kube_api_client, run_main, setup_logging, tcp_port

try:
    import kopf
    import yaml
    from kubernetes import client as k8s_client
    from prometheus_client import Counter, start_http_server
    HAS_KOPF = True
except ImportError:
    kopf = yaml = start_http_server = Counter = k8s_client = None  # type: ignore[assignment,misc]
    HAS_KOPF = False

COMPONENT = "operator-controller"
DEFAULT_CHART_DIR = "/opt/metax/charts/metax-gpu-extensions"
DEFAULT_CRD = "/opt/metax/crds/clusteroperator.yaml"
STATUS_INTERVAL = 5.0
RETRY_BACKOFF = 5.0
OPERATOR_CRD = "%s.%s" % (names.OPERATOR_PLURAL, names.OPERATOR_GROUP)
# Owned kinds whose edits and deletions are put back at once (a watch each,
# filtered by the owner label; the chart grants `watch` on them). RBAC objects
# are left to the next reconcile: the agents' roles are not edited in practice,
# and a watch on them would need `watch` on every Role in the namespace.
# The Prometheus operator's kinds are watched while their CRDs exist (kopf's
# resource scanning starts and stops those watches as the CRDs come and go).
DRIFT_WATCHED = (("apps", "v1", "daemonsets"), ("apps", "v1", "deployments"), ("", "v1", "configmaps"),
                 ("", "v1", "services"), ("", "v1", "serviceaccounts"),
                 ("monitoring.coreos.com", "v1", "servicemonitors"), ("monitoring.coreos.com", "v1", "prometheusrules"))
LOG = logging.getLogger(COMPONENT)


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
        meta = (fresh or {}).get("metadata") or {}
        return fresh is not None and not meta.get("deletionTimestamp") and meta.get("uid") == body["metadata"]["uid"]

    def apis_changed(self, owner: Optional[Mapping[str, Any]], handled: bool = True) -> Optional[Dict[str, int]]:
        """An optional kind's CRD changed: reconcile when what the cluster serves is not what the
        last reconcile rendered with (None: nothing to do). A CR change not yet handled reconciles anyway."""
        if not owner or (owner.get("metadata") or {}).get("deletionTimestamp") or not handled:
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
        if not owner or (owner.get("metadata") or {}).get("deletionTimestamp"):
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
            if event_type != "DELETED" and (meta.get("deletionTimestamp") or not render.drifted(live, desired)
                                            or render.create_only(desired)):
                return None
            # An event may be older than our last apply (a status update queued
            # before it): only the object as it is now says whether it drifted,
            # and only a CR that still is this version may have it back (the
            # watch of the CR can lag behind the uninstall hook's delete).
            fresh = self.cluster.get(owner)
            if fresh is None or (fresh.get("metadata") or {}).get("deletionTimestamp") or \
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
                raise _retry("pods of %s are still terminating" % component.name)
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
            raise _retry("component pods are still terminating")
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


def status_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> Dict[str, Any]:
    """The merge patch that makes the status ``new``: what ``status.driverUpgrade`` no longer says
    (a step pause over, the driver component switched off) is removed explicitly, since a merge
    patch keeps every key it does not name (and the status would then never equal ``new``)."""
    out = dict(new)
    before, after = old.get("driverUpgrade"), new.get("driverUpgrade")
    if before and after is None:
        out["driverUpgrade"] = None
    elif isinstance(before, Mapping) and isinstance(after, Mapping):
        out["driverUpgrade"] = dict(after, **{k: None for k in before if k not in after})
    return out


def seed_digest(obj: Mapping[str, Any]) -> str:
    """What an administrator-owned object is created from (its data), as a short stable digest."""
    text = json.dumps({k: obj.get(k) for k in ("data", "binaryData", "spec")}, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def not_applied_condition(obj: Mapping[str, Any], recorded: str, wanted: str,
                          namespace: str) -> Optional[Dict[str, str]]:
    """The condition saying the CR's change of what seeds ``obj`` is not applied (None: no change)."""
    owned = administrator_owned(obj)
    if owned is None or recorded == wanted:
        return None
    name = obj["metadata"]["name"]
    return condition(owned.reason, True, owned.reason,
                     "%s changed after %s was created; %s is the administrator's and is not changed by the "
                     "controller: edit it with `kubectl -n %s edit %s %s`"
                     % (owned.seeded_by, name, name, namespace, owned.kind.lower(), name))


def _version(meta: Mapping[str, Any]) -> str:
    """What changes when an object's content does (generation where the kind has one: not on status)."""
    return str(meta.get("generation") or meta.get("resourceVersion") or "")


def _retry(message: str) -> Exception:
    if HAS_KOPF:
        return kopf.TemporaryError(message, delay=2)
    return RuntimeError(message)


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=COMPONENT, description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE", names.OPERATOR_NAMESPACE))
    parser.add_argument("--chart-dir", default=DEFAULT_CHART_DIR, help="the GPU Extensions chart it renders")
    parser.add_argument("--helm", default="helm", help="helm binary for `helm template`")
    parser.add_argument("--crd", default=DEFAULT_CRD, help="ClusterOperator CRD applied at startup ('' = no)")
    parser.add_argument("--health-port", type=tcp_port, default=8080, help="/healthz port (0 = off)")
    parser.add_argument("--metrics-port", type=tcp_port, default=9400, help="/metrics port (0 = off)")
    parser.add_argument("--lease", default=names.OPERATOR_LEADER_LEASE,
                        help="the coordination.k8s.io Lease of the leader election (one active replica)")
    parser.add_argument("--lease-duration", type=int, default=LEASE_DURATION,
                        help="seconds a standby waits after the leader's last renewal it saw")
    parser.add_argument("--renew-deadline", type=float, default=RENEW_DEADLINE,
                        help="seconds the leader acts without a successful renewal (< --lease-duration)")
    parser.add_argument("--retry-period", type=float, default=RETRY_PERIOD, help="seconds between Lease tries")
    parser.add_argument("--cleanup", action="store_true",
                        help="run the finalizer's cleanup once on the ClusterOperator and exit")
    parser.add_argument("--migrate", action="store_true",
                        help="carry a namespaced ClusterOperator (an older install's CRD) over to the "
                             "cluster-scoped CRD of --crd, and exit (the chart's migration Job)")
    parser.add_argument("--migrate-phase", choices=("pre-upgrade", "post-upgrade"), default="post-upgrade",
                        help="pre-upgrade: only give the namespaced CRD this release's schema (scope kept)")
    parser.add_argument("--migrate-timeout", type=float, default=600.0,
                        help="seconds --migrate waits for the older controller's pods to go")
    add_common_flags(parser, host_root=False)
    return parser


def register(operator: Operator, args: argparse.Namespace, stop: Optional[threading.Event] = None) -> None:
    """kopf handlers over ``operator`` (module-level registry: one operator per process).

    ``stop``: kopf's stop flag, set when kopf stops for another reason (a signal): kopf waits for a
    threading.Event in an executor thread, which would otherwise keep the process from exiting."""
    resource = (names.OPERATOR_GROUP, names.OPERATOR_VERSION, names.OPERATOR_PLURAL)

    if stop is not None:
        @kopf.on.cleanup()
        def stopping(**_: Any) -> None:
            stop.set()

    @kopf.on.login(id="login")
    def login(**kwargs: Any) -> Any:
        """The same credentials as our own client (--kubeconfig, else in-cluster)."""
        if not args.kubeconfig:
            return kopf.login_via_client(**kwargs)
        return connection_info(operator.cluster.api.configuration)

    diffbase = kopf.AnnotationsDiffBaseStorage(prefix=names.OPERATOR_GROUP)

    def handled(body: Mapping[str, Any]) -> bool:
        """kopf's own test: the CR's spec is the one its handlers last finished with."""
        wrapped = kopf.Body(dict(body))  # type: ignore[arg-type]  # a raw object, as kopf builds it
        return bool(diffbase.fetch(body=wrapped) == diffbase.build(body=wrapped))

    @kopf.on.startup()
    def configure(settings: Any, **_: Any) -> None:
        settings.persistence.finalizer = names.OPERATOR_FINALIZER
        # the CRD's status schema has no room for kopf's own progress: annotations only
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=names.OPERATOR_GROUP)
        settings.persistence.diffbase_storage = diffbase
        # One replica acts: the leader of the Lease (main() starts kopf only once it leads,
        # and stops it when the Lease is lost), so no kopf peering and no KopfPeering CRD.
        settings.peering.standalone = True
        # kopf files the events of a cluster-scoped object with a namespace in their
        # involvedObject, where `kubectl describe` does not look: ours are posted by
        # Cluster.post_event instead (failures below, VfnumsConfigNotApplied).
        settings.posting.enabled = False
        # Scanning on: kopf watches the CRDs, so the drift watches of the
        # Prometheus operator's kinds start when their CRDs appear and stop
        # (instead of failing) when they go; the namespace list tells it
        # that metax-operator exists. Both read-only (templates/rbac.yaml).
        settings.scanning.disabled = False
        settings.posting.level = logging.WARNING
        if args.crd:
            apply_crd(operator.cluster, args.crd)

    # Errors are retried after RETRY_BACKOFF seconds, not kopf's default minute:
    # a component should not wait a minute for an API server that was restarting.
    @kopf.on.resume(*resource, id="reconcile", backoff=RETRY_BACKOFF)
    @kopf.on.create(*resource, id="reconcile", backoff=RETRY_BACKOFF)
    @kopf.on.update(*resource, id="reconcile", backoff=RETRY_BACKOFF)
    def reconcile(body: Any, logger: Any, **_: Any) -> None:
        with failure_event(operator, body, "ReconcileFailed"):
            counts = operator.reconcile(dict(body))
        logger.info("reconciled: %(applied)d objects applied, %(deleted)d deleted", counts)

    @kopf.on.delete(*resource, id="cleanup", backoff=RETRY_BACKOFF)
    def finalize(body: Any, logger: Any, **_: Any) -> None:
        with failure_event(operator, body, "CleanupFailed"):
            changed = operator.cleanup(dict(body))
        logger.info("cleaned up; nodes changed: %s", ", ".join(changed) or "none")

    repairs = Counter("metax_operator_drift_repairs_total",
                      "Owned objects put back after an edit or a deletion", ["kind", "action"])

    @kopf.index(*resource, id="owners")
    def owners(body: Any, **_: Any) -> Dict[str, Any]:
        """The CR as the watch last saw it (no API call), for the drift handlers."""
        return {"cluster-operator": dict(body)}

    watched: Set[str] = set()   # kinds whose drift watch has delivered an event (audit_unwatched)

    def repair_drift(event: Any, logger: Any, **kwargs: Any) -> None:
        obj = event.get("object") or {}
        watched.add(obj.get("kind", ""))
        current = next(iter(kwargs["owners"].get("cluster-operator", ())), None)  # the index above
        # A CR change not yet reconciled is the reconcile's to apply: a repair
        # now would race it (and count a rollout as drift).
        action = operator.repair(event.get("type"), obj, current, current is not None and handled(current))
        if action:
            repairs.labels(obj.get("kind", ""), action).inc()
            logger.warning("drift: %s %s %s", obj.get("kind"), (obj.get("metadata") or {}).get("name"), action)

    # Only the active peer watches (kopf pauses the standby's watches too).
    for group, version, plural in DRIFT_WATCHED:
        kopf.on.event(group, version, plural, id="drift-" + plural,
                      labels={names.LABEL_OPERATOR_OWNER: kopf.PRESENT})(repair_drift)

    @kopf.on.event("apiextensions.k8s.io", "v1", "customresourcedefinitions", id="optional-apis",
                   when=lambda name, **_: name in OPTIONAL_CRDS)
    def optional_apis(event: Any, logger: Any, **kwargs: Any) -> None:
        """A ServiceMonitor or PrometheusRule CRD came, went or became established: render again
        with what the cluster now serves, without waiting for a CR change."""
        if event.get("type") is None:
            return  # the initial listing: the resume handler reconciles with a fresh discovery anyway
        current = next(iter(kwargs["owners"].get("cluster-operator", ())), None)
        counts = operator.apis_changed(current, current is not None and handled(current))
        if counts is not None:
            logger.info("optional APIs changed (%s): %d objects applied, %d deleted",
                        ", ".join(helm_api_versions(operator.cluster.served.get())) or "none",
                        counts["applied"], counts["deleted"])

    @kopf.timer(*resource, id="status", interval=STATUS_INTERVAL, initial_delay=1.0, backoff=RETRY_BACKOFF)
    def refresh_status(body: Any, patch: Any, **_: Any) -> None:
        # the rolling driver upgrade moves on at the status round: its patches first, so the
        # status written below already shows them
        rollout = operator.roll_driver(dict(body), time.time())
        for kind, name, action in operator.audit_unwatched(dict(body), watched, handled(body)):
            repairs.labels(kind, action).inc()
            LOG.warning("drift: %s %s %s (found by reading it: no watch of its kind yet)", kind, name, action)
        now = now_rfc3339()
        new = operator.status(dict(body), now, rollout)
        for cond in newly_true(body.get("status") or {}, new, NOTE_REASONS):
            operator.cluster.post_event(dict(body), "Warning", cond["reason"], cond["message"], now)
        if not same_status(body.get("status"), new):
            for key, value in status_patch(body.get("status") or {}, new).items():
                patch.status[key] = value


# The conditions that are notes to the administrator: a Warning Event when one appears.
NOTE_REASONS = frozenset(a.reason for a in ADMINISTRATOR_OWNED)


def newly_true(old: Mapping[str, Any], new: Mapping[str, Any], types: AbstractSet[str]) -> List[Dict[str, Any]]:
    """The conditions of ``types`` that are True in ``new`` and were not (with that message) in ``old``."""
    before = {(c.get("type"), c.get("status"), c.get("message")) for c in old.get("conditions") or []}
    return [c for c in new.get("conditions") or []
            if c["type"] in types and c["status"] == "True" and (c["type"], "True", c.get("message")) not in before]


@contextlib.contextmanager
def failure_event(operator: Operator, body: Mapping[str, Any], reason: str) -> Iterator[None]:
    """A handler's failure as a Warning Event on the CR (kopf retries it); the error goes on."""
    try:
        yield
    except Exception as exc:
        try:
            operator.cluster.post_event(dict(body), "Warning", reason, str(exc) or type(exc).__name__, now_rfc3339())
        except Exception as event_exc:  # pylint: disable=broad-except  # the event is a courtesy
            LOG.warning("posting event %s: %s", reason, event_exc)
        raise


def connection_info(configuration: Any) -> Any:
    """kopf's ConnectionInfo from a kubernetes client Configuration (kubernetes' own loader reads
    $KUBECONFIG at import time, so kopf's default login cannot be pointed at --kubeconfig)."""
    if configuration.refresh_api_key_hook is not None:
        configuration.refresh_api_key_hook(configuration)
    keys = configuration.api_key or {}
    token = keys.get("BearerToken") or keys.get("authorization") or ""
    scheme, _sep, value = token.partition(" ")
    return kopf.ConnectionInfo(
        server=configuration.host, ca_path=configuration.ssl_ca_cert, insecure=not configuration.verify_ssl,
        scheme=scheme or None, token=value or None,
        certificate_path=configuration.cert_file, private_key_path=configuration.key_file)


def apply_crd(cluster: Cluster, path: str) -> None:
    """Helm never upgrades crds/: the controller applies the CRD it was built with."""
    with open(path) as stream:
        for doc in yaml.safe_load_all(stream):
            if doc:
                cluster.apply(doc)


def run_cleanup(operator: Operator, attempts: int = 90, pause: float = 2.0) -> int:
    """The pre-delete hook: the finalizer's work, the CR deleted, whether the controller is up or down.

    A live controller may put its finalizer back (kopf adds it to every CR it
    sees) and then runs the same cleanup itself when the CR is deleted; a dead
    one cannot, so the finalizer is removed here until the CR is gone. The
    ClusterOperator is cluster-scoped: read and written without a namespace.
    """
    custom = operator.cluster.dynamic.resources.get(
        api_version="%s/%s" % (names.OPERATOR_GROUP, names.OPERATOR_VERSION), kind=names.OPERATOR_KIND)
    for item in custom.get().items:
        name = item.metadata.name
        body = item.to_dict()
        # Deleted first: a live controller then stops putting back what the
        # cleanup below deletes (its drift watch leaves a CR that is going).
        # Without our finalizer the CR goes at once: the cleanup still runs
        # with the body read above (cluster-scoped objects and node labels
        # are not garbage-collected).
        try:
            custom.delete(name=name)
        except ApiException as exc:
            if exc.status != 404:
                raise
        for attempt in range(attempts):
            gone = False
            try:
                body = custom.get(name=name).to_dict()
            except ApiException as exc:
                if exc.status != 404:
                    raise
                gone = True
            try:
                operator.cleanup(body)
            except Exception as exc:  # pylint: disable=broad-except
                if attempt == attempts - 1:
                    raise
                LOG.info("cleanup of %s: %s; retrying", name, exc)
                time.sleep(pause)
                continue
            if gone:
                LOG.info("ClusterOperator %s is gone", name)
                break
            finalizers = body["metadata"].get("finalizers") or []
            if names.OPERATOR_FINALIZER in finalizers:
                custom.patch(name=name, content_type="application/merge-patch+json",
                             body={"metadata": {"finalizers": [f for f in finalizers
                                                               if f != names.OPERATOR_FINALIZER] or None}})
            time.sleep(pause / 2)
        else:
            raise UsageError("ClusterOperator %s still exists after the cleanup" % name)
    return 0


def leader_identity(pod_name: Optional[str], hostname: str, pid: int) -> str:
    """The Lease's holderIdentity: the pod's name (a restarted container of the same pod takes
    its own Lease back at once); outside a pod, host and process."""
    return pod_name or "%s_%d" % (hostname, pid)


class Health:
    """/healthz of a replica, leader or standby (kopf's own endpoint runs only in the leader).

    Healthy while the election is alive: a standby trying, a leader whose
    last renewal is recent (a leader that cannot renew exits anyway)."""

    def __init__(self, elector: LeaderElector, clock: Any = time.monotonic) -> None:
        self.elector = elector
        self.leading = False
        self._clock = clock

    def state(self) -> Tuple[bool, Dict[str, Any]]:
        renewed = self.elector.last_renewed
        ok = not self.leading or (renewed is not None and still_leading(renewed, self._clock(),
                                                                        self.elector.lease_duration))
        return ok, {"leader": self.leading, "identity": self.elector.identity}

    def serve(self, port: int) -> http.server.ThreadingHTTPServer:
        health = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                ok, body = health.state()
                data = json.dumps(body).encode("utf-8")
                self.send_response(404 if not self.path.startswith("/healthz") else 200 if ok else 503)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_args: Any) -> None:
                return None

        server = http.server.ThreadingHTTPServer(("0.0.0.0", port), Handler)
        threading.Thread(target=server.serve_forever, name="healthz", daemon=True).start()
        return server


def wait_for_cluster_scope(cluster: Cluster, stop: threading.Event, pause: float = 5.0) -> bool:
    """Wait while the ClusterOperator CRD is still the namespaced one of an older install: the
    chart's migration Job carries it over (docs/operator.md); acting before would make the CRD
    apply at startup fail (a CRD's scope cannot change). Whether it is cluster-scoped (or absent)."""
    logged = False
    while not stop.is_set():
        if cluster.crd_scope(OPERATOR_CRD) != "Namespaced":
            if logged:   # migrated meanwhile: discovery's cache (on disk) may still say namespaced
                cluster.dynamic.resources.invalidate_cache()
            return True
        if not logged:
            LOG.warning("the ClusterOperator CRD is still namespaced: waiting for the chart's migration Job "
                        "(docs/operator.md, \"Migration to the cluster-scoped ClusterOperator\")")
            logged = True
        stop.wait(pause)
    return False


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(COMPONENT, args)
    if not HAS_KOPF:
        raise UsageError("the 'kopf' Python package is required (requirements/agents.txt)")
    cluster = Cluster(kube_api_client(args.kubeconfig), args.namespace)
    operator = Operator(cluster, args.helm, args.chart_dir)
    if args.cleanup:
        return run_cleanup(operator)
    if args.migrate:
        return migrate.run(cluster, args.crd, args.migrate_timeout, args.migrate_phase)
    if args.metrics_port:
        start_http_server(args.metrics_port)
    elector = LeaderElector(k8s_client.CoordinationV1Api(cluster.api), args.namespace, args.lease,
                            leader_identity(os.environ.get("POD_NAME"), socket.gethostname(), os.getpid()),
                            lease_duration=args.lease_duration, renew_deadline=args.renew_deadline,
                            retry_period=args.retry_period)
    health = Health(elector)
    if args.health_port:
        health.serve(args.health_port)
    # One flag stops everything: SIGTERM before kopf runs (kopf handles the signals once it
    # does), a lost Lease, kopf's end. kopf gets it as its stop flag.
    stop = threading.Event()
    lost = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    if not elector.acquire(stop):
        return 0

    def on_lost() -> None:
        lost.set()
        stop.set()

    # renewed from now on, also while the leader waits for a migration
    keeper = threading.Thread(target=elector.keep, args=(stop, on_lost), name="lease", daemon=True)
    keeper.start()
    health.leading = True
    try:
        if wait_for_cluster_scope(cluster, stop):
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            LOG.info("%s leads (Lease %s/%s): starting the handlers", elector.identity, args.namespace, args.lease)
            register(operator, args, stop)
            # identity given: kopf's own default asks getpass for the user, which raises for the
            # image's uid 65532 (no passwd entry); standalone needs it only for its logs
            kopf.run(namespaces=[args.namespace], standalone=True, stop_flag=stop, liveness_endpoint=None,
                     identity=elector.identity)  # type: ignore[arg-type]  # kopf types it as an unexported NewType of str
    finally:
        stop.set()
        keeper.join(timeout=args.retry_period * 2)
    if lost.is_set():
        # exit so the pod restarts as a standby: handlers may have been cut mid-way,
        # and the next leader resumes them (kopf's progress is on the CR)
        LOG.error("the Lease was lost: exiting")
        return 1
    elector.release()
    return 0


if __name__ == "__main__":
    run_main(COMPONENT, main)
