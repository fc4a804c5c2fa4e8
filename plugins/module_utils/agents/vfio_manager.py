# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""vfio-manager: GPUs for virtual machines, the GPU Operator's ``vfioManager`` component (issue 43).

Run as::

    python -m ansible_collections.metax.gpu.plugins.module_utils.agents.vfio_manager \\
        --host-root /host [--host-prefix /] --node-name NODE [--namespace metax-operator] \\
        [--config-map driver-config] [--interval 10] [--evict-in-use]

Each round reads ``driver-config``'s ``vfio`` entry (names.DRIVER_CONFIG_VFIO_KEY: a YAML list
of ``{nodeName, gpus}``, as a real 0.9.2 install carries it) and brings its node's GPUs to it
through the same node operation as ``metax.gpu.gpu_passthrough`` (vfio/): the GPUs named go to
``vfio-pci``, every other GPU held for VMs comes back to the MetaX driver with its vfnum. A GPU
in use (a process holding its device nodes, a pod the kubelet allocated it to) is refused, and
nothing changes, unless ``--evict-in-use`` (then its pods are evicted first). A refusal or
failure is an Event and the node annotation ``metax-tech.com/vfio.message``, retried with
backoff.

It serves ``metax-tech.com/vfio-gpu`` (deviceplugin/vfio.py): one device per IOMMU group.

On a node without IOMMU it writes the vendor's Event (``IOMMUDisabled``, the vendor's words)
once, marks the node (annotation ``metax-tech.com/vfio.iommu: disabled``, from which the
operator's controller names the node in the CR's condition), advertises ``vfio-gpu: 0`` and
stays running and quiet: never the vendor's crash loop. The container pool is not touched.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, cast

from .. import names
from ..backoff import Backoff
from ..deviceplugin import constants as C
from ..deviceplugin.server import HAS_GRPC, PluginServer
from ..deviceplugin.vfio import GroupState, VfioPluginService
from ..errors import MetaxGpuError
from ..host import HostRoot
from ..kube import evict as kube_evict
from ..kube.node import patch_metadata
from ..kubelet.podresources import PodResourcesClient, PodResourcesError
from ..kubelet.registration import RegistrationError, register, socket_identity
from ..vfio import backend
from ..vfio.config import node_selection
from ..vfio.plan import IOMMU_DISABLED_MESSAGE, PassthroughError, reconcile
from .common import (UsageError, add_common_flags, checked_host_root, kube_api_client, positive_float, run_main,
                     setup_logging, stop_event)

try:
    import yaml
    HAS_YAML = True
except ImportError:      # the agent image has it (requirements/agents.txt)
    yaml = None
    HAS_YAML = False

COMPONENT = "vfio-manager"
LOG = logging.getLogger(COMPONENT)
IOMMU_DISABLED_REASON = "IOMMUDisabled"
# how long a round waits for evicted pods to leave before it retries later
EVICT_TIMEOUT = 30.0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=COMPONENT, description="MetaX GPUs for virtual machines "
                                     "(vfio-pci, metax-tech.com/vfio-gpu).")
    add_common_flags(parser)
    parser.add_argument("--node-name", default=os.environ.get("NODE_NAME", ""),
                        help="this node's name (default: $NODE_NAME)")
    parser.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE", names.OPERATOR_NAMESPACE),
                        help="namespace of the ConfigMap and the Events (default: $POD_NAMESPACE or %(default)s)")
    parser.add_argument("--config-map", default=names.DRIVER_CONFIGMAP,
                        help="ConfigMap whose '%s' key lists the GPUs for VMs (default %%(default)s)"
                        % names.DRIVER_CONFIG_VFIO_KEY)
    parser.add_argument("--interval", type=positive_float, default=10.0,
                        help="seconds between rounds (default %(default)s)")
    parser.add_argument("--evict-in-use", action="store_true",
                        help="evict the pods holding a GPU to hand over (default: refuse while in use)")
    parser.add_argument("--device-plugin-dir", default=C.DEVICE_PLUGIN_DIR,
                        help="the kubelet's device-plugin directory (default %(default)s)")
    parser.add_argument("--pod-resources-socket", default=C.POD_RESOURCES_SOCKET,
                        help="the kubelet's pod-resources socket (default %(default)s)")
    parser.add_argument("--resource-name", default=names.VFIO_RESOURCE_NAME, help=argparse.SUPPRESS)
    return parser


