# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Inventory and topology model shared by discovery, allocator, labels and agents.

Pure data: no I/O here. Discovery (:mod:`.discovery`) fills it from a host
root; the allocator and label code read it.
"""

from __future__ import annotations

import enum
import re
from dataclasses import asdict, dataclass, field
from typing import Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple


class LinkClass(enum.IntEnum):
    """How two devices communicate; a larger value is a closer link.

    The order is the manual's rule (1): MetaXLink beats any PCIe path. The
    PCIe classes follow the ``mx-smi topo -m`` legend (same meaning as
    nvidia-smi's): PIX one switch, PXB several switches, PHB through a host
    bridge, NODE across host bridges of one NUMA node, SYS across NUMA nodes.
    ``SAME_GPU`` joins two VFs of one physical GPU (the closest pair).
    """

    SYS = 0
    NODE = 1
    PHB = 2
    PXB = 3
    PIX = 4
    MX = 5
    SAME_GPU = 6

    @property
    def legend(self) -> str:
        return "VF" if self is LinkClass.SAME_GPU else self.name

    @classmethod
    def from_legend(cls, text: str) -> "LinkClass":
        key = text.strip().upper()
        if key == "VF":
            return cls.SAME_GPU
        # real tools print MetaXLink with a link count (MX1, MX2, ...)
        if key.startswith("MX") and key[2:].isdigit():
            return cls.MX
        try:
            return cls[key]
        except KeyError:
            raise ValueError("unknown link class %r" % text)


_VENDOR_PREFIX = re.compile(r"^\s*metax\s+", re.IGNORECASE)
# a MetaX product code: a series letter and digits (C500, N260), maybe a suffix (C550-PL)
_CODE = re.compile(r"^(MX)?([A-Z]\d{2,}(?:[-_ ]?[A-Z0-9]+)*)$")
_FAMILY = re.compile(r"^(MX[A-Z])\d")
_FAMILY_ONLY = re.compile(r"^MX[A-Z]$")


def chip_name(text: str) -> str:
    """Any spelling of a product -> its chip name: ``MetaX C500``, ``C500``, ``mxc500`` -> ``MXC500``.

    A suffix stays (``MXC550-PL``). What does not look like a MetaX product
    code is returned upper-cased and otherwise as printed.
    """
    cleaned = " ".join(_VENDOR_PREFIX.sub("", text.strip()).split()).upper()
    found = _CODE.match(cleaned)
    return "MX" + found.group(2) if found else cleaned


def manual_name(text: str) -> str:
    """The manual's older spelling: ``MXC500`` -> ``C500`` (a name without ``MX`` as it is)."""
    found = _CODE.match(chip_name(text))
    return found.group(2) if found else chip_name(text)


def product_aliases(text: str) -> Tuple[str, ...]:
    """The spellings a selector accepts for one product: ``("MXC500", "C500")``."""
    names = (chip_name(text), manual_name(text))
    return tuple(dict.fromkeys(n for n in names if n))


def same_product(a: str, b: str) -> bool:
    """True when two spellings name one product (``C500`` and ``MetaX C500`` and ``MXC500``)."""
    return bool(a.strip()) and chip_name(a) == chip_name(b)


@dataclass(frozen=True)
class ProductInfo:
    """What the label code needs to know about a GPU model."""

    name: str          # the chip name MetaX's tools and labels use, e.g. "MXC500"
    family: str        # e.g. "MXC"
    memory_gib: int    # e.g. 64
    pci_device_id: int  # the id the simulator gives it (real ids: PCI_DEVICE_IDS)

    @property
    def manual_name(self) -> str:
        """The manual's older spelling, e.g. ``C500``."""
        return manual_name(self.name)


# Known MetaX products by chip name: the name ``mx-smi -L``, ``mx-smi -j`` and
# MetaX's own node labels (operator 0.9.2: ``gpu.product: MXC550``) use.
# Unknown names are still reported as printed, so new hardware never hides a GPU.
PRODUCT_LIST: Tuple[ProductInfo, ...] = (
    ProductInfo("MXC500", "MXC", 64, 0x4001),    # a real MXC500 shows 9999:4001 in lspci
    ProductInfo("MXC550", "MXC", 64, 0x4000),
    ProductInfo("MXN100", "MXN", 16, 0x2000),
)
# Both spellings find a product: the chip name and the manual's (``C500``).
PRODUCTS_BY_NAME: Dict[str, ProductInfo] = dict(
    [(p.name, p) for p in PRODUCT_LIST] + [(p.manual_name, p) for p in PRODUCT_LIST])
# The products a PCI device id may be. A real MXC500 shows 9999:4001; no
# capture says which id an MXC550 shows, and a board variant of a chip can
# keep the chip's id, so the MXC ids name only the family: the PCI fallback
# never names a product it cannot tell apart (docs/discovery.md).
PCI_DEVICE_IDS: Dict[int, Tuple[str, ...]] = {
    0x4001: ("MXC500", "MXC550"),
    0x4000: ("MXC500", "MXC550"),
    0x2000: ("MXN100",),
}
METAX_VENDOR_ID = 0x9999
# VFs report their own device id: PF id | 0x0800 (convention of the simulator
# and of the products above).
VF_DEVICE_ID_FLAG = 0x0800


def family_of(name: str) -> str:
    """``MXC`` of ``MXC550-PL`` (a known product's family, else the chip name's prefix); "unknown" otherwise."""
    known = PRODUCTS_BY_NAME.get(chip_name(name))
    if known is not None:
        return known.family
    if _FAMILY_ONLY.match(chip_name(name)):
        return chip_name(name)      # the PCI fallback's answer for a shared id
    found = _FAMILY.match(chip_name(name))
    return found.group(1) if found else "unknown"


@dataclass(frozen=True)
class PciIdentity:
    """What a PCI device id alone says: the product when only one may show it, else its family."""

    product: str       # "MXN100", or the family ("MXC") when the id is shared
    family: str
    memory_gib: int    # 0 when the candidates differ
    exact: bool        # the id names exactly one product


def identify_device_id(device_id: int) -> Optional[PciIdentity]:
    """The identity a PF's (or VF's) device id gives, or None for an unknown id."""
    names = PCI_DEVICE_IDS.get(device_id & ~VF_DEVICE_ID_FLAG)
    if not names:
        return None
    infos = [PRODUCTS_BY_NAME[n] for n in names]
    families = {i.family for i in infos}
    memories = {i.memory_gib for i in infos}
    family = families.pop() if len(families) == 1 else "unknown"
    memory = memories.pop() if len(memories) == 1 else 0
    if len(infos) == 1:
        return PciIdentity(infos[0].name, family, memory, True)
    return PciIdentity(family, family, memory, False)


@dataclass(frozen=True)
class PciPath:
    """Where a PCI function sits: its root complex and the bridges above it."""

    root_complex: str                  # e.g. "pci0000:00"
    bridges: Tuple[str, ...]           # BDFs from the root port down to the parent

    @property
    def switch(self) -> Optional[str]:
        """The PCIe switch (its upstream port BDF) directly above the device.

        A device behind a switch has ``... upstream port, downstream port``
        as its last two bridges, below a root port.
        """
        if len(self.bridges) >= 3:
            return self.bridges[-2]
        return None


@dataclass(frozen=True)
class Gpu:
    """A physical MetaX GPU (a PCI physical function)."""

    index: int
    bdf: str
    pci_device_id: int
    product: str
    family: str
    memory_gib: int
    numa_node: int
    pci_path: PciPath
    driver_bound: bool
    uuid: Optional[str] = None
    serial: Optional[str] = None
    healthy: bool = True               # mx-smi reports it available
    drm_card: Optional[str] = None     # "card0"
    drm_render: Optional[str] = None   # "renderD128"
    sriov_totalvfs: int = 0
    sriov_numvfs: int = 0
    vf_bdfs: Tuple[str, ...] = ()

    @property
    def switch(self) -> Optional[str]:
        return self.pci_path.switch


@dataclass(frozen=True)
class Device:
    """One allocatable unit: a whole GPU, or one VF of a GPU under SR-IOV.

    ``id`` is the PCI address (stable across reboots and independent of
    enumeration order); ``index`` is the node-local position used in CLIs.
    """

    id: str
    index: int
    gpu_index: int
    bdf: str
    is_vf: bool
    numa_node: int
    healthy: bool
    drm_card: Optional[str] = None
    drm_render: Optional[str] = None
    uuid: Optional[str] = None


@dataclass(frozen=True)
class LinkGroup:
    """Devices that share the best interconnect: a MetaXLink group or a PCIe switch."""

    kind: str                  # "metaxlink" | "pcie-switch" | "none"
    gpu_indices: Tuple[int, ...]


@dataclass(frozen=True)
class Topology:
    """Pairwise link classes between devices (by device index)."""

    device_indices: Tuple[int, ...]
    links: Dict[Tuple[int, int], LinkClass] = field(hash=False)
    link_groups: Tuple[LinkGroup, ...] = ()
    metaxlink_known: bool = True

    def link(self, a: int, b: int) -> LinkClass:
        if a == b:
            raise ValueError("no link between a device and itself (%d)" % a)
        key = (a, b) if a < b else (b, a)
        return self.links[key]

    def matrix(self) -> List[List[Optional[LinkClass]]]:
        """Square matrix in ``device_indices`` order (None on the diagonal)."""
        return [[None if a == b else self.link(a, b) for b in self.device_indices]
                for a in self.device_indices]


def pair_key(a: int, b: int) -> Tuple[int, int]:
    return (a, b) if a < b else (b, a)


def build_topology(device_indices: Iterable[int], link_of, link_groups: Sequence[LinkGroup] = (),
                   metaxlink_known: bool = True) -> Topology:
    """Build a Topology from a pair function ``link_of(a, b) -> LinkClass``."""
    indices = tuple(sorted(device_indices))
    links = {}
    for i, a in enumerate(indices):
        for b in indices[i + 1:]:
            links[(a, b)] = link_of(a, b)
    return Topology(indices, links, tuple(link_groups), metaxlink_known)


@dataclass(frozen=True)
class DriverState:
    loaded: bool
    version: Optional[str] = None      # e.g. "2.14.6"

    @property
    def version_parts(self) -> Tuple[Optional[int], Optional[int], Optional[int]]:
        if not self.version:
            return (None, None, None)
        nums: List[Optional[int]] = []
        for part in self.version.split(".")[:3]:
            digits = "".join(ch for ch in part if ch.isdigit())
            nums.append(int(digits) if digits else None)
        while len(nums) < 3:
            nums.append(None)
        return (nums[0], nums[1], nums[2])


@dataclass(frozen=True)
class SriovState:
    capable: bool
    totalvfs: int = 0
    numvfs: int = 0   # per GPU; 0 = not virtualised

    @property
    def status(self) -> str:
        """The ``gpu.sriov`` label value: on, off or forbidden."""
        if not self.capable:
            return "forbidden"
        return "on" if self.numvfs > 0 else "off"


@dataclass(frozen=True)
class Inventory:
    """Everything discovery knows about one node."""

    gpus: Tuple[Gpu, ...]
    devices: Tuple[Device, ...]
    topology: Topology
    driver: DriverState
    sriov: SriovState
    mx_smi_available: bool
    maca_version: Optional[str] = None
    warnings: Tuple[str, ...] = ()
    # the warnings about mx-smi output that was not understood (also in ``warnings``)
    unparsed: Tuple[str, ...] = ()

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    def device_by_id(self, device_id: str) -> Device:
        for dev in self.devices:
            if dev.id == device_id:
                return dev
        raise KeyError(device_id)

    def to_dict(self) -> dict:
        """JSON-friendly form (the ``metax_gpu`` fact)."""
        return inventory_to_dict(self)


def _link_group_dicts(groups: Sequence[LinkGroup]) -> List[dict]:
    return [{"kind": g.kind, "gpus": list(g.gpu_indices)} for g in groups]


def inventory_to_dict(inv: Inventory) -> dict:
    gpus = []
    for gpu in inv.gpus:
        item = asdict(gpu)
        item["pci_path"] = {"root_complex": gpu.pci_path.root_complex,
                            "bridges": list(gpu.pci_path.bridges)}
        item["switch"] = gpu.switch
        item["vf_bdfs"] = list(gpu.vf_bdfs)
        item["pci_device_id"] = "0x%04x" % gpu.pci_device_id
        gpus.append(item)
    topo = inv.topology
    return {
        "present": bool(inv.gpus),
        "gpu_count": len(inv.gpus),
        "device_count": len(inv.devices),
        "gpus": gpus,
        "devices": [asdict(d) for d in inv.devices],
        "topology": {
            "device_indices": list(topo.device_indices),
            "matrix": [[None if c is None else c.legend for c in row] for row in topo.matrix()],
            "link_groups": _link_group_dicts(topo.link_groups),
            "metaxlink_known": topo.metaxlink_known,
        },
        "driver": {"loaded": inv.driver.loaded, "version": inv.driver.version,
                   "major": inv.driver.version_parts[0], "minor": inv.driver.version_parts[1],
                   "patch": inv.driver.version_parts[2]},
        "sriov": {"capable": inv.sriov.capable, "totalvfs": inv.sriov.totalvfs,
                  "numvfs": inv.sriov.numvfs, "status": inv.sriov.status},
        "mx_smi_available": inv.mx_smi_available,
        "maca_version": inv.maca_version,
        "warnings": list(inv.warnings),
    }


def healthy_device_indices(inv: Inventory) -> FrozenSet[int]:
    return frozenset(d.index for d in inv.devices if d.healthy)
