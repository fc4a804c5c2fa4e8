# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""gpu-exporter: Prometheus metrics of a node's MetaX GPUs, per GPU, VF and pod.

Run as::

    python -m ansible_collections.metax.gpu.plugins.module_utils.agents.gpu_exporter \\
        --host-root /host [--interval 15] [--port 9401] [--node-name NODE]

Serves ``/metrics`` (docs/metrics.md lists every metric: ``metax_gpu_*`` and,
beside them, the families of MetaX's own mx-exporter, ``mx_gpu_usage``,
``mx_memory_used{type="vram"}`` ..., for dashboards made for the real
product) and ``/healthz``.
A scrape is answered from the latest reading; when that is older than
``--interval`` the scrape starts the next one (mx-smi ``-j`` where the
version has it, the ``mx-smi`` table, and the kubelet's pod-resources API
for the namespace/pod/container of each assigned device) and waits for it at
most ``--scrape-wait`` seconds. So mx-smi runs at most once per interval
whatever the number of scrapers, and a slow or failing mx-smi shows as
``metax_gpu_exporter_mx_smi_up 0``, a growing
``metax_gpu_exporter_reading_age_seconds`` and a log line, never as a hung
scrape. ``/healthz`` is 200 while the HTTP server runs; a node without GPUs
or mx-smi is reported in the metrics, not by restarting the pod.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from typing import Callable, Mapping, Optional, Sequence, Tuple

from ..kubelet import constants as C
from ..kubelet.metrics import MetricsServer
from ..kubelet.podresources import HAS_GRPC, PodResourcesClient
from ..health.eid import DEFAULT_LOG_FILES, DEFAULT_PATTERN, EidTracker, PatternError
from ..exporter.cache import SharedReading
from ..exporter.collect import NodeReader
from ..exporter.readings import Owner, Reading
from ..exporter.render import ExporterState, render
from ..names import RESOURCE_NAME
from .common import (UsageError, add_common_flags, checked_host_root, positive_float, run_main, setup_logging,
                     stop_event, tcp_port)

COMPONENT = "gpu-exporter"
LOG = logging.getLogger(COMPONENT)
DEFAULT_PORT = 9401            # next to gpu-device's 9400
DEFAULT_INTERVAL = 15.0        # Prometheus' usual scrape interval


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpu-exporter", description="Prometheus metrics of MetaX GPUs.")
    add_common_flags(parser)
    parser.add_argument("--node-name", default=os.environ.get("NODE_NAME", ""),
                        help="the node label of every series (default: $NODE_NAME, from the downward API)")
    parser.add_argument("--address", default="0.0.0.0",
                        help="listen address (default %(default)s: every address of the pod's own network "
                             "namespace, its pod IP and loopback; docs/security.md)")
    parser.add_argument("--port", type=tcp_port, default=DEFAULT_PORT,
                        help="port of /metrics and /healthz (default %(default)s)")
    parser.add_argument("--interval", type=positive_float, default=DEFAULT_INTERVAL,
                        help="seconds a reading is served before mx-smi runs again; set it to the "
                             "scrape interval (default %(default)s)")
    parser.add_argument("--mx-smi-timeout", type=positive_float, default=None,
                        help="seconds one reading may take, all mx-smi runs together "
                             "(default: half the interval, at least 5, at most 10)")
    parser.add_argument("--scrape-wait", type=positive_float, default=None,
                        help="seconds a scrape waits for a reading in progress before it serves the "
                             "previous one (default: the mx-smi timeout + 1, at most 10)")
    parser.add_argument("--pod-resources-socket", default=C.POD_RESOURCES_SOCKET,
                        help="the kubelet's pod-resources socket; '' = no pod labels (default %(default)s)")
    parser.add_argument("--eid-pattern", default=DEFAULT_PATTERN,
                        help="the EID pattern of the kernel log: a regex with (?P<eid>...), optionally (?P<bdf>...) "
                             "and (?P<sdk>...) (default: the simulator's form; docs/health.md)")
    parser.add_argument("--kernel-log", action="append", default=None,
                        help="kernel log file under the host root, repeatable; the first that exists is read "
                             "(default: %s; '' turns EIDs off)" % ", ".join(DEFAULT_LOG_FILES))
    parser.add_argument("--resource-name", default=RESOURCE_NAME, help=argparse.SUPPRESS)
    return parser