def parse_entry(data: Mapping[str, str]) -> Any:
    """The parsed ``vfio`` value of the ConfigMap's data (None when absent)."""
    text = data.get(names.DRIVER_CONFIG_VFIO_KEY)
    if not text:
        return None
    if not HAS_YAML:
        raise PassthroughError("PyYAML is required to read driver-config's %s key" % names.DRIVER_CONFIG_VFIO_KEY)
    try:
        return yaml.safe_load(text)
    except Exception as exc:  # pylint: disable=broad-except  # yaml.YAMLError, without its types
        raise PassthroughError("driver-config %s is not YAML: %s" % (names.DRIVER_CONFIG_VFIO_KEY, exc))


class Kube:
    """The API calls vfio-manager makes (RBAC: configmaps get, nodes get/patch, events create,
    pods get, pods/eviction create)."""

    def __init__(self, api: Any, node: str, namespace: str, config_map: str) -> None:
        from ..kube.client import core_v1
        self.core = core_v1(api)
        self.node = node
        self.namespace = namespace
        self.config_map = config_map

    def config(self) -> Mapping[str, str]:
        from ..kube.client import ApiException
        try:
            found = self.core.read_namespaced_config_map(self.config_map, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return {}
            raise
        return found.get("data") or {}

    def annotate(self, annotations: Mapping[str, Optional[str]]) -> None:
        patch_metadata(self.core, self.node, annotations=annotations)

    def event(self, reason: str, message: str, warning: bool = True) -> None:
        """An Event about this node, in the components' namespace (``kubectl get events -n <namespace>``)."""
        from ..kube.client import ApiException
        now = datetime.datetime.now(datetime.timezone.utc).isoformat()
        body = {"metadata": {"generateName": "%s-%s." % (COMPONENT, self.node), "namespace": self.namespace},
                # the involvedObject names our namespace: the API server refuses an Event about a
                # cluster-scoped object outside "default" otherwise (as driver-manager's Events do)
                "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": self.node,
                                   "namespace": self.namespace},
                "reason": reason, "message": message[:1000], "type": "Warning" if warning else "Normal",
                "source": {"component": COMPONENT, "host": self.node},
                "firstTimestamp": now, "lastTimestamp": now, "count": 1}
        try:
            self.core.create_namespaced_event(self.namespace, body)
        except ApiException as exc:
            LOG.warning("cannot record event %s: %s", reason, exc.reason)

    def evict(self, pods: Sequence[str], timeout: float, holders: Callable[[], List[str]]) -> List[str]:
        """Evict these pods (policy/v1, never forced) and wait until ``holders`` (the kubelet's
        pod-resources: vfio-manager lists no pods) no longer names them; PassthroughError naming a
        refusal (a budget: at once, the next round retries), a denial or the pods still there."""
        try:
            return kube_evict.evict(self.core, self.node, timeout=timeout, retry_refused=False,
                                    holders=lambda: [p for p in holders() if p in pods])["evicted"]
        except kube_evict.EvictionError as exc:
            raise PassthroughError(str(exc))


