# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The DevicePlugin service of ``metax-tech.com/vfio-gpu`` (vfio-manager; kubelet API v1beta1).

One device per IOMMU group of MetaX GPUs bound to ``vfio-pci`` (its ID is the
group number, as KubeVirt's own PCI device plugin names them):

``ListAndWatch``  the groups, Healthy while every function of the group is on
                  vfio-pci and ``/dev/vfio/<group>`` exists; resent on change
``Allocate``      ``/dev/vfio/vfio`` and ``/dev/vfio/<group>`` of each group,
                  and the PCI addresses, comma-separated, in the variable
                  KubeVirt's virt-launcher reads for an external resource
                  (:func:`kubevirt_env_var`)

A node without IOMMU has no group: the list is empty and the kubelet shows
``metax-tech.com/vfio-gpu: 0``. Served by :class:`.server.PluginServer`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Tuple

from ..host import HostRoot, HostRootError
from ..kubelet.grpc_api import grpc
from ..kubelet.grpc_api import dp_pb as pb
from ..names import VFIO_RESOURCE_NAME
from ..vfio import sysfs
from ..vfio.backend import VmGroup, vm_groups
from . import constants as C
from .server import PluginService, RequestError
from .versioned import Versioned

LOG = logging.getLogger("vfio-manager.plugin")
# KubeVirt's prefix for the PCI addresses of an external PCI resource
# (pkg/virt-launcher/virtwrap/device/hostdevice/generic: pciResourcePrefix)
KUBEVIRT_PCI_PREFIX = "PCI_RESOURCE"
# the container node (misc 10:196) and the groups' nodes, as every container sees them
DEVICE_PERMISSIONS = "mrw"


def kubevirt_env_var(resource_name: str = VFIO_RESOURCE_NAME, prefix: str = KUBEVIRT_PCI_PREFIX) -> str:
    """The variable name KubeVirt reads for a resource: its ``util.ResourceNameToEnvVar`` (upper case,
    ``/`` and ``.`` to ``_``): ``PCI_RESOURCE_METAX-TECH_COM_VFIO-GPU`` for ``metax-tech.com/vfio-gpu``."""
    return "%s_%s" % (prefix, resource_name.upper().replace("/", "_").replace(".", "_"))


@dataclass(frozen=True)
class GroupSnapshot:
    version: int
    groups: Tuple[VmGroup, ...]

    def by_id(self) -> Dict[str, VmGroup]:
        return {g.id: g for g in self.groups}


class GroupState(Versioned):
    """Thread-safe list of the node's vfio groups; :meth:`refresh` rescans sysfs."""

    def __init__(self, host: HostRoot) -> None:
        self.host = host
        Versioned.__init__(self)
        self._groups: Tuple[VmGroup, ...] = ()
        self._started = False

    def refresh(self) -> bool:
        try:
            groups = tuple(vm_groups(self.host))
        except (HostRootError, OSError, ValueError) as exc:
            LOG.warning("cannot read the vfio groups: %s", exc)
            groups = tuple(VmGroup(g.group, g.bdfs, g.numa_node, False) for g in self._groups)
        with self._cond:
            changed = groups != self._groups or not self._started
            self._started = True
            if changed:
                self._groups = groups
                self._version += 1
                self._cond.notify_all()
            return changed

    def snapshot(self) -> GroupSnapshot:
        with self._cond:
            return GroupSnapshot(self._version, self._groups)


def container_allocation(host: HostRoot, snapshot: GroupSnapshot, device_ids: Iterable[str],
                         resource_name: str = VFIO_RESOURCE_NAME) -> Dict[str, Any]:
    """``{"devices": [(container_path, host_path, permissions)], "envs": {...}}`` for one container.

    Raises :class:`RequestError` for empty, duplicate, unknown or not-ready groups and for a
    missing device node.
    """
    ids = list(device_ids)
    if not ids:
        raise RequestError("no device IDs in the request")
    if len(set(ids)) != len(ids):
        raise RequestError("duplicate device IDs in the request: %s" % ", ".join(ids))
    known = snapshot.by_id()
    unknown = [d for d in ids if d not in known]
    if unknown:
        raise RequestError("unknown IOMMU group(s): %s" % ", ".join(unknown))
    bad = [d for d in ids if not known[d].ready]
    if bad:
        raise RequestError("IOMMU group(s) %s not ready (not every function on vfio-pci)" % ", ".join(bad))
    chosen = sorted((known[d] for d in ids), key=lambda g: g.group)
    paths = ["/" + sysfs.VFIO_CONTAINER] + ["/%s/%d" % (sysfs.VFIO_DEV_DIR, g.group) for g in chosen]
    specs = []
    for path in paths:
        if not host.exists(path):
            raise RequestError("%s is missing on the node (looked at %s)" % (path, host.join(path)))
        specs.append((path, host.host_path(path), DEVICE_PERMISSIONS))
    addresses = [bdf for g in chosen for bdf in g.bdfs]
    return {"devices": specs, "envs": {kubevirt_env_var(resource_name): ",".join(addresses)}}


def device_messages(snapshot: GroupSnapshot) -> list:
    out = []
    for group in snapshot.groups:
        topology = pb.TopologyInfo(nodes=[pb.NUMANode(ID=group.numa_node)]) if group.numa_node >= 0 else None
        out.append(pb.Device(ID=group.id, health=C.HEALTHY if group.ready else C.UNHEALTHY, topology=topology))
    return out


class VfioPluginService(PluginService):
    """The DevicePlugin service of vfio-gpu: stop, resume, options and the stream are
    :class:`.server.PluginService`'s; no preferred allocation (method names are the RPC names)."""

    log = LOG

    def __init__(self, state: GroupState, host: HostRoot, resource_name: str = VFIO_RESOURCE_NAME) -> None:
        PluginService.__init__(self, state)
        self.state: GroupState = state
        self.host = host
        self.resource_name = resource_name
        self.allocations = 0

    def device_messages(self, snapshot: GroupSnapshot) -> list:
        return device_messages(snapshot)

    def sending(self, snapshot: GroupSnapshot, changed: bool) -> str:
        if changed:
            return "groups changed, sending %d" % len(snapshot.groups)
        return "sending %d IOMMU group(s)" % len(snapshot.groups)

    # pylint: disable=invalid-name,unused-argument
    def GetPreferredAllocation(self, request, context):
        return pb.PreferredAllocationResponse()

    def Allocate(self, request, context):
        response = pb.AllocateResponse()
        snap = self.state.snapshot()
        try:
            if not request.container_requests:
                raise RequestError("no container_requests")
            for creq in request.container_requests:
                result = container_allocation(self.host, snap, creq.devices_ids, self.resource_name)
                cresp = response.container_responses.add()
                for container_path, host_path, perms in result["devices"]:
                    cresp.devices.add(container_path=container_path, host_path=host_path, permissions=perms)
                cresp.envs.update(result["envs"])
                LOG.info("Allocate: group(s) %s", ",".join(creq.devices_ids), extra={"fields": {"envs": result["envs"]}})
        except RequestError as exc:
            LOG.warning("Allocate refused: %s", exc)
            context.set_code(grpc.StatusCode.INVALID_ARGUMENT)
            context.set_details("Allocate: %s" % exc)
            return pb.AllocateResponse()
        self.allocations += 1
        return response
    # pylint: enable=invalid-name,unused-argument
