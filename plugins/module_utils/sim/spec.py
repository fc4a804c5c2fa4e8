# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Specifications of simulated MetaX nodes and the built-in presets.

A :class:`NodeSpec` says where each GPU sits (NUMA node, PCI root complex,
root port, the chain of PCIe switches above it, MetaXLink group). The
generator turns it into a host root; :func:`expected_link` says what
discovery must find for a pair, from the spec alone, so tests can check
that any generated topology is discovered exactly as generated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

from ..gpu.model import LinkClass


@dataclass(frozen=True)
class GpuSpec:
    product: str                      # "C500", "C550", "N100"
    numa_node: int = 0
    root_complex: int = 0             # PCI root bridge (pci0000:XX)
    root_port: int = 0                # root port within that root complex
    switch_path: Tuple[int, ...] = ()  # switch ids from the root port down; () = direct attach
    metaxlink_group: Optional[int] = None
    sriov_totalvfs: int = 0


@dataclass(frozen=True)
class NodeSpec:
    name: str
    gpus: Tuple[GpuSpec, ...]
    driver_version: str = "2.14.6"
    maca_version: str = "2.29.0.19"
    mx_smi_version: str = "2.2.12"      # the first with -j (JSON)
    # IOMMU on (intel_iommu=on / amd_iommu): every function in an IOMMU group
    # (/sys/kernel/iommu_groups/N), which vfio-pci needs to take a GPU
    iommu: bool = True
    extra: Dict[str, str] = field(default_factory=dict, hash=False)

    def validate(self) -> None:
        """Reject physically impossible layouts (one switch in two places)."""
        where: Dict[int, Tuple[int, int, Tuple[int, ...]]] = {}
        numa_of_rc: Dict[int, int] = {}
        for gpu in self.gpus:
            if numa_of_rc.setdefault(gpu.root_complex, gpu.numa_node) != gpu.numa_node:
                raise ValueError("root complex %d spans NUMA nodes" % gpu.root_complex)
            for depth, switch in enumerate(gpu.switch_path):
                place = (gpu.root_complex, gpu.root_port, gpu.switch_path[:depth])
                if where.setdefault(switch, place) != place:
                    raise ValueError("switch %d appears under two parents" % switch)
            if not gpu.switch_path:
                # a directly attached GPU owns its root port
                for other in self.gpus:
                    if other is not gpu and (other.root_complex, other.root_port) == (gpu.root_complex, gpu.root_port):
                        raise ValueError("root port %d/%d holds a GPU and something else"
                                         % (gpu.root_complex, gpu.root_port))


def expected_link(a: GpuSpec, b: GpuSpec) -> LinkClass:
    """The link class between two GPUs of a spec (the ground truth for tests)."""
    if a.metaxlink_group is not None and a.metaxlink_group == b.metaxlink_group:
        return LinkClass.MX
    if a.root_complex != b.root_complex:
        return LinkClass.NODE if a.numa_node == b.numa_node else LinkClass.SYS
    if a.root_port != b.root_port:
        return LinkClass.PHB
    if a.switch_path and a.switch_path == b.switch_path:
        return LinkClass.PIX
    return LinkClass.PXB


def _c500(numa: int, rc: int, switch: int, group: int) -> GpuSpec:
    return GpuSpec("C500", numa_node=numa, root_complex=rc, root_port=0,
                   switch_path=(switch,), metaxlink_group=group)


PRESETS: Dict[str, NodeSpec] = {
    # Two MetaXLink groups of four, each behind its own PCIe switch on its
    # own socket: the manual's Figure 2.1.
    "8xC500": NodeSpec("8xC500", tuple(
        [_c500(0, 0, 0, 0)] * 4 + [_c500(1, 1, 1, 1)] * 4)),
    # No MetaXLink; two switches on two root ports of one root complex.
    "4xN100": NodeSpec("4xN100", tuple(
        GpuSpec("N100", numa_node=0, root_complex=0, root_port=port, switch_path=(port,))
        for port in (0, 0, 1, 1))),
    # SR-IOV capable C550s behind one switch.
    "2xC550-sriov": NodeSpec("2xC550-sriov", (
        GpuSpec("C550", numa_node=0, root_complex=0, root_port=0, switch_path=(0,),
                metaxlink_group=0, sriov_totalvfs=8),) * 2),
    # Larger shapes for benchmarks and allocator tests.
    "16xC500": NodeSpec("16xC500", tuple(
        _c500(q // 2, q // 2, q, q) for q in range(4) for _slot in range(4))),
    "1xC500": NodeSpec("1xC500", (GpuSpec("C500", switch_path=(0,)),)),
    # 8xC500 booted without IOMMU: /sys/kernel/iommu_groups is empty, vfio-pci
    # cannot take a GPU (issue 43: the vendor's vfio-manager crash-loops there)
    "8xC500-noiommu": NodeSpec("8xC500-noiommu", tuple(
        [_c500(0, 0, 0, 0)] * 4 + [_c500(1, 1, 1, 1)] * 4), iommu=False),
}


def preset(name: str) -> NodeSpec:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError("unknown preset %r (known: %s)" % (name, ", ".join(sorted(PRESETS))))