class VfioManager:
    """One node's GPUs brought to its driver-config entry, round after round."""

    def __init__(self, host: HostRoot, kube: Any, node_name: str, evict_in_use: bool = False,
                 holders: Optional[Any] = None, groups: Optional[GroupState] = None) -> None:
        self.host = host
        self.kube = kube
        self.node_name = node_name
        self.evict_in_use = evict_in_use
        self.holders = holders            # () -> {device id: [namespace/pod]}; None: not known
        self.groups = groups
        self.iommu_reported: Optional[bool] = None
        self.message: Optional[str] = ""  # the failure annotation as last written ("" unknown)

    def round(self) -> str:
        """One reconciliation; returns what happened (``no-iommu``, ``unchanged``, ``applied``).
        Raises MetaxGpuError with the reason of a refusal or failure (reported by :meth:`report`)."""
        node = backend.read_node(self.host)
        self.report_iommu(node.iommu)
        selection = node_selection(parse_entry(self.kube.config()), self.node_name)
        if not node.iommu:
            if selection is not None and (selection.all or selection.indices):
                # said once, with the Event: the entry cannot be served here, nothing else to do
                LOG.debug("entry %s ignored: no IOMMU", selection.describe())
            return "no-iommu"
        wanted: List[int] = []
        if selection is not None:
            wanted = [g.index for g in node.gpus] if selection.all else list(selection.indices)
        plan = reconcile(node, wanted, self.node_name)
        if not plan.changed:
            backend.forget_settled(self.host)
            self.clear_message()
            return "unchanged"
        holders = self.holders() if self.holders is not None else {}
        reasons = backend.in_use(self.host, node, plan, holders)
        if reasons:
            pods = sorted({pod for device_pods in holders.values() for pod in device_pods})
            if not (self.evict_in_use and pods):
                hint = "" if self.evict_in_use else " (spec.driver.vfnumPolicy.evictInUse: true evicts the pods)"
                raise PassthroughError("refused, the GPUs are in use: %s%s" % ("; ".join(reasons), hint))
            LOG.info("evicting %s", ", ".join(pods))
            self.kube.evict(pods, EVICT_TIMEOUT, self.holder_pods)
            node = backend.read_node(self.host)
            plan = reconcile(node, wanted, self.node_name)
            reasons = backend.in_use(self.host, node, plan, self.holders() if self.holders is not None else {})
            if reasons:
                raise PassthroughError("refused after the eviction, still in use: %s" % "; ".join(reasons))
        results = backend.apply(self.host, plan)
        if self.groups is not None:
            self.groups.refresh()
        summary = ", ".join("GPU %s (%s) %s" % (r["index"], r["bdf"], "to vfio-pci" if r["action"] == "to-vm"
                                                else "back to metax, vfnum %s" % r["vfnum_after"]) for r in results)
        LOG.info("applied: %s", summary)
        self.kube.event("VfioApplied", summary, warning=False)
        self.clear_message()
        return "applied"

    def holder_pods(self) -> List[str]:
        """The pods holding any of the node's GPUs now (``namespace/name``), sorted."""
        holders = self.holders() if self.holders is not None else {}
        return sorted({pod for device_pods in holders.values() for pod in device_pods})

    def report_iommu(self, enabled: bool) -> None:
        if self.iommu_reported == enabled:
            return
        self.kube.annotate({names.ANNOTATION_VFIO_IOMMU: "enabled" if enabled else "disabled"})
        if not enabled:
            message = IOMMU_DISABLED_MESSAGE % self.node_name
            LOG.warning("%s: advertising %s 0 and staying idle", message, names.VFIO_RESOURCE_NAME)
            self.kube.event(IOMMU_DISABLED_REASON, message)
        self.iommu_reported = enabled

    def clear_message(self) -> None:
        if self.message is not None:
            self.kube.annotate({names.ANNOTATION_VFIO_MESSAGE: None})
            self.message = None

    def report(self, exc: Exception) -> None:
        text = str(exc)
        if text != self.message:
            LOG.warning("%s", text)
            self.kube.event("VfioFailed", text)
            self.kube.annotate({names.ANNOTATION_VFIO_MESSAGE: text[:1000]})
            self.message = text


def pod_holders(client: PodResourcesClient, host: HostRoot, resource_name: str) -> Dict[str, List[str]]:
    """Device ID (PCI address) -> pods holding it: metax-tech.com/gpu's devices are PCI addresses,
    vfio-gpu's are IOMMU groups (mapped to their functions' addresses)."""
    out: Dict[str, List[str]] = {}
    for device, (namespace, pod, _container) in client.list_allocated(names.RESOURCE_NAME).items():
        out.setdefault(device, []).append("%s/%s" % (namespace, pod))
    groups = {g.id: g.bdfs for g in backend.vm_groups(host)}
    for device, (namespace, pod, _container) in client.list_allocated(resource_name).items():
        for bdf in groups.get(device, ()):
            out.setdefault(bdf, []).append("%s/%s" % (namespace, pod))
    return out


