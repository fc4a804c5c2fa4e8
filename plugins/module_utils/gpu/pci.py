# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""PCI discovery of MetaX functions from sysfs (through a HostRoot)."""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import List, Optional, Tuple

from ..errors import MetaxGpuError
from ..host import HostRoot, HostRootError
from .model import METAX_VENDOR_ID, PciPath, LinkClass

PCI_DEVICES = "sys/bus/pci/devices"
BDF_RE = re.compile(r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")


class PciScanError(MetaxGpuError):
    """sysfs holds something discovery cannot interpret."""


def normalize_bdf(text: str) -> str:
    """``00000000:03:00.0`` / ``03:00.0`` -> ``0000:03:00.0`` (lower case)."""
    raw = text.strip().lower()
    parts = raw.split(":")
    if len(parts) == 2:
        parts = ["0000"] + parts
    if len(parts) != 3:
        raise ValueError("not a PCI address: %r" % text)
    domain = "%04x" % int(parts[0], 16)
    result = "%s:%s:%s" % (domain, parts[1], parts[2])
    if not BDF_RE.match(result):
        raise ValueError("not a PCI address: %r" % text)
    return result


@dataclass(frozen=True)
class PciFunction:
    bdf: str
    device_id: int
    numa_node: int
    path: PciPath
    driver: Optional[str]
    physfn: Optional[str]           # the PF's BDF when this is a VF
    sriov_totalvfs: int
    sriov_numvfs: int
    drm_card: Optional[str]
    drm_render: Optional[str]
    serial: Optional[str] = None    # PCIe Device Serial Number, as lspci prints it


# PCIe extended capabilities start after the 256-byte legacy config space;
# each header is ID (16 bits), version (4), next offset (12).
_EXT_CAP_START = 0x100
_EXT_CAP_DSN = 0x0003


def device_serial_number(config: bytes) -> Optional[str]:
    """The Device Serial Number capability of a config-space dump, or None.

    Formatted as ``lspci -vv`` does (``xx-xx-xx-xx-xx-xx-xx-xx``, most
    significant byte first). sysfs shows the extended space only to root;
    a short read simply has no serial.
    """
    offset, seen = _EXT_CAP_START, set()
    while offset >= _EXT_CAP_START and offset + 12 <= len(config) and offset not in seen:
        seen.add(offset)
        header = struct.unpack_from("<I", config, offset)[0]
        if header in (0, 0xFFFFFFFF):
            return None
        if header & 0xFFFF == _EXT_CAP_DSN:
            value = struct.unpack_from("<Q", config, offset + 4)[0]
            return "-".join("%02x" % b for b in value.to_bytes(8, "big"))
        offset = (header >> 20) & 0xFFC
    return None


def _read_serial(host: HostRoot, base: str) -> Optional[str]:
    try:
        with open(host.join(base + "/config"), "rb") as handle:
            return device_serial_number(handle.read(4096))
    except OSError:
        return None


def _pci_path(host: HostRoot, link: str) -> PciPath:
    real = host.realpath(link)
    parts = [p for p in real.split("/") if p]
    try:
        start = parts.index("devices")
    except ValueError:
        raise PciScanError("%s does not resolve into /sys/devices (got %s)" % (host.join(link), real))
    tree = parts[start + 1:]
    if len(tree) < 2 or not tree[0].startswith("pci"):
        raise PciScanError("%s: no PCI root complex in %s" % (host.join(link), real))
    bridges = tuple(p.lower() for p in tree[1:-1] if BDF_RE.match(p))
    return PciPath(root_complex=tree[0].lower(), bridges=bridges)


def _drm_nodes(host: HostRoot, base: str) -> Tuple[Optional[str], Optional[str]]:
    card = render = None
    for name in host.listdir(base + "/drm"):
        if name.startswith("card") and name[4:].isdigit():
            card = name
        elif name.startswith("renderD") and name[7:].isdigit():
            render = name
    return card, render


def read_function(host: HostRoot, bdf: str) -> Optional[PciFunction]:
    """The MetaX function at ``bdf``, or None for other vendors."""
    base = "%s/%s" % (PCI_DEVICES, bdf)
    vendor = host.read_int(base + "/vendor", base=16)
    if vendor != METAX_VENDOR_ID:
        return None
    driver_link = host.readlink(base + "/driver")
    physfn_link = host.readlink(base + "/physfn")
    card, render = _drm_nodes(host, base)
    numa = host.read_int(base + "/numa_node", default=-1)
    return PciFunction(
        bdf=normalize_bdf(bdf),
        device_id=host.read_int(base + "/device", base=16),
        numa_node=numa,
        path=_pci_path(host, base),
        driver=driver_link.rstrip("/").rsplit("/", 1)[-1] if driver_link else None,
        physfn=normalize_bdf(physfn_link.rstrip("/").rsplit("/", 1)[-1]) if physfn_link else None,
        sriov_totalvfs=host.read_int(base + "/sriov_totalvfs", default=0),
        sriov_numvfs=host.read_int(base + "/sriov_numvfs", default=0),
        drm_card=card,
        drm_render=render,
        serial=None if physfn_link else _read_serial(host, base),
    )


def scan(host: HostRoot) -> List[PciFunction]:
    """All MetaX PCI functions (PFs and VFs), sorted by address."""
    found = []
    for name in host.listdir(PCI_DEVICES):
        if not BDF_RE.match(name):
            raise PciScanError("unexpected entry %r in %s" % (name, host.join(PCI_DEVICES)))
        try:
            function = read_function(host, name)
        except HostRootError as exc:
            raise PciScanError(str(exc))
        if function is not None:
            found.append(function)
    return sorted(found, key=lambda f: f.bdf)


def pci_link(a: PciPath, numa_a: int, b: PciPath, numa_b: int) -> LinkClass:
    """The PCIe link class of two devices from their positions in the tree."""
    if a.root_complex != b.root_complex:
        return LinkClass.NODE if numa_a == numa_b else LinkClass.SYS
    if not a.bridges or not b.bridges or a.bridges[0] != b.bridges[0]:
        return LinkClass.PHB   # different root ports: through the host bridge
    if a.switch is not None and a.switch == b.switch:
        return LinkClass.PIX
    return LinkClass.PXB
