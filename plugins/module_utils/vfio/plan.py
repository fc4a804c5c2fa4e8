# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Pure planning of a hand-over of MetaX GPUs to ``vfio-pci`` (VMs) and of their hand-back.

The kernel's rules shape the plan (docs/vfio.md):

* ``driver_override`` is written first: from then on only ``vfio-pci`` may
  take the GPU, so neither a driver reload nor driver-manager's vfnum round
  gives it back to the MetaX driver half-way;
* a PF with VFs goes through ``sriov_numvfs`` 0 first (the VFs belong to the
  MetaX driver; the value it had is recorded and restored at hand-back);
* ``drivers/metax/unbind`` then ``drivers_probe`` bind it to ``vfio-pci``,
  which refuses a GPU without an IOMMU group: a node without IOMMU is refused
  here, before anything is written (:class:`IommuDisabled`).

The hand-back undoes it in the reverse order: ``vfio-pci`` unbinds, the
override is cleared, ``drivers_probe`` gives the GPU to the MetaX driver, and
the recorded vfnum is written back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Collection, Dict, List, Mapping, Optional, Sequence, Tuple

from ..errors import MetaxGpuError
from ..gpu.pci import PCI_DEVICES, normalize_bdf
from . import sysfs

TO_VM = "to-vm"
TO_HOST = "to-host"
# the vendor's own words (a real 0.9.2 vfio-manager's Event), with the node named
IOMMU_DISABLED_MESSAGE = "IOMMU support is missing on node %s. Please ensure that IOMMU is enabled on the node"


class PassthroughError(MetaxGpuError):
    """A hand-over or hand-back that cannot be planned or applied; nothing was written unless said so."""


class IommuDisabled(PassthroughError):
    """The node has no IOMMU groups: vfio-pci cannot take any GPU."""


@dataclass(frozen=True)
class GpuState:
    """One MetaX GPU (physical function) as read from sysfs."""

    index: int                   # PCI address order: mx-smi's numbering while the MetaX driver holds every GPU
    bdf: str
    driver: Optional[str]        # "metax", "vfio-pci", None (unbound)
    override: str                # driver_override; sysfs.NO_OVERRIDE when unset
    numvfs: int = 0
    totalvfs: int = 0
    vf_bdfs: Tuple[str, ...] = ()
    iommu_group: Optional[int] = None

    @property
    def for_vm(self) -> bool:
        """Held by vfio-pci, or on its way there (the override written, the bind not yet done)."""
        return self.driver == sysfs.VFIO_DRIVER or self.override == sysfs.VFIO_DRIVER

    @property
    def settled_on_host(self) -> bool:
        return self.driver == sysfs.METAX_DRIVER and self.override == sysfs.NO_OVERRIDE


@dataclass(frozen=True)
class NodeState:
    gpus: Tuple[GpuState, ...]
    iommu: bool                  # any IOMMU group on the node
    vfio_loaded: bool            # sys/bus/pci/drivers/vfio-pci exists
    recorded_vfnums: Mapping[str, int] = field(default_factory=dict)   # bdf -> vfnum at hand-over


@dataclass(frozen=True)
class Step:
    """One GPU's planned change: the sysfs writes, in order."""

    index: int
    bdf: str
    action: str                  # TO_VM | TO_HOST
    driver_before: Optional[str]
    vfnum_before: int
    vfnum_after: int
    iommu_group: Optional[int]
    writes: Tuple[Tuple[str, str], ...]

    def to_dict(self) -> Dict[str, object]:
        return {"index": self.index, "bdf": self.bdf, "action": self.action, "driver_before": self.driver_before,
                "driver_after": sysfs.VFIO_DRIVER if self.action == TO_VM else sysfs.METAX_DRIVER,
                "vfnum_before": self.vfnum_before, "vfnum_after": self.vfnum_after,
                "iommu_group": self.iommu_group}


@dataclass(frozen=True)
class Plan:
    steps: Tuple[Step, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.steps)

    @property
    def to_vm(self) -> Tuple[Step, ...]:
        return tuple(s for s in self.steps if s.action == TO_VM)

    @property
    def to_host(self) -> Tuple[Step, ...]:
        return tuple(s for s in self.steps if s.action == TO_HOST)

    def diff(self) -> Dict[str, Dict[str, Dict[str, object]]]:
        """Ansible's diff: driver and vfnum per changing GPU (by PCI address), before and after."""
        before: Dict[str, Dict[str, object]] = {}
        after: Dict[str, Dict[str, object]] = {}
        for step in self.steps:
            entry = step.to_dict()
            before[step.bdf] = {"driver": entry["driver_before"], "vfnum": step.vfnum_before}
            after[step.bdf] = {"driver": entry["driver_after"], "vfnum": step.vfnum_after}
        return {"before": before, "after": after}


def _attr(bdf: str, name: str) -> str:
    return "%s/%s/%s" % (PCI_DEVICES, bdf, name)