class Registration:
    """The vfio-gpu plugin kept registered with the kubelet (again after its restart)."""

    def __init__(self, server: PluginServer, device_plugin_dir: str, resource_name: str) -> None:
        self.server = server
        self.kubelet_socket = os.path.join(device_plugin_dir, C.KUBELET_SOCKET_NAME)
        self.resource_name = resource_name
        self.registered_with: Optional[Tuple[Any, ...]] = None
        self.waiting_logged = False

    def step(self) -> None:
        kubelet = socket_identity(self.kubelet_socket)
        if kubelet is None:
            if not self.waiting_logged:
                LOG.info("waiting for the kubelet: %s does not exist", self.kubelet_socket)
                self.waiting_logged = True
            self.registered_with = None
            return
        self.waiting_logged = False
        if kubelet == self.registered_with and self.server.socket_present():
            return
        try:
            if not self.server.socket_present():
                self.server.start()
            if self.server.endpoint is None:
                raise RegistrationError("the device-plugin server has no socket")
            register(self.kubelet_socket, self.server.endpoint, self.resource_name, preferred_allocation=False)
        except (RegistrationError, OSError) as exc:
            LOG.warning("registration failed (retrying): %s", exc)
            self.registered_with = None
            return
        self.registered_with = kubelet
        LOG.info("registered %s with the kubelet", self.resource_name)


def run(manager: VfioManager, groups: GroupState, registration: Optional[Registration], stop: threading.Event,
        interval: float) -> int:
    """Rounds every ``interval`` seconds (failures back off up to 5 minutes); the plugin's
    registration and group scan every second. Never exits on a failure: a crash loop helps no one."""
    backoff = Backoff(initial=interval, cap=300.0)
    next_round = 0.0
    while not stop.is_set():
        groups.refresh()
        if registration is not None:
            registration.step()
        if time.monotonic() >= next_round:
            try:
                outcome = manager.round()
                backoff.reset()
                next_round = time.monotonic() + interval
                LOG.debug("round: %s", outcome)
            except MetaxGpuError as exc:
                manager.report(exc)
                next_round = time.monotonic() + backoff.next_delay()
            except Exception as exc:  # pylint: disable=broad-except  # the API client raises many kinds
                LOG.warning("round failed (retrying): %s", exc)
                next_round = time.monotonic() + backoff.next_delay()
        stop.wait(1.0)
    if registration is not None:
        registration.server.stop()
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(COMPONENT, args)
    if not HAS_GRPC:
        raise UsageError("grpcio and protobuf are required (requirements/agents.txt)")
    if not args.node_name:
        raise UsageError("--node-name (or NODE_NAME) is required: the driver-config entry is per node")
    host = checked_host_root(args, "sys/bus/pci/devices")
    client = kube_api_client(args.kubeconfig)
    stop = stop_event()
    groups = GroupState(host)
    service = VfioPluginService(groups, host, args.resource_name)
    # PluginServer serves any DevicePlugin servicer with stop() and resume() (its hint names gpu-device's)
    registration = Registration(PluginServer(cast(Any, service), args.device_plugin_dir), args.device_plugin_dir,
                                args.resource_name)
    pods = PodResourcesClient(args.pod_resources_socket)

    def holders() -> Dict[str, List[str]]:
        try:
            return pod_holders(pods, host, args.resource_name)
        except PodResourcesError as exc:
            raise PassthroughError("cannot tell which pods hold the GPUs (the kubelet's pod-resources): %s" % exc)

    kube = Kube(client, args.node_name, args.namespace, args.config_map)
    manager = VfioManager(host, kube, args.node_name, args.evict_in_use, holders, groups)
    LOG.info("vfio-manager starting", extra={"fields": {"host_root": host.path, "node": args.node_name,
                                                        "config_map": "%s/%s" % (args.namespace, args.config_map)}})
    try:
        return run(manager, groups, registration, stop, args.interval)
    finally:
        pods.close()


if __name__ == "__main__":
    run_main(COMPONENT, lambda: main(sys.argv[1:]))
