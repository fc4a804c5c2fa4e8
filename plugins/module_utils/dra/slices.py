# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""A node's MetaX devices as ``resource.k8s.io/v1`` ResourceSlices (pure: no I/O).

One pool per node, named after the node. Each allocatable device of the
inventory is a device of the pool -- a whole GPU, or under SR-IOV each VF (the
PF is then not allocatable, as in gpu-device) -- named after its PCI address
(``gpu-0000-3b-00-0``: stable across reboots, and derivable from the device
ID alone, so a device that fell off the bus keeps its name). Attributes
(unqualified names are in the driver's domain, ``gpu.metax-tech.com/<name>``):

==================================  =======  ==========================================
productName                         string   the chip name as gpu-label names it (MXC500)
family                              string   MXC, MXN
uuid, serial                        string   whole GPUs, when known
function                            string   PF or VF
physicalFunction                    string   a VF's PF (its PCI address): VFs of one GPU
index                               int      the node-local index (mx-smi, gpu-device)
numaNode                            int      -1 when the platform has none
metaxLinkGroup                      int      the MetaXLink group: the lowest GPU index
                                             of the GPUs joined by MetaXLink (a GPU
                                             without MetaXLink is its own group), so
                                             ``matchAttribute`` keeps a claim in a group
driverVersion, macaVersion          version  semver (a fourth part becomes build metadata)
resource.kubernetes.io/pcieRoot     string   standard (k8s.io/dynamic-resource-allocation
resource.kubernetes.io/pciBusID     string   deviceattribute): cross-driver constraints
==================================  =======  ==========================================

Capacity: ``memory`` (a VF: its share of the GPU's). An unhealthy device (by
gpu-device's health checks) carries the taint ``gpu.metax-tech.com/unhealthy``
with effect NoSchedule: new claims avoid it, running pods keep it, and the
taint goes when the device recovers.

:func:`plan` compares what the node has with the slices the API server holds
and says what to create, update and delete; the pool's generation grows on
every change so the scheduler never mixes two versions of the pool.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ..gpu.labels import label_value
from ..gpu.model import Device, Inventory
from ..names import DRA_DRIVER, DRA_TAINT_UNHEALTHY

API_VERSION = "resource.k8s.io/v1"
KIND = "ResourceSlice"
# k8s.io/dynamic-resource-allocation/deviceattribute (v1.36.3)
ATTR_PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
ATTR_PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
FUNCTION_PF = "PF"
FUNCTION_VF = "VF"
# A slice holds at most 128 devices, 64 when any of them has taints
# (ResourceSliceMaxDevicesWithTaints): 64 always, so a failing GPU never
# makes the slice invalid.
DEVICES_PER_SLICE = 64
TAINT_EFFECT = "NoSchedule"
REASON_UNHEALTHY = "Unhealthy"
REASON_GONE = "Gone"

_SEMVER_PART = re.compile(r"^(0|[1-9]\d*)$")


def device_name(device_id: str) -> str:
    """``0000:3b:00.0`` -> ``gpu-0000-3b-00-0`` (a DNS label, as a device name must be)."""
    return "gpu-" + re.sub(r"[^a-z0-9]+", "-", device_id.lower()).strip("-")


def semver(text: Optional[str]) -> Optional[str]:
    """A version attribute's value: ``2.14.6`` as it is, ``3.0.0.8`` -> ``3.0.0+8``; None when not numeric."""
    if not text:
        return None
    parts = text.strip().split(".")
    if len(parts) < 3 or not all(p.isdigit() for p in parts):
        return None
    core = [str(int(p)) for p in parts[:3]]
    if not all(_SEMVER_PART.match(p) for p in core):
        return None
    return ".".join(core) + ("+" + ".".join(parts[3:]) if len(parts) > 3 else "")


def metaxlink_groups(inventory: Inventory) -> Dict[int, int]:
    """GPU index -> its MetaXLink group's id (the group's lowest GPU index; alone: its own)."""
    out = {g.index: g.index for g in inventory.gpus}
    for group in inventory.topology.link_groups:
        if group.kind == "metaxlink":
            for index in group.gpu_indices:
                out[index] = min(group.gpu_indices)
    return out


def _str(value: str) -> Dict[str, Any]:
    return {"string": value}


def _int(value: int) -> Dict[str, Any]:
    return {"int": int(value)}


def unhealthy_taint(reason: str = REASON_UNHEALTHY) -> Dict[str, Any]:
    return {"key": DRA_TAINT_UNHEALTHY, "value": reason, "effect": TAINT_EFFECT}


def _memory(gib: int, share: int) -> Optional[str]:
    if gib <= 0:
        return None
    if share <= 1:
        return "%dGi" % gib
    return "%dMi" % (gib * 1024 // share)


def build_device(dev: Device, inventory: Inventory, groups: Mapping[int, int], healthy: bool) -> Dict[str, Any]:
    """One device of the slice (see the module docstring)."""
    gpu = next(g for g in inventory.gpus if g.index == dev.gpu_index)
    attrs: Dict[str, Dict[str, Any]] = {
        "productName": _str(label_value(gpu.product)),
        "family": _str(label_value(gpu.family)),
        "function": _str(FUNCTION_VF if dev.is_vf else FUNCTION_PF),
        "index": _int(dev.index),
        "numaNode": _int(dev.numa_node),
        "metaxLinkGroup": _int(groups.get(gpu.index, gpu.index)),
        ATTR_PCI_BUS_ID: _str(dev.bdf),
        ATTR_PCIE_ROOT: _str(gpu.pci_path.root_complex),
    }
    if dev.is_vf:
        attrs["physicalFunction"] = _str(gpu.bdf)
    else:
        if gpu.uuid:
            attrs["uuid"] = _str(gpu.uuid)
        if gpu.serial:
            attrs["serial"] = _str(gpu.serial)
    for key, text in (("driverVersion", inventory.driver.version if inventory.driver.loaded else None),
                      ("macaVersion", inventory.maca_version)):
        version = semver(text)
        if version is not None:
            attrs[key] = {"version": version}
    out: Dict[str, Any] = {"name": device_name(dev.id), "attributes": attrs}
    memory = _memory(gpu.memory_gib, max(1, gpu.sriov_numvfs) if dev.is_vf else 1)
    if memory is not None:
        out["capacity"] = {"memory": {"value": memory}}
    if not healthy:
        out["taints"] = [unhealthy_taint()]
    return out


def build_devices(inventory: Inventory, health: Optional[Mapping[str, bool]] = None,
                  previous: Sequence[Dict[str, Any]] = (), gone: Iterable[str] = ()) -> List[Dict[str, Any]]:
    """The pool's devices in PCI order.

    ``health``: device ID -> healthy, gpu-device's verdict (``DeviceState``); a device it does
    not name is judged by discovery. ``gone``: IDs of devices that fell off the bus while their
    GPU is missing (gpu-device keeps them advertised Unhealthy); each keeps its ``previous``
    entry, tainted, so a claim that holds it still finds it and new claims avoid it.
    """
    health = health or {}
    groups = metaxlink_groups(inventory)
    out = [build_device(dev, inventory, groups, bool(health.get(dev.id, dev.healthy))) for dev in inventory.devices]
    have = {d["name"] for d in out}
    before = {d["name"]: d for d in previous}
    for dev_id in gone:
        name = device_name(dev_id)
        if name in have or name not in before:
            continue
        entry = copy.deepcopy(before[name])
        entry["taints"] = [unhealthy_taint(REASON_GONE)]
        out.append(entry)
        have.add(name)
    return out


def slice_name(node_name: str, index: int) -> str:
    return "%s-%s-%d" % (node_name, DRA_DRIVER, index)


def build_slices(node_name: str, devices: Sequence[Dict[str, Any]], generation: int,
                 per_slice: int = DEVICES_PER_SLICE) -> List[Dict[str, Any]]:
    """The pool as slices: one per ``per_slice`` devices (one, empty, for a node without GPUs)."""
    chunks = [list(devices[i:i + per_slice]) for i in range(0, len(devices), per_slice)] or [[]]
    out = []
    for index, chunk in enumerate(chunks):
        spec: Dict[str, Any] = {
            "driver": DRA_DRIVER, "nodeName": node_name,
            "pool": {"name": node_name, "generation": generation, "resourceSliceCount": len(chunks)},
        }
        if chunk:
            spec["devices"] = chunk
        out.append({"apiVersion": API_VERSION, "kind": KIND,
                    "metadata": {"name": slice_name(node_name, index)}, "spec": spec})
    return out


def _without_times(devices: Iterable[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Devices as compared: the API server's ``timeAdded`` of each taint left out."""
    out = []
    for dev in devices:
        dev = copy.deepcopy(dev)
        for taint in dev.get("taints") or []:
            taint.pop("timeAdded", None)
        out.append(dev)
    return out


def _existing_devices(existing: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    out: List[Dict[str, Any]] = []
    for item in sorted(existing, key=lambda s: s.get("metadata", {}).get("name", "")):
        out.extend((item.get("spec") or {}).get("devices") or [])
    return out


def _carry_taint_times(desired: Dict[str, Any], existing: Sequence[Dict[str, Any]]) -> None:
    """Keep the ``timeAdded`` the API server gave a taint that is still there (else every
    update would restart its clock)."""
    times = {}
    for dev in _existing_devices(existing):
        for taint in dev.get("taints") or []:
            if taint.get("timeAdded"):
                times[(dev.get("name"), taint.get("key"), taint.get("value"), taint.get("effect"))] = taint["timeAdded"]
    for dev in (desired.get("spec") or {}).get("devices") or []:
        for taint in dev.get("taints") or []:
            when = times.get((dev["name"], taint["key"], taint.get("value"), taint["effect"]))
            if when:
                taint["timeAdded"] = when


@dataclass
class Plan:
    """What to write so the API server holds exactly the node's pool."""

    generation: int
    create: List[Dict[str, Any]] = field(default_factory=list)
    update: List[Dict[str, Any]] = field(default_factory=list)
    delete: List[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.create or self.update or self.delete)


def _generation(item: Dict[str, Any]) -> int:
    return int(((item.get("spec") or {}).get("pool") or {}).get("generation") or 0)


def _consistent(node_name: str, existing: Sequence[Dict[str, Any]]) -> bool:
    """One generation, the count the slices announce, the names and node we write."""
    if not existing:
        return False
    pools = {((s.get("spec") or {}).get("pool") or {}).get("name") for s in existing}
    gens = {_generation(s) for s in existing}
    counts = {int(((s.get("spec") or {}).get("pool") or {}).get("resourceSliceCount") or 0) for s in existing}
    names = sorted(s.get("metadata", {}).get("name") for s in existing)
    return (pools == {node_name} and len(gens) == 1 and counts == {len(existing)}
            and names == sorted(slice_name(node_name, i) for i in range(len(existing))))


def plan(node_name: str, devices: Sequence[Dict[str, Any]], existing: Sequence[Dict[str, Any]],
         per_slice: int = DEVICES_PER_SLICE) -> Plan:
    """Compare the node's ``devices`` with the ``existing`` slices of this driver and node.

    Unchanged (same devices, one consistent generation): nothing to do. Otherwise every slice
    is written with the next generation (creates and updates, which carry the stored
    ``resourceVersion``), then the slices the pool no longer has are deleted.
    """
    current = max((_generation(s) for s in existing), default=0)
    desired_count = max(1, -(-len(devices) // per_slice))
    if (_consistent(node_name, existing) and len(existing) == desired_count
            and _without_times(_existing_devices(existing)) == _without_times(devices)):
        return Plan(current)
    generation = current + 1
    by_name = {s.get("metadata", {}).get("name"): s for s in existing}
    result = Plan(generation)
    for item in build_slices(node_name, devices, generation, per_slice):
        _carry_taint_times(item, existing)
        old = by_name.pop(item["metadata"]["name"], None)
        if old is None:
            result.create.append(item)
        else:
            item["metadata"]["resourceVersion"] = old.get("metadata", {}).get("resourceVersion")
            result.update.append(item)
    result.delete = sorted(n for n in by_name if n)
    return result


def devices_by_name(devices: Iterable[Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    return {d["name"]: d for d in devices}


def tainted(devices: Iterable[Dict[str, Any]]) -> List[Tuple[str, str]]:
    """(device name, reason) of every device carrying the unhealthy taint."""
    return [(d["name"], t.get("value", "")) for d in devices for t in d.get("taints") or []
            if t.get("key") == DRA_TAINT_UNHEALTHY]


def taint_all(previous: Sequence[Dict[str, Any]], reason: str = REASON_UNHEALTHY) -> List[Dict[str, Any]]:
    """``previous`` with every device tainted: the node cannot be read, so nothing is known to work."""
    out = []
    for dev in previous:
        entry = copy.deepcopy(dev)
        entry["taints"] = [unhealthy_taint(reason)]
        out.append(entry)
    return out
