# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""gpu-device: the kubelet device plugin for ``metax-tech.com/gpu`` (manual 2.2.1).

Run as::

    python -m ansible_collections.metax.gpu.plugins.module_utils.agents.gpu_device \\
        --host-root /host [--host-prefix /] [--healthy-interval 5] [--node-name NODE] \\
        [--cdi-mode auto|cdi|devices] [--cdi-spec-dir /var/run/cdi] [--maca-root /opt/maca]

It serves the DevicePlugin API on ``<device-plugin-dir>/metax-gpu-<random>.sock``,
registers with the kubelet and re-registers within a second or two when the
kubelet restarts (its socket recreated, or ours removed); checks GPU health
every ``--healthy-interval`` seconds; learns allocations from the kubelet's
pod-resources API and publishes the node annotations (retried in the
background while the apiserver is away); serves ``/metrics`` and
``/healthz``. docs/agents.md lists every flag and metric.

``--cdi-mode`` (docs/runtime.md): ``cdi`` answers ``Allocate`` with CDI names
and keeps the node's spec in ``--cdi-spec-dir`` current; ``devices`` answers
with device nodes, the MACA mount and its environment; ``auto`` (the default)
picks ``cdi`` when the node's runtime reads CDI (``cdi.mode``), judged from
the Node's ``status.nodeInfo.containerRuntimeVersion`` and the runtime's
configuration under the host root.

``--health-policy`` (docs/health.md): every health reading also goes through
the health policy (``health/``): ECC, PCI events, RAS, MetaXLink AER, EIDs
and the GPU state besides the four checks; the GPUs a row holds out leave
Allocatable, and the node's ``MetaXGPUHealthy`` condition, the quarantine
taint and an Event per transition tell the cluster.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, FrozenSet, List, Optional, Sequence

from ..deviceplugin import constants as C
from ..deviceplugin.annotations import AnnotationPublisher, kube_node_annotations, kube_node_patcher, node_annotations
from ..deviceplugin.devices import DeviceState, Snapshot, health_transitions
from ..deviceplugin.containers import reading_discovery
from ..deviceplugin.metrics import DevicePluginMetrics
from ..kubelet.metrics import MetricsServer
from ..kubelet.podresources import PodResourcesClient, PodResourcesError
from ..kubelet.registration import RegistrationError, register, socket_identity
from ..deviceplugin.server import HAS_GRPC, DevicePluginService, PluginServer
from ..deviceplugin.cdi import SpecSync
from ..backoff import Backoff
from ..cdi.mode import MODE_AUTO, MODE_CDI, MODE_DEVICES, MODES, Decision, containerd_cdi_setting, decide, \
    docker_cdi_setting, parse_runtime
from ..cdi.writer import MACA_ROOT
from ..host import HostRoot, HostRootError
from ..names import CDI_SPEC_DIR
from ..names import NAMESPACE, RESOURCE_NAME
from ..health.monitor import HealthMonitor
from ..health.node import NodeHealthWriter
from ..kube.client import core_v1
from .common import (UsageError, add_common_flags, checked_host_root, kube_api_client, node_runtime_version,
                     non_negative_int, positive_float, process_age, run_main, setup_logging, stop_event, tcp_port)

COMPONENT = "gpu-device"
LOG = logging.getLogger(COMPONENT)

