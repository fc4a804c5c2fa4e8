# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The GPUs left to containers: discovery without the GPUs handed to VMs (issue 43).

A GPU bound to ``vfio-pci`` (or whose ``driver_override`` sends it there) is
vfio-manager's ``metax-tech.com/vfio-gpu``, not gpu-device's
``metax-tech.com/gpu``: its devices are dropped from the inventory, and the
topology (scores, losses, link groups) is restricted to the devices left, so
the annotations follow. The GPU itself stays in ``Inventory.gpus``: it is
still on the bus, so gpu-device forgets its device instead of keeping it as
Unhealthy (deviceplugin/devices.py). Device indices are kept, so the CDI names
of the other devices do not move.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, FrozenSet, Optional

from ..gpu.discovery import KnownIds, discover
from ..gpu.model import Inventory, LinkGroup, Topology
from ..host import HostRoot
from ..vfio.backend import held_for_vm


def without_vm_gpus(inventory: Inventory, held: FrozenSet[str]) -> Inventory:
    """``inventory`` without the devices of the GPUs (PCI addresses) in ``held``."""
    if not held:
        return inventory
    gone_gpus = {g.index for g in inventory.gpus if g.bdf in held}
    devices = tuple(d for d in inventory.devices if d.gpu_index not in gone_gpus and d.bdf not in held)
    if len(devices) == len(inventory.devices):
        return inventory
    keep = {d.index for d in devices}
    topo = inventory.topology
    groups = []
    for group in topo.link_groups:
        members = tuple(i for i in group.gpu_indices if i not in gone_gpus)
        if members:
            groups.append(LinkGroup(group.kind, members))
    topology = Topology(tuple(i for i in topo.device_indices if i in keep),
                        {pair: link for pair, link in topo.links.items() if pair[0] in keep and pair[1] in keep},
                        tuple(groups), topo.metaxlink_known)
    return dataclasses.replace(inventory, devices=devices, topology=topology)


def discover_for_containers(host: HostRoot, topology: bool = True, known_ids: Optional[KnownIds] = None) -> Inventory:
    """gpu-device's discovery: :func:`..gpu.discovery.discover` without the GPUs handed to VMs."""
    return without_vm_gpus(discover(host, topology=topology, known_ids=known_ids), held_for_vm(host))


def reading_discovery(for_containers: bool = True) -> Callable[..., Inventory]:
    """The discovery of an agent that reads its node every few seconds: ``-L`` reused (KnownIds)."""
    return functools.partial(discover_for_containers if for_containers else discover, known_ids=KnownIds())