def select(gpus: Sequence[GpuState], devices: Optional[Sequence[object]]) -> List[GpuState]:
    """GPUs named by index or PCI address; all when ``devices`` is None, empty or contains ``all``."""
    if not devices or any(str(d).strip().lower() == "all" for d in devices):
        return list(gpus)
    by_bdf = {g.bdf: g for g in gpus}
    by_index = {g.index: g for g in gpus}
    chosen: Dict[int, GpuState] = {}
    unknown = []
    for item in devices:
        text = str(item).strip()
        gpu = None
        if text.isdigit():
            gpu = by_index.get(int(text))
        else:
            try:
                gpu = by_bdf.get(normalize_bdf(text))
            except ValueError:
                gpu = None
        if gpu is None:
            unknown.append(text)
        else:
            chosen[gpu.index] = gpu
    if unknown:
        raise PassthroughError("unknown GPU(s) %s: this node has %s" % (
            ", ".join(repr(u) for u in unknown),
            ", ".join("%d (%s)" % (g.index, g.bdf) for g in gpus) or "no MetaX GPU"))
    return [chosen[i] for i in sorted(chosen)]


def _to_vm(gpu: GpuState) -> Step:
    writes: List[Tuple[str, str]] = []
    if gpu.override != sysfs.VFIO_DRIVER:
        writes.append((_attr(gpu.bdf, sysfs.DRIVER_OVERRIDE), sysfs.VFIO_DRIVER))
    if gpu.numvfs:
        writes.append((_attr(gpu.bdf, "sriov_numvfs"), "0"))
    if gpu.driver is not None:
        writes.append(("%s/%s/unbind" % (sysfs.PCI_DRIVERS, gpu.driver), gpu.bdf))
    writes.append((sysfs.DRIVERS_PROBE, gpu.bdf))
    return Step(gpu.index, gpu.bdf, TO_VM, gpu.driver, gpu.numvfs, 0, gpu.iommu_group, tuple(writes))


def _to_host(gpu: GpuState, vfnum: int) -> Step:
    writes: List[Tuple[str, str]] = []
    if gpu.driver is not None and gpu.driver != sysfs.METAX_DRIVER:
        writes.append(("%s/%s/unbind" % (sysfs.PCI_DRIVERS, gpu.driver), gpu.bdf))
    if gpu.override != sysfs.NO_OVERRIDE:
        # an empty write clears driver_override (a bare "" would be no write at all)
        writes.append((_attr(gpu.bdf, sysfs.DRIVER_OVERRIDE), "\n"))
    if gpu.driver != sysfs.METAX_DRIVER:
        writes.append((sysfs.DRIVERS_PROBE, gpu.bdf))
    if vfnum and gpu.numvfs != vfnum:
        writes.append((_attr(gpu.bdf, "sriov_numvfs"), "%d" % vfnum))
    return Step(gpu.index, gpu.bdf, TO_HOST, gpu.driver, gpu.numvfs, vfnum, gpu.iommu_group, tuple(writes))


def plan(node: NodeState, to_vm: Collection[int] = (), to_host: Collection[int] = (),
         node_name: str = "this node") -> Plan:
    """Steps taking the GPUs of index ``to_vm`` to vfio-pci and those of ``to_host`` back.

    GPUs already where they are asked to be have no step. Raises before
    anything is written: :class:`IommuDisabled` when a GPU is asked for VMs on
    a node without IOMMU, :class:`PassthroughError` when vfio-pci is not loaded,
    a GPU has no IOMMU group, or one GPU is asked both ways.
    """
    both = sorted(set(to_vm) & set(to_host))
    if both:
        raise PassthroughError("GPU(s) %s asked both for VMs and back" % ", ".join(str(i) for i in both))
    by_index = {g.index: g for g in node.gpus}
    unknown = sorted(i for i in set(to_vm) | set(to_host) if i not in by_index)
    if unknown:
        raise PassthroughError("unknown GPU index(es) %s: this node has %d MetaX GPU(s) (0-%d)"
                               % (", ".join(str(i) for i in unknown), len(node.gpus), len(node.gpus) - 1))
    steps: List[Step] = []
    moving = [by_index[i] for i in sorted(set(to_vm)) if by_index[i].driver != sysfs.VFIO_DRIVER
              or by_index[i].override != sysfs.VFIO_DRIVER]
    if moving:
        if not node.iommu:
            raise IommuDisabled(IOMMU_DISABLED_MESSAGE % node_name)
        if not node.vfio_loaded:
            raise PassthroughError("the vfio-pci kernel module is not loaded on %s (modprobe vfio-pci; "
                                   "/%s/%s is missing)" % (node_name, sysfs.PCI_DRIVERS, sysfs.VFIO_DRIVER))
        lonely = ["%d (%s)" % (g.index, g.bdf) for g in moving if g.iommu_group is None]
        if lonely:
            raise PassthroughError("GPU(s) %s have no IOMMU group: vfio-pci cannot take them" % ", ".join(lonely))
    for gpu in sorted(moving, key=lambda g: g.index):
        steps.append(_to_vm(gpu))
    for index in sorted(set(to_host)):
        gpu = by_index[index]
        vfnum = int(node.recorded_vfnums.get(gpu.bdf, 0))
        if gpu.settled_on_host and (not vfnum or gpu.numvfs == vfnum):
            continue
        steps.append(_to_host(gpu, vfnum))
    return Plan(tuple(sorted(steps, key=lambda s: s.index)))


def reconcile(node: NodeState, wanted: Collection[int], node_name: str = "this node") -> Plan:
    """The node's whole truth: ``wanted`` with VMs, every other GPU held for VMs handed back."""
    back = [g.index for g in node.gpus if g.index not in wanted and (g.for_vm or g.bdf in node.recorded_vfnums)]
    return plan(node, wanted, back, node_name)