# How often the registration supervisor looks at the two sockets.
WATCH_SECONDS = 0.5
DEFAULT_METRICS_PORT = 9400


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpu-device", description="MetaX GPU device plugin for the kubelet (metax-tech.com/gpu).")
    add_common_flags(parser)
    parser.add_argument("--device-plugin-dir", default=C.DEVICE_PLUGIN_DIR,
                        help="the kubelet's device-plugin directory (default %(default)s)")
    parser.add_argument("--pod-resources-socket", default=C.POD_RESOURCES_SOCKET,
                        help="the kubelet's pod-resources socket (default %(default)s)")
    parser.add_argument("--healthy-interval", type=non_negative_int, default=5,
                        help="seconds between GPU health checks; 0 disables them (default %(default)s)")
    parser.add_argument("--pod-resources-interval", type=positive_float, default=2.0,
                        help="seconds between pod-resources polls (default %(default)s)")
    parser.add_argument("--node-name", default=os.environ.get("NODE_NAME", ""),
                        help="this node's name, for the annotations (default: $NODE_NAME)")
    parser.add_argument("--metrics-address", default="0.0.0.0",
                        help="address of the /metrics and /healthz endpoint (default %(default)s: every "
                             "address of the pod's own network namespace; docs/security.md)")
    parser.add_argument("--metrics-port", type=tcp_port, default=DEFAULT_METRICS_PORT,
                        help="port of /metrics and /healthz; 0 disables it (default %(default)s)")
    parser.add_argument("--cdi-mode", default=MODE_AUTO, choices=MODES,
                        help="Allocate answers with CDI names (cdi), with device nodes and mounts (devices), "
                             "or whichever the node's runtime reads (auto, the default)")
    parser.add_argument("--cdi-spec-dir", default=CDI_SPEC_DIR,
                        help="where the node's CDI spec is written in CDI mode (default %(default)s)")
    parser.add_argument("--maca-root", default=MACA_ROOT,
                        help="the host's MXMACA, under the host root ('' = devices only; default %(default)s)")
    parser.add_argument("--health-policy", default="",
                        help="the health policy, a JSON file (the chart's ConfigMap; '' or absent: the shipped "
                             "defaults; read again when it changes; docs/health.md)")
    parser.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE", NAMESPACE),
                        help="namespace of the health Events (default: $POD_NAMESPACE, else %(default)s)")
    parser.add_argument("--resource-name", default=RESOURCE_NAME, help=argparse.SUPPRESS)
    return parser


# The runtime's configuration files, under the host root, in the order the
# runtime reads them (containerd: config.toml, then its conf.d imports).
CONTAINERD_CONFIG = "etc/containerd/config.toml"
CONTAINERD_DROPINS = "etc/containerd/conf.d"
DOCKER_DAEMON_JSON = "etc/docker/daemon.json"


def runtime_cdi_setting(host: HostRoot, runtime_version: Optional[str]) -> Optional[bool]:
    """The runtime's own CDI switch as its configuration under the host root sets it (None: unset/unknown)."""
    runtime = parse_runtime(runtime_version or "")
    try:
        if runtime is not None and runtime.name == "containerd":
            texts = [host.read_text(CONTAINERD_CONFIG)] if host.exists(CONTAINERD_CONFIG) else []
            if host.isdir(CONTAINERD_DROPINS):
                texts += [host.read_text("%s/%s" % (CONTAINERD_DROPINS, name))
                          for name in sorted(host.listdir(CONTAINERD_DROPINS)) if name.endswith(".toml")]
            return containerd_cdi_setting(texts)
        if runtime is not None and runtime.name == "docker" and host.exists(DOCKER_DAEMON_JSON):
            return docker_cdi_setting(host.read_text(DOCKER_DAEMON_JSON))
    except (HostRootError, OSError) as exc:
        LOG.warning("cannot read the runtime's configuration: %s", exc)
    return None


def choose_mode(override: str, host: HostRoot, runtime_version: Optional[str]) -> Decision:
    """The I/O edge of :func:`cdi.mode.decide`: the runtime's configuration read only when it matters."""
    enabled = runtime_cdi_setting(host, runtime_version) if override == MODE_AUTO else None
    return decide(override, runtime_version, enabled)


@dataclass(frozen=True)
class ApiSide:
    """What gpu-device needs the API server for, made after its first registration: the node
    annotations' ``patch`` and ``read`` and, when the mode follows the Node's runtime, ``decide``,
    which reads the Node and returns Allocate's mode (None: the mode was decided before)."""

    patch: Optional[Callable[..., Any]] = None
    read: Optional[Callable[..., Any]] = None
    decide: Optional[Callable[[], str]] = None
    health_writer: Optional[NodeHealthWriter] = None     # the node's health condition, taint and Events


