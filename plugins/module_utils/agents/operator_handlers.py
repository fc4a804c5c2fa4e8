# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The operator-controller's kopf wiring: the handlers over :class:`~..clusteroperator.operator.Operator`.

Handlers for create/update/resume, the finalizer (cleanup of every object and
every ``metax-tech.com/`` node label and annotation before the CR goes),
retries with backoff (``kopf.TemporaryError``), a status timer that writes only
when the status changed, and a watch on the objects it owns that puts back an
edited or deleted one (drift; not the administrator's own,
contract.ADMINISTRATOR_OWNED). The work itself is the Operator's; what is here
is kopf's registration, its settings and its login.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import logging
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Mapping, MutableMapping, Optional, Set, Tuple

from .. import names
from ..clusteroperator.apis import OPTIONAL_CRDS, helm_api_versions
from ..clusteroperator.cluster import Cluster
from ..clusteroperator.contract import being_deleted
from ..clusteroperator.notes import NOTE_REASONS, newly_true, status_patch
from ..clusteroperator.operator import Operator, Retry
from ..clusteroperator.status import same_status
from ..kubelet.metrics import REGISTRY, counter

try:
    import kopf
    import yaml
    HAS_KOPF = True
except ImportError:
    kopf = yaml = None  # type: ignore[assignment]
    HAS_KOPF = False

STATUS_INTERVAL = 5.0
RETRY_BACKOFF = 5.0
# Owned kinds whose edits and deletions are put back at once (a watch each,
# filtered by the owner label; the chart grants `watch` on them). RBAC objects
# are left to the next reconcile: the agents' roles are not edited in practice,
# and a watch on them would need `watch` on every Role in the namespace.
# The Prometheus operator's kinds are watched while their CRDs exist (kopf's
# resource scanning starts and stops those watches as the CRDs come and go).
DRIFT_WATCHED = (("apps", "v1", "daemonsets"), ("apps", "v1", "deployments"), ("", "v1", "configmaps"),
                 ("", "v1", "services"), ("", "v1", "serviceaccounts"),
                 ("monitoring.coreos.com", "v1", "servicemonitors"), ("monitoring.coreos.com", "v1", "prometheusrules"))
LOG = logging.getLogger("operator-controller")


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
        with kopf_retry(), failure_event(operator, body, "ReconcileFailed"):
            counts = operator.reconcile(dict(body))
        logger.info("reconciled: %(applied)d objects applied, %(deleted)d deleted", counts)

    @kopf.on.delete(*resource, id="cleanup", backoff=RETRY_BACKOFF)
    def finalize(body: Any, logger: Any, **_: Any) -> None:
        with kopf_retry(), failure_event(operator, body, "CleanupFailed"):
            changed = operator.cleanup(dict(body))
        logger.info("cleaned up; nodes changed: %s", ", ".join(changed) or "none")

    # the process's default registry (with prometheus_client's process and platform collectors),
    # served on --metrics-port by operator_controller's MetricsServer
    repairs = counter("metax_operator_drift_repairs_total",
                      "Owned objects put back after an edit or a deletion", ["kind", "action"], registry=REGISTRY)

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
        with kopf_retry():
            counts = operator.apis_changed(current, current is not None and handled(current))
        if counts is not None:
            logger.info("optional APIs changed (%s): %d objects applied, %d deleted",
                        ", ".join(helm_api_versions(operator.cluster.served.get())) or "none",
                        counts["applied"], counts["deleted"])

    @kopf.timer(*resource, id="status", interval=STATUS_INTERVAL, initial_delay=1.0, backoff=RETRY_BACKOFF)
    def refresh_status(body: Any, patch: Any, **_: Any) -> None:
        for kind, name, action in status_round(operator, body, patch.status, watched, handled):
            repairs.labels(kind, action).inc()


def status_round(operator: Operator, body: Mapping[str, Any], status: MutableMapping[str, Any], watched: Set[str],
                 handled: Callable[[Mapping[str, Any]], bool]) -> List[Tuple[str, str, str]]:
    """One round of the status timer: the driver rollout's next step, the owned objects no watch
    covers yet (their repairs are returned), and the status keys that changed, set in ``status``.

    A CR being deleted is the cleanup handler's alone: a rollout step would fight its hand-back of
    the nodes, and a status write changes the resourceVersion that kopf's finalizer removal tests
    (a 422 there left the CR with its finalizer until the next unrelated change). ``body`` is kopf's
    live view for timers, so it is read again after the round's API reads.
    """
    if being_deleted(body):
        return []
    # the rolling driver upgrade moves on at the status round: its patches first, so the
    # status written below already shows them
    rollout = operator.roll_driver(dict(body), time.time())
    repaired = operator.audit_unwatched(dict(body), watched, handled(body))
    for kind, name, action in repaired:
        LOG.warning("drift: %s %s %s (found by reading it: no watch of its kind yet)", kind, name, action)
    now = now_rfc3339()
    new = operator.status(dict(body), now, rollout)
    if being_deleted(body):
        return repaired
    for cond in newly_true(body.get("status") or {}, new, NOTE_REASONS):
        operator.cluster.post_event(dict(body), "Warning", cond["reason"], cond["message"], now)
    if not same_status(body.get("status"), new):
        status.update(status_patch(body.get("status") or {}, new))
    return repaired


@contextlib.contextmanager
def kopf_retry() -> Iterator[None]:
    """The Operator's :class:`Retry` as kopf's TemporaryError: retried after its delay, not the backoff."""
    try:
        yield
    except Retry as exc:
        raise kopf.TemporaryError(str(exc), delay=exc.delay) from exc


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


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
