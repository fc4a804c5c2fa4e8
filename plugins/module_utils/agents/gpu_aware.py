# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""gpu-aware: the topology-aware scheduler extender (manual 2.1.5, 2.2.3).

    python -m ansible_collections.metax.gpu.plugins.module_utils.agents.gpu_aware \\
        [--port 8080] [--kubeconfig F] [--namespace NS] [--score-weight W] [--loss-weight W] \\
        [--max-body-bytes N] [--max-connections N] [--idle-timeout S] [--request-timeout S]
        [--tls-cert F --tls-key F] [--node-cache | --no-node-cache]

Serves ``POST /filter`` and ``POST /prioritize`` for kube-scheduler (both
``nodeCacheCapable`` modes), ``GET /healthz``, ``/readyz`` and ``/metrics``.
Weights come from the ConfigMap ``gpu-aware-plugin`` (keys ``scoreWeight``,
``lossWeight``), watched and applied without a restart; the flags give the
weights until it is read. Without a reachable API server the service still
answers ``nodeCacheCapable: false`` requests. See docs/gpu-aware.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from typing import List, Optional, Sequence

from ..extender.cache import NodeCache, WeightsHolder, configmap_source, list_watch, node_source
from ..extender.metrics import ExtenderMetrics
from ..extender.nodeinfo import StateCache
from ..names import GPU_AWARE_CONFIGMAP, NAMESPACE
from ..extender.policy import WeightError, Weights, parse_weight
from ..kube.watch import ListWatch
from ..extender.server import (
    DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_CONNECTIONS, DEFAULT_PORT, DEFAULT_REQUEST_TIMEOUT,
    ExtenderHTTPServer, tls_context)
from ..extender.service import ExtenderService
from .common import (UsageError, add_common_flags, kube_api_client, run_main, setup_logging, stop_event,
                     tcp_port)

COMPONENT = "gpu-aware"
SWITCH_INTERVAL = 0.0005


def _namespace_default() -> str:
    env = os.environ.get("POD_NAMESPACE")
    if env:
        return env
    try:
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace", encoding="utf-8") as handle:
            return handle.read().strip() or NAMESPACE
    except OSError:
        return NAMESPACE


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=COMPONENT, description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--address", default="", help="address to listen on (default: all)")
    parser.add_argument("--port", type=tcp_port, default=DEFAULT_PORT, help="HTTP(S) port (default %(default)s)")
    parser.add_argument("--namespace", default=None,
                        help="namespace of the ConfigMap (default: $POD_NAMESPACE, the service account's "
                             "namespace, else %s)" % NAMESPACE)
    parser.add_argument("--configmap", default=GPU_AWARE_CONFIGMAP, help="weights ConfigMap (default %(default)s)")
    parser.add_argument("--score-weight", default="1",
                        help="scoreWeight until the ConfigMap is read (default %(default)s)")
    parser.add_argument("--loss-weight", default="1",
                        help="lossWeight until the ConfigMap is read (default %(default)s)")
    parser.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                        help="largest request body accepted (default %(default)s: the ExtenderArgs of "
                             "5,000 full nodes measured 78 MB)")
    parser.add_argument("--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS,
                        help="connections served at once, one thread each; at the cap the one idle the "
                             "longest is closed (default %(default)s)")
    parser.add_argument("--idle-timeout", type=float, default=DEFAULT_IDLE_TIMEOUT,
                        help="seconds a keep-alive connection may wait for its next request "
                             "(default %(default)s)")
    parser.add_argument("--request-timeout", type=float, default=DEFAULT_REQUEST_TIMEOUT,
                        help="seconds from a request's first byte to its last (default %(default)s)")
    parser.add_argument("--tls-cert", default=None, help="serve HTTPS with this certificate (enableHTTPS)")
    parser.add_argument("--tls-key", default=None, help="private key of --tls-cert")
    parser.add_argument("--node-cache", dest="node_cache", action="store_true", default=True,
                        help="keep a node cache for nodeCacheCapable: true (default)")
    parser.add_argument("--no-node-cache", dest="node_cache", action="store_false",
                        help="no node watch; only nodeCacheCapable: false requests are served")
    parser.add_argument("--resync-seconds", type=float, default=300.0,
                        help="full re-list period of the node and ConfigMap watches (default %(default)s)")
    parser.add_argument("--shutdown-timeout", type=float, default=10.0,
                        help="seconds requests in progress get to finish on SIGTERM (default %(default)s)")
    add_common_flags(parser, host_root=False)
    return parser