class GpuDeviceAgent:
    """Every moving part of gpu-device; :meth:`run` until ``stop`` is set.

    ``mode`` None: Allocate's mode comes from ``connect``, which :meth:`run` calls once
    the first registration was tried, so the kubelet learns the devices before the
    kubernetes client is set up and the Node read (seconds on a loaded node: a new pod
    after a vfnum change, docs/operator.md "driver-config")."""

    def __init__(self, host: HostRoot, device_plugin_dir: str, healthy_interval: int = 5,
                 pod_resources_socket: Optional[str] = C.POD_RESOURCES_SOCKET,
                 pod_resources_interval: float = 2.0, patch=None, stop: Optional[threading.Event] = None,
                 resource_name: str = RESOURCE_NAME, metrics: Optional[DevicePluginMetrics] = None,
                 mode: Optional[str] = MODE_DEVICES, spec_sync: Optional[SpecSync] = None, read=None,
                 connect: Optional[Callable[[], ApiSide]] = None, health_policy: Optional[str] = None) -> None:
        self.host = host
        self.dir = device_plugin_dir
        self.kubelet_socket = os.path.join(device_plugin_dir, C.KUBELET_SOCKET_NAME)
        self.healthy_interval = healthy_interval
        self.pod_resources_socket = pod_resources_socket
        self.pod_resources_interval = pod_resources_interval
        self.resource_name = resource_name
        self.stop = stop or threading.Event()
        self.metrics = metrics or DevicePluginMetrics()
        # GPUs handed to VMs (vfio-pci) are vfio-manager's, not ours (deviceplugin/containers.py)
        self.state = DeviceState(host, check_health=healthy_interval > 0, discover_fn=reading_discovery())
        # the health policy on top of the four checks (health/monitor.py); off with the checks
        self.health_monitor = HealthMonitor(host, health_policy) if healthy_interval > 0 else None
        # devices mode still needs the host's MACA (its mount); only CDI mode writes the spec
        self.spec_sync = spec_sync or SpecSync(host, maca_root=None)
        self.service = DevicePluginService(self.state, host, self.metrics, mode, self.spec_sync)
        self.server = PluginServer(self.service, device_plugin_dir)
        self.allocated: FrozenSet[str] = frozenset()
        self._lock = threading.Lock()
        self.registered_with: Optional[tuple] = None   # kubelet socket identity we registered with
        self.registrations = 0
        self.last_registration: Optional[float] = None
        self.publisher: Optional[AnnotationPublisher] = None
        if patch is not None:
            self._publish(patch, read)
        self._connect = connect
        self._threads: List[threading.Thread] = []
        self._logged_warnings: FrozenSet[str] = frozenset()

    def _publish(self, patch, read) -> None:
        self.publisher = AnnotationPublisher(self.annotations, patch, self.stop,
                                             on_result=self._patch_result, read=read)

    def connect_api(self) -> None:
        """The API side (:class:`ApiSide`), once: the annotation publisher, and the Allocate mode
        decided in a thread of its own (the Node read waits for an apiserver that is away, while
        the registration loop goes on and the publisher retries)."""
        if self._connect is None:
            return
        side = self._connect()
        self._connect = None
        if side.patch is not None:
            self._publish(side.patch, side.read)
        if side.health_writer is not None and self.health_monitor is not None:
            self.health_monitor.attach(side.health_writer)
        if side.decide is not None:
            decide = side.decide
            self._start_thread(lambda: self.set_mode(decide()), "mode")

    @property
    def mode(self) -> Optional[str]:
        """Allocate's mode, as the service holds it (None until decided)."""
        return self.service.mode

    def set_mode(self, mode: str) -> None:
        self.service.set_mode(mode)
        self.sync_spec()

    # -- state shared with the annotation publisher ---------------------
    def annotations(self):
        with self._lock:
            allocated = self.allocated
        return node_annotations(self.state.snapshot(), allocated)

    def _patch_result(self, ok: bool) -> None:
        self.metrics.patches.labels("ok" if ok else "error").inc()

    def _devices_changed(self, before: Optional[Snapshot]) -> None:
        snap = self.state.snapshot()
        if before is not None:
            for dev_id, healthy in health_transitions(before, snap):
                if healthy:
                    LOG.info("device %s is Healthy", dev_id)
                else:
                    LOG.warning("device %s is Unhealthy", dev_id)
        self.metrics.set_devices((d.id, d.healthy) for d in snap.devices)
        if self.publisher:
            self.publisher.trigger()

    def sync_spec(self) -> None:
        """CDI mode: the node's spec follows the advertised devices and the host's MACA."""
        if self.mode != MODE_CDI:
            return
        try:
            result = self.spec_sync.sync(self.state.snapshot())
        except OSError as exc:
            LOG.warning("cannot write the CDI spec %s: %s", self.spec_sync.path, exc)
            return
        if result.changed:
            LOG.info("CDI spec %s rewritten: %d name(s)", self.spec_sync.path, len(result.names),
                     extra={"fields": {"cdi_names": result.names}})

    def _report_warnings(self) -> None:
        """Log each discovery warning when it first appears (not on every scan); export the counts."""
        current = self.state.warnings
        for warning in current:
            if warning not in self._logged_warnings:
                LOG.warning("%s", warning, extra={"fields": {
                    "mx_smi_unparsed": warning in self.state.unparsed}})
        self._logged_warnings = frozenset(current)
        self.metrics.discovery_warnings.set(len(current))
        self.metrics.mx_smi_unparsed.set(len(self.state.unparsed))

    # -- loops ----------------------------------------------------------
    def health_loop(self) -> None:
        while not self.stop.wait(self.healthy_interval):
            before = self.state.snapshot()
            changed = self.state.refresh()
            changed = self.apply_health_policy() or changed
            self._report_warnings()
            if changed:
                self._devices_changed(before)
            # every scan, not only on a change of the list: a MACA switch changes no device
            self.sync_spec()

    def apply_health_policy(self) -> bool:
        """The policy's reading after a scan: GPUs it holds leave Allocatable; True when the list changed."""
        if self.health_monitor is None or self.state.latest is None:
            return False
        decision = self.health_monitor.step(self.state.latest, self.state.lost_gpus())
        return self.state.hold(decision.unhealthy_gpus)

    def pod_resources_loop(self) -> None:
        socket_path = self.pod_resources_socket
        if not socket_path:     # the loop is started only with a socket; keep the type honest
            return
        client = PodResourcesClient(socket_path)
        backoff = Backoff(initial=self.pod_resources_interval, cap=30.0)
        failing = False
        delay = 0.0
        try:
            while not self.stop.wait(delay):
                delay = self.pod_resources_interval
                try:
                    if not os.path.exists(socket_path):
                        raise PodResourcesError("%s does not exist yet" % self.pod_resources_socket)
                    allocations = client.list_allocated(self.resource_name)
                except PodResourcesError as exc:
                    delay = backoff.next_delay()
                    if not failing:
                        LOG.warning("cannot read allocations from the kubelet (retrying): %s", exc)
                    failing = True
                    continue
                if failing:
                    LOG.info("reading allocations from %s again", self.pod_resources_socket)
                failing = False
                backoff.reset()
                ids = frozenset(allocations)
                with self._lock:
                    changed = ids != self.allocated
                    self.allocated = ids
                if changed:
                    LOG.info("allocated devices: %s", ",".join(sorted(ids)) or "none",
                             extra={"fields": {"allocations": {k: "/".join(v) for k, v in allocations.items()}}})
                    self.metrics.allocated.set(len(ids))
                    if self.publisher:
                        self.publisher.trigger()
        finally:
            client.close()

    def _start_thread(self, target, name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def registration_step(self, backoff: Backoff, why_waiting: list) -> float:
        """One look at the sockets; returns how long to wait before the next."""
        kubelet = socket_identity(self.kubelet_socket)
        if kubelet is None:
            if self.registered_with is not None:
                LOG.warning("%s is gone: the kubelet stopped; waiting for it", self.kubelet_socket)
                self.registered_with = None
            if not why_waiting or time.monotonic() >= why_waiting[0]:
                LOG.info("waiting for the kubelet: %s does not exist", self.kubelet_socket)
                why_waiting[:] = [time.monotonic() + backoff.next_delay()]
            return WATCH_SECONDS
        why_waiting[:] = []
        if kubelet == self.registered_with and self.server.socket_present():
            return WATCH_SECONDS
        if self.registered_with is not None:
            LOG.warning("the kubelet restarted (%s): registering again",
                        "its socket was recreated" if kubelet != self.registered_with else "our socket was removed")
        started = time.monotonic()
        try:
            if not self.server.socket_present():
                self.server.start()
            if self.server.endpoint is None:
                raise RegistrationError("the device-plugin server has no socket")
            register(self.kubelet_socket, self.server.endpoint, self.resource_name)
        except (RegistrationError, OSError) as exc:
            delay = backoff.next_delay()
            LOG.warning("registration failed (retrying in %.1fs): %s", delay, exc)
            self.registered_with = None
            return delay
        backoff.reset()
        self.registered_with = kubelet
        self.registrations += 1
        self.last_registration = time.monotonic()
        self.metrics.registrations.inc()
        LOG.info("registered with the kubelet in %.3fs", time.monotonic() - started)
        return WATCH_SECONDS

    def first_scan(self) -> None:
        """The devices as the kubelet first hears of them: scanned, and held where the policy says.

        The policy's first reading comes before the registration: a restarted agent must not
        offer a GPU its policy holds for a health interval (a pending pod would land on it)."""
        self.state.refresh()
        self.apply_health_policy()
        snap = self.state.snapshot()
        LOG.info("found %d MetaX device(s), %d healthy", len(snap.devices), len(snap.healthy_ids),
                 extra={"fields": {"devices": [d.id for d in snap.devices]}})
        self._report_warnings()
        self._devices_changed(None)
        self.sync_spec()

    def run(self) -> int:
        if not os.path.isdir(self.dir):
            LOG.warning("%s does not exist yet; waiting for the kubelet to create it", self.dir)
        self.first_scan()
        backoff = Backoff(initial=1.0, cap=10.0)
        why_waiting: list = []
        # the kubelet first: the API side after (the client, the Node read)
        delay = self.registration_step(backoff, why_waiting)
        self.connect_api()
        if self.healthy_interval > 0:
            self._start_thread(self.health_loop, "health")
        else:
            LOG.info("health checks disabled (--healthy-interval 0): devices stay Healthy")
        if self.pod_resources_socket:
            self._start_thread(self.pod_resources_loop, "pod-resources")
        if self.publisher:
            self.publisher.start()
        while not self.stop.wait(delay):
            delay = self.registration_step(backoff, why_waiting)
        LOG.info("stopping")
        self.server.stop()
        self.state.wake()
        if self.publisher:
            self.publisher.join()
        for thread in self._threads:
            thread.join(5.0)
        return 0

    def health(self):
        """(ok, reason) for /healthz: serving and registered with a live kubelet."""
        if not self.server.running:
            return False, "device plugin server not running"
        if self.registered_with is None:
            return False, "not registered with the kubelet"
        return True, "ok"


def log_mode(decision: Decision, runtime_version: Optional[str]) -> str:
    LOG.info("Allocate mode %s: %s", decision.mode, decision.reason,
             extra={"fields": {"cdi_mode": decision.mode, "runtime": runtime_version}})
    return decision.mode


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(COMPONENT, args)
    if not HAS_GRPC:
        raise UsageError("grpcio and protobuf are required (requirements/agents.txt)")
    host = checked_host_root(args, "sys/bus/pci/devices")
    if os.path.exists(args.device_plugin_dir) and not os.path.isdir(args.device_plugin_dir):
        raise UsageError("--device-plugin-dir %s is not a directory" % args.device_plugin_dir)
    stop = stop_event()
    client = None
    if args.node_name:
        client = kube_api_client(args.kubeconfig)    # a bad --kubeconfig still fails at once
    else:
        LOG.warning("no --node-name (or NODE_NAME): the node annotations are not published")
    mode: Optional[str] = None
    if client is None or args.cdi_mode != MODE_AUTO:
        mode = log_mode(choose_mode(args.cdi_mode, host, None), None)

    def decide() -> str:
        runtime_version = node_runtime_version(client, args.node_name)
        return log_mode(choose_mode(args.cdi_mode, host, runtime_version), runtime_version)

    def connect() -> ApiSide:
        # after the first registration (GpuDeviceAgent.run): the Node read may wait for the apiserver
        return ApiSide(kube_node_patcher(client, args.node_name), kube_node_annotations(client, args.node_name),
                       decide if mode is None else None,
                       NodeHealthWriter(core_v1(client), args.node_name, args.namespace, time.time))
    spec_sync = SpecSync(host, args.cdi_spec_dir, args.maca_root or None)
    agent = GpuDeviceAgent(host, args.device_plugin_dir, args.healthy_interval, args.pod_resources_socket,
                           args.pod_resources_interval, stop=stop, resource_name=args.resource_name,
                           mode=mode, spec_sync=spec_sync, connect=connect if client is not None else None,
                           health_policy=args.health_policy or None)
    metrics_server = None
    if args.metrics_port:
        try:
            metrics_server = MetricsServer(agent.metrics, args.metrics_address, args.metrics_port, agent.health)
        except OSError as exc:
            raise UsageError("--metrics-port %d: %s" % (args.metrics_port, exc.strerror or exc))
        metrics_server.start()
        LOG.info("serving /metrics and /healthz on %s:%d", args.metrics_address, metrics_server.port)
    # how long the process took to get here (interpreter, imports, the Node read): the part of a
    # new pod's way to registration that the pod's API times cannot show (docs/operator.md)
    age = process_age()
    LOG.info("gpu-device starting%s", "" if age is None else ", %.2f s after its process began" % age,
             extra={"fields": {
                 "host_root": host.path, "host_prefix": host.host_prefix, "device_plugin_dir": args.device_plugin_dir,
                 "healthy_interval": args.healthy_interval, "node": args.node_name, "since_start": age}})
    try:
        return agent.run()
    finally:
        if metrics_server is not None:
            metrics_server.stop()


if __name__ == "__main__":
    run_main(COMPONENT, lambda: main(sys.argv[1:]))
