from __future__ import annotations

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.gpu.model import LinkClass, PciPath
from ansible_collections.metax.gpu.plugins.module_utils.gpu.pci import normalize_bdf, pci_link


@pytest.mark.parametrize("raw, expected", [
    ("0000:03:00.0", "0000:03:00.0"), ("00000000:0A:00.1", "0000:0a:00.1"), ("03:00.0", "0000:03:00.0")])
def test_normalize_bdf(raw, expected):
    assert normalize_bdf(raw) == expected


@pytest.mark.parametrize("raw", ["", "zz", "0000:03:00", "0000:03:00.9"])
def test_normalize_bdf_rejects_garbage(raw):
    with pytest.raises(ValueError):
        normalize_bdf(raw)


def path(rc, *bridges):
    return PciPath(rc, tuple(bridges))


def test_pci_link_classes():
    sw_a = path("pci0000:00", "rp0", "up1", "dn1a")
    sw_a2 = path("pci0000:00", "rp0", "up1", "dn1b")
    nested = path("pci0000:00", "rp0", "up1", "dn1c", "up2", "dn2a")
    other_port = path("pci0000:00", "rp1", "up3", "dn3a")
    other_rc = path("pci0000:40", "rp9", "up9", "dn9")
    assert pci_link(sw_a, 0, sw_a2, 0) == LinkClass.PIX
    assert pci_link(sw_a, 0, nested, 0) == LinkClass.PXB
    assert pci_link(sw_a, 0, other_port, 0) == LinkClass.PHB
    assert pci_link(sw_a, 0, other_rc, 0) == LinkClass.NODE
    assert pci_link(sw_a, 0, other_rc, 1) == LinkClass.SYS
    assert sw_a.switch == "up1" and nested.switch == "up2" and path("pci0000:00", "rp").switch is None
