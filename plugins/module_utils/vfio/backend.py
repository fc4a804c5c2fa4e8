# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Hand-over on a node: read the GPUs' drivers and IOMMU groups, find who uses them, write sysfs.

All I/O goes through a :class:`~..host.HostRoot`, so the same code writes a
real sysfs or a simulated node (whose kernel hook answers like the kernel).
The vfnum each GPU had is recorded on the node (:data:`RECORD`) before it is
handed over, and the record is removed when the GPU is back with that vfnum:
nothing is left once every GPU is back.
"""

from __future__ import annotations

import errno as errno_codes
from dataclasses import dataclass
from typing import Callable, Dict, FrozenSet, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from ..driver.records import read_record, unlink, write_record
from ..gpu import pci
from ..gpu.model import METAX_VENDOR_ID
from ..gpu.users import open_device_users
from ..host import HostRoot, HostRootError
from ..names import RESOURCE_NAME, VFIO_RESOURCE_NAME
from ..vfnum.backend import device_nodes
from . import sysfs
from .plan import TO_VM, GpuState, NodeState, PassthroughError, Plan, Step

# GPU (PCI address) -> the vfnum it had when it was handed to vfio-pci
RECORD = "var/lib/metax-gpu/vfio-passthrough.json"

_ERRNO_REASONS = {
    errno_codes.EBUSY: "EBUSY: another driver holds the GPU",
    errno_codes.ENODEV: "ENODEV: the driver does not hold or match the GPU (driver_override?)",
    errno_codes.EINVAL: "EINVAL: refused (vfio-pci: no IOMMU group)",
    errno_codes.ENOENT: "ENOENT: no such attribute or driver (is the module loaded?)",
}


class PassthroughApplyError(PassthroughError):
    """A write failed part-way; ``results`` holds every changing GPU as re-read afterwards."""

    def __init__(self, message: str, results: Sequence[Dict[str, object]]) -> None:
        super().__init__(message)
        self.results = list(results)


def recorded_vfnums(host: HostRoot) -> Dict[str, int]:
    record = read_record(host, RECORD) or {}
    found = record.get("gpus")
    gpus: Dict[str, object] = found if isinstance(found, dict) else {}
    return {str(bdf): int(entry.get("vfnum", 0)) for bdf, entry in gpus.items()
            if isinstance(entry, dict) and isinstance(entry.get("vfnum", 0), int)}


def _write_records(host: HostRoot, vfnums: Mapping[str, int]) -> None:
    if vfnums:
        write_record(host, RECORD, {"gpus": {bdf: {"vfnum": n} for bdf, n in sorted(vfnums.items())}})
    else:
        unlink(host, RECORD)


def _group(host: HostRoot, bdf: str) -> Optional[int]:
    link = host.readlink("%s/%s/%s" % (pci.PCI_DEVICES, bdf, sysfs.IOMMU_GROUP_LINK))
    if not link:
        return None
    name = link.rstrip("/").rsplit("/", 1)[-1]
    return int(name) if name.isdigit() else None


def iommu_enabled(host: HostRoot) -> bool:
    """Any IOMMU group on the node (the directory is empty, or absent, when the IOMMU is off)."""
    return bool(host.listdir(sysfs.IOMMU_GROUPS))


def read_node(host: HostRoot) -> NodeState:
    """MetaX PFs in PCI address order (discovery's and, while the MetaX driver holds them all, mx-smi's
    indices: a GPU vfio-pci holds keeps its index here though mx-smi no longer lists it)."""
    host.check()
    try:
        functions = pci.scan(host)
    except pci.PciScanError as exc:
        raise PassthroughError(str(exc))
    vfs: Dict[str, List[str]] = {}
    for function in functions:
        if function.physfn is not None:
            vfs.setdefault(function.physfn, []).append(function.bdf)
    pfs = [f for f in functions if f.physfn is None]
    gpus = tuple(GpuState(
        index=i, bdf=f.bdf, driver=f.driver,
        override=host.read_attribute("%s/%s/%s" % (pci.PCI_DEVICES, f.bdf, sysfs.DRIVER_OVERRIDE),
                                     default=sysfs.NO_OVERRIDE) or sysfs.NO_OVERRIDE,
        numvfs=f.sriov_numvfs, totalvfs=f.sriov_totalvfs, vf_bdfs=tuple(vfs.get(f.bdf, ())),
        iommu_group=_group(host, f.bdf)) for i, f in enumerate(pfs))
    return NodeState(gpus=gpus, iommu=iommu_enabled(host),
                     vfio_loaded=host.isdir("%s/%s" % (sysfs.PCI_DRIVERS, sysfs.VFIO_DRIVER)),
                     recorded_vfnums=recorded_vfnums(host))


def step_nodes(host: HostRoot, node: NodeState, step: Step) -> Set[str]:
    """The device nodes whose users the step would cut off: the GPU's DRM nodes (PF and VFs) on the
    way to VMs, its ``/dev/vfio/<group>`` (a VM's qemu) on the way back."""
    gpu = next(g for g in node.gpus if g.bdf == step.bdf)
    nodes = device_nodes(host, [gpu.bdf] + list(gpu.vf_bdfs))
    if gpu.iommu_group is not None and gpu.driver == sysfs.VFIO_DRIVER:
        nodes.add("/%s/%d" % (sysfs.VFIO_DEV_DIR, gpu.iommu_group))
    return nodes


def in_use(host: HostRoot, node: NodeState, plan: Plan, holders: Optional[Mapping[str, Iterable[str]]] = None,
           gpu_pods: Sequence[str] = ()) -> List[str]:
    """Why the plan would break running work (empty: safe).

    ``holders``: device ID (PCI address of a PF or VF) -> the pods the kubelet allocated it to
    (the pod-resources API, ``metax-tech.com/gpu`` and ``metax-tech.com/vfio-gpu``): only the
    changing GPUs' count. ``gpu_pods``: pods the caller found on the node requesting a GPU
    resource without knowing which device (the vfnum rule): each counts against every GPU.
    """
    reasons: List[str] = []
    if not plan.steps:
        return reasons
    holders = holders or {}
    for step in plan.steps:
        nodes = step_nodes(host, node, step)
        reasons.extend("GPU %d (%s): process %s (%s) holds %s open" % (step.index, step.bdf, u.pid, u.comm, u.node)
                       for u in open_device_users(host, nodes))
        gpu = next(g for g in node.gpus if g.bdf == step.bdf)
        for device in [gpu.bdf] + list(gpu.vf_bdfs):
            for pod in sorted(holders.get(device, ())):
                reasons.append("GPU %d (%s): pod %s holds device %s" % (step.index, step.bdf, pod, device))
    resource = RESOURCE_NAME if plan.to_vm else VFIO_RESOURCE_NAME
    reasons.extend("pod %s requests %s on this node" % (pod, resource) for pod in gpu_pods)
    return reasons


def _write(host: HostRoot, step: Step, rel: str, value: str) -> None:
    try:
        host.write_attribute(rel, value)
    except HostRootError as exc:
        reason = _ERRNO_REASONS.get(exc.errno or 0, str(exc))
        raise PassthroughError("GPU %d (%s): writing %r to /%s failed: %s (%s)"
                               % (step.index, step.bdf, value.strip(), rel, reason, exc))


def _result(host: HostRoot, step: Step) -> Dict[str, object]:
    entry = step.to_dict()
    link = host.readlink("%s/%s/driver" % (pci.PCI_DEVICES, step.bdf))
    entry["driver_after"] = link.rstrip("/").rsplit("/", 1)[-1] if link else None
    entry["vfnum_after"] = host.read_int("%s/%s/sriov_numvfs" % (pci.PCI_DEVICES, step.bdf), default=0)
    return entry


def _check(host: HostRoot, step: Step) -> Dict[str, object]:
    entry = _result(host, step)
    wanted_driver = sysfs.VFIO_DRIVER if step.action == TO_VM else sysfs.METAX_DRIVER
    if entry["driver_after"] != wanted_driver:
        raise PassthroughError("GPU %d (%s): %s after the writes, not %s%s" % (
            step.index, step.bdf, entry["driver_after"] or "no driver", wanted_driver,
            "" if step.action == TO_VM else " (is the metax kernel module loaded?)"))
    if entry["vfnum_after"] != step.vfnum_after:
        raise PassthroughError("GPU %d (%s): asked for %d VFs, the kernel enabled %s"
                               % (step.index, step.bdf, step.vfnum_after, entry["vfnum_after"]))
    return entry


def apply(host: HostRoot, plan: Plan,
          progress: Optional[Callable[[Step], None]] = None) -> List[Dict[str, object]]:
    """Write the plan, GPU after GPU, each read back; returns per-GPU before/after.

    The vfnum of a GPU is recorded before its first write, and forgotten when
    it is back with it. A failure stops the run with PassthroughApplyError,
    the remaining GPUs untouched.
    """
    records = recorded_vfnums(host)
    results: List[Dict[str, object]] = []
    pending = list(plan.steps)
    while pending:
        step = pending.pop(0)
        if progress is not None:
            progress(step)
        try:
            if step.action == TO_VM and step.bdf not in records:
                records[step.bdf] = step.vfnum_before
                _write_records(host, records)
            for rel, value in step.writes:
                _write(host, step, rel, value)
            results.append(_check(host, step))
            if step.action != TO_VM and records.pop(step.bdf, None) is not None:
                _write_records(host, records)
        except PassthroughError as exc:
            results.append(_result(host, step))
            results.extend(dict(s.to_dict(), driver_after=s.driver_before, vfnum_after=s.vfnum_before)
                           for s in pending)
            raise PassthroughApplyError(str(exc), results)
    forget_settled(host)
    return results


def forget_settled(host: HostRoot) -> None:
    """Drop records of GPUs the MetaX driver holds again with their vfnum (an interrupted hand-back)."""
    records = recorded_vfnums(host)
    if not records:
        return
    node = read_node(host)
    settled = {g.bdf for g in node.gpus if g.settled_on_host and g.numvfs == records.get(g.bdf, -1)}
    gone = {bdf for bdf in records if bdf not in {g.bdf for g in node.gpus}}
    if settled | gone:
        _write_records(host, {b: n for b, n in records.items() if b not in settled | gone})


# -- what the device plugins see --------------------------------------------------
@dataclass(frozen=True)
class VmGroup:
    """One IOMMU group of MetaX GPUs vfio-pci holds: one ``metax-tech.com/vfio-gpu`` device."""

    group: int
    bdfs: Tuple[str, ...]         # the group's MetaX functions (one GPU per group on usual boards)
    numa_node: int
    ready: bool                   # every function of the group on vfio-pci and /dev/vfio/<group> present

    @property
    def id(self) -> str:
        return str(self.group)


def _metax_functions(host: HostRoot) -> List[str]:
    """PCI addresses of the MetaX functions (a cheap scan: vendor only)."""
    out = []
    for name in host.listdir(pci.PCI_DEVICES):
        vendor = host.read_attribute("%s/%s/vendor" % (pci.PCI_DEVICES, name), default="")
        if vendor.lower() == "0x%04x" % METAX_VENDOR_ID:
            out.append(name)
    return out


def _driver_name(host: HostRoot, bdf: str) -> Optional[str]:
    link = host.readlink("%s/%s/driver" % (pci.PCI_DEVICES, bdf))
    return link.rstrip("/").rsplit("/", 1)[-1] if link else None


def held_for_vm(host: HostRoot) -> FrozenSet[str]:
    """MetaX functions vfio-pci holds or that are on their way to it (driver_override): no
    longer the container pool's. Cheap enough for every health scan of gpu-device."""
    held = set()
    for bdf in _metax_functions(host):
        override = host.read_attribute("%s/%s/%s" % (pci.PCI_DEVICES, bdf, sysfs.DRIVER_OVERRIDE), default="")
        if sysfs.VFIO_DRIVER in (_driver_name(host, bdf), override):
            held.add(bdf)
    return frozenset(held)


def vm_groups(host: HostRoot) -> List[VmGroup]:
    """The IOMMU groups holding MetaX GPUs for VMs, by group number."""
    by_group: Dict[int, List[str]] = {}
    for bdf in sorted(held_for_vm(host)):
        group = _group(host, bdf)
        if group is not None:
            by_group.setdefault(group, []).append(bdf)
    out = []
    for group, bdfs in sorted(by_group.items()):
        members = host.listdir("%s/%d/devices" % (sysfs.IOMMU_GROUPS, group))
        ready = host.exists("%s/%d" % (sysfs.VFIO_DEV_DIR, group)) and all(
            _driver_name(host, m) == sysfs.VFIO_DRIVER for m in members)
        numa = host.read_int("%s/%s/numa_node" % (pci.PCI_DEVICES, bdfs[0]), default=-1)
        out.append(VmGroup(group, tuple(bdfs), numa, ready))
    return out