def _weights(args: argparse.Namespace) -> Weights:
    try:
        return Weights(score=parse_weight(args.score_weight, "--score-weight"),
                       loss=parse_weight(args.loss_weight, "--loss-weight"), source="flags")
    except WeightError as exc:
        raise UsageError(str(exc)) from None


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    log = setup_logging(COMPONENT, args)
    flags = _weights(args)
    if not 0 <= args.port <= 65535:
        raise UsageError("--port %d: not a port" % args.port)
    if args.max_body_bytes < 1024:
        raise UsageError("--max-body-bytes %d: too small" % args.max_body_bytes)
    if args.max_connections < 2:
        raise UsageError("--max-connections %d: at least 2 (the scheduler and a probe)" % args.max_connections)
    for flag, value in (("--idle-timeout", args.idle_timeout), ("--request-timeout", args.request_timeout)):
        if not value > 0:
            raise UsageError("%s %s: must be more than 0" % (flag, value))
    if bool(args.tls_cert) != bool(args.tls_key):
        raise UsageError("--tls-cert and --tls-key go together")
    context = None
    if args.tls_cert:
        try:
            context = tls_context(args.tls_cert, args.tls_key)
        except (OSError, ValueError) as exc:
            raise UsageError("--tls-cert/--tls-key: %s" % exc) from None
    namespace = args.namespace or _namespace_default()

    api = None
    try:
        api = kube_api_client(args.kubeconfig)
    except UsageError as exc:
        if args.kubeconfig:
            raise
        log.warning("no Kubernetes API (%s): weights stay at the flags, nodeCacheCapable: true requests "
                    "cannot be served", exc)

    # A request thread that wants the GIL back (after each socket read or write) while the node
    # watch runs Python code waits up to the switch interval, 5 ms by default: the size of the whole
    # latency target. 0.5 ms bounds that wait (docs/scale.md).
    sys.setswitchinterval(SWITCH_INTERVAL)
    stop = stop_event()
    metrics = ExtenderMetrics()
    states = StateCache()
    weights = WeightsHolder(flags, metrics, log, namespace, args.configmap)
    nodes = NodeCache(states, metrics, log) if (args.node_cache and api is not None) else None
    if args.node_cache and api is None:
        metrics.cache_synced.set(0)
    service = ExtenderService(weights, metrics, log, nodes=nodes, states=states)
    try:
        server = ExtenderHTTPServer((args.address, args.port), service, metrics, log,
                                    max_body_bytes=args.max_body_bytes, ssl_context=context,
                                    max_connections=args.max_connections, idle_timeout=args.idle_timeout,
                                    request_timeout=args.request_timeout)
    except OSError as exc:
        raise UsageError("cannot listen on %s:%d: %s" % (args.address or "*", args.port, exc)) from None

    watches: List[ListWatch] = []
    if api is not None:
        watches.append(list_watch("configmap", configmap_source(api, namespace, args.configmap), weights,
                                  metrics, log, resync_seconds=args.resync_seconds).start())
        if nodes is not None:
            watches.append(list_watch("nodes", node_source(api), nodes, metrics, log,
                                      resync_seconds=args.resync_seconds, settle_gc=True).start())

    serving = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.5}, name="http",
                               daemon=True)
    serving.start()
    log.info("serving %s on %s:%d (scoreWeight=%s lossWeight=%s, ConfigMap %s/%s, node cache %s)",
             "HTTPS" if context else "HTTP", args.address or "*", server.port, flags.score, flags.loss,
             namespace, args.configmap, "on" if nodes is not None else "off")
    stop.wait()
    log.info("stopping: finishing requests in progress")
    clean = server.graceful_stop(args.shutdown_timeout)
    for watch in watches:
        watch.stop()
    log.info("stopped%s", "" if clean else " (some requests were cut off)")
    return 0


if __name__ == "__main__":
    run_main(COMPONENT, lambda: main(sys.argv[1:]))