def pod_resources_reader(socket_path: str, resource_name: str) -> Callable[[], Mapping[str, Owner]]:
    """device ID (its BDF) -> (namespace, pod, container), from the kubelet."""
    client = PodResourcesClient(socket_path)

    def allocations() -> Mapping[str, Owner]:
        if not os.path.exists(socket_path):
            raise OSError("%s does not exist" % socket_path)
        return client.list_allocated(resource_name)

    return allocations


class Exporter:
    """The shared reading and its exposition; ``exposition()`` is what every scrape calls."""

    def __init__(self, reader: NodeReader, node: str, interval: float, wait: float) -> None:
        self.reader = reader
        self.node = node
        self.cache: SharedReading[Reading] = SharedReading(reader.read, interval, wait)
        self._lock = threading.Lock()
        self.scrapes = 0

    def exposition(self) -> bytes:
        with self._lock:
            self.scrapes += 1
            scrapes = self.scrapes
        reading = self.cache.get()
        state = ExporterState(runs=self.reader.runs.snapshot(), readings=self.cache.started, scrapes=scrapes,
                              age_seconds=self.cache.age())
        return render(self.node, reading, state).encode("utf-8")

    def health(self) -> Tuple[bool, str]:
        return True, "ok"


def timeouts(interval: float, timeout: Optional[float], wait: Optional[float]) -> Tuple[float, float]:
    """(reading timeout, scrape wait) from the flags: both well under a scrape's usual 10s limit."""
    # half the interval, but never below what a busy node's mx-smi needs
    read = timeout if timeout is not None else min(10.0, max(5.0, interval / 2.0))
    return read, wait if wait is not None else min(10.0, read + 1.0)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(COMPONENT, args)
    host = checked_host_root(args, "sys/bus/pci/devices")
    node = args.node_name or os.uname()[1]
    read_timeout, wait = timeouts(args.interval, args.mx_smi_timeout, args.scrape_wait)
    allocations = None
    if args.pod_resources_socket and HAS_GRPC:
        allocations = pod_resources_reader(args.pod_resources_socket, args.resource_name)
    elif args.pod_resources_socket:
        LOG.warning("grpcio and protobuf are missing (requirements/agents.txt): no namespace/pod/container labels")
    files = [f for f in (args.kernel_log if args.kernel_log is not None else DEFAULT_LOG_FILES) if f]
    try:
        eids = EidTracker(host.path, args.eid_pattern, files) if files else None
    except PatternError as exc:
        raise UsageError("--eid-pattern: %s" % exc)
    exporter = Exporter(NodeReader(host, read_timeout, allocations, eids=eids), node, args.interval, wait)
    try:
        server = MetricsServer(exporter, args.address, args.port, exporter.health)
    except OSError as exc:
        raise UsageError("--port %d: %s" % (args.port, exc.strerror or exc))
    stop = stop_event()
    exporter.cache.start_if_due()       # the first reading before the first scrape
    server.start()
    LOG.info("gpu-exporter serving /metrics and /healthz on %s:%d", args.address, server.port,
             extra={"fields": {"node": node, "host_root": host.path, "interval": args.interval,
                               "mx_smi_timeout": read_timeout, "scrape_wait": wait,
                               "pod_resources": args.pod_resources_socket if allocations else ""}})
    stop.wait()
    LOG.info("stopping")
    server.stop()
    return 0


if __name__ == "__main__":
    run_main(COMPONENT, lambda: main(sys.argv[1:]))
