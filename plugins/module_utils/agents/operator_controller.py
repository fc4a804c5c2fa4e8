# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""operator-controller: reconciles the ClusterOperator into the components (manual section 3).

    python -m ansible_collections.metax.gpu.plugins.module_utils.agents.operator_controller \\
        [--namespace metax-operator] [--chart-dir DIR] [--helm helm] [--crd FILE] [--kubeconfig F] \\
        [--health-port 8080] [--metrics-port 9400] [--lease NAME] | --cleanup | --migrate

The process: of two replicas one acts, the leader of a coordination.k8s.io
Lease (kube/leader.py), which alone runs kopf with the handlers of
agents/operator_handlers.py over clusteroperator/operator.py's Operator; a
replica that loses the Lease exits. Every replica serves /healthz (Health).
The ClusterOperator is cluster-scoped, as the real one. ``--cleanup`` runs the
finalizer's work once and removes the finalizer (the chart's pre-delete hook:
uninstall cleans up even when the controller is down); ``--migrate`` carries
an older install's namespaced ClusterOperator over (clusteroperator/migrate.py,
the chart's migration Job). See docs/operator.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import threading
import time
from typing import Any, Dict, Optional, Sequence, Tuple

from .. import eviction_webhook, names
from ..clusteroperator import migrate
from ..clusteroperator.cluster import Cluster
from ..clusteroperator.operator import Operator
from ..kube.client import ApiException
from ..kube.leader import LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD, LeaderElector, still_leading
from ..kubelet.httpserve import BoundedHandler, BoundedHTTPServer
from ..kubelet.metrics import REGISTRY, MetricsServer, RegistryExposition
from .common import UsageError, add_common_flags, kube_api_client, run_main, setup_logging, tcp_port
from .operator_handlers import register

try:
    import kopf
    HAS_KOPF = True
except ImportError:
    kopf = None  # type: ignore[assignment]
    HAS_KOPF = False

COMPONENT = "operator-controller"
DEFAULT_CHART_DIR = "/opt/metax/charts/metax-gpu-extensions"
DEFAULT_CRD = "/opt/metax/crds/clusteroperator.yaml"
OPERATOR_CRD = "%s.%s" % (names.OPERATOR_PLURAL, names.OPERATOR_GROUP)
LOG = logging.getLogger(COMPONENT)


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
    eviction_webhook.add_flags(parser)
    return parser


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

    def probe(self) -> Tuple[bool, str]:
        """(healthy, why) for the /healthz of the metrics server."""
        ok, body = self.state()
        return ok, json.dumps(body)

    def serve(self, port: int, address: str = "0.0.0.0") -> BoundedHTTPServer:
        """/healthz on ``port``, bounded as the agents' /metrics servers (kubelet/httpserve.py)."""
        health = self

        class Handler(BoundedHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                ok, body = health.state()
                self.send_body(404 if not self.path.startswith("/healthz") else 200 if ok else 503,
                               json.dumps(body).encode("utf-8"), "application/json")

        server = BoundedHTTPServer((address, port), Handler)
        server.serve_in_thread("healthz")
        return server


def serve_metrics(port: int, health: Health, address: str = "0.0.0.0") -> MetricsServer:
    """/metrics (the process's default registry: the handlers' counters, prometheus_client's process and
    platform collectors) and /healthz on ``port``, bounded (kubelet/metrics.py)."""
    server = MetricsServer(RegistryExposition(REGISTRY), address, port, health.probe)
    server.start()
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
    elector = LeaderElector(cluster.core, args.namespace, args.lease,
                            leader_identity(os.environ.get("POD_NAME"), socket.gethostname(), os.getpid()),
                            lease_duration=args.lease_duration, renew_deadline=args.renew_deadline,
                            retry_period=args.retry_period)
    health = Health(elector)
    if args.health_port:
        health.serve(args.health_port)
    if args.metrics_port:
        serve_metrics(args.metrics_port, health)
    if args.eviction_webhook_port:  # every replica, leader or not: the API server calls any (docs/security.md)
        eviction_webhook.serve_from_flags(cluster.core, args)
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
