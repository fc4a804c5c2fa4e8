# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Product names (issue 38): the chip names MetaX's tools and labels use, the manual's spelling, the PCI ids."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from ansible_collections.metax.gpu.plugins.module_utils.gpu import labels as L
from ansible_collections.metax.gpu.plugins.module_utils.gpu.model import (
    PCI_DEVICE_IDS, PRODUCT_LIST, PRODUCTS_BY_NAME, VF_DEVICE_ID_FLAG, chip_name, family_of, identify_device_id,
    manual_name, product_aliases, same_product,
)


@pytest.mark.parametrize("printed, chip, manual, family", [
    ("MetaX C500", "MXC500", "C500", "MXC"), ("MXC500", "MXC500", "C500", "MXC"), ("c550", "MXC550", "C550", "MXC"),
    ("MXC550-PL", "MXC550-PL", "C550-PL", "MXC"), ("  metax   N260 ", "MXN260", "N260", "MXN"),
    ("MXN100", "MXN100", "N100", "MXN"), ("MXC", "MXC", "MXC", "MXC"), ("", "", "", "unknown"),
    ("Moffett S4", "MOFFETT S4", "MOFFETT S4", "unknown"),
])
def test_every_spelling_of_a_product(printed, chip, manual, family):
    assert chip_name(printed) == chip and manual_name(printed) == manual and family_of(printed) == family


def test_selectors_accept_both_spellings_and_both_find_the_product():
    assert product_aliases("MXC500") == ("MXC500", "C500") == product_aliases("C500")
    assert same_product("C500", "MetaX C500") and same_product("mxc500", "MXC500")
    assert not same_product("C500", "C550") and not same_product("", "")
    for info in PRODUCT_LIST:
        assert PRODUCTS_BY_NAME[info.name] is PRODUCTS_BY_NAME[info.manual_name] is info
        assert info.name.startswith(info.family)


def test_a_pci_id_names_a_product_only_when_no_other_shows_it():
    for device_id, names in PCI_DEVICE_IDS.items():
        for fn_id in (device_id, device_id | VF_DEVICE_ID_FLAG):
            found = identify_device_id(fn_id)
            assert found is not None and found.exact == (len(names) == 1)
            assert found.product == (names[0] if found.exact else found.family)
    assert identify_device_id(0x4001).product == "MXC" and identify_device_id(0x4001).memory_gib == 64
    assert identify_device_id(0x2000).product == "MXN100"
    assert identify_device_id(0x1234) is None
    # the simulator gives every product an id of the table, and a real MXC500's
    assert PRODUCTS_BY_NAME["MXC500"].pci_device_id == 0x4001
    assert all(p.name in PCI_DEVICE_IDS[p.pci_device_id] for p in PRODUCT_LIST)


@given(st.text(max_size=40))
def test_any_printed_name_gives_a_valid_label_value_and_a_stable_chip_name(text):
    chip = chip_name(text)
    assert chip_name(chip) == chip                       # idempotent
    assert L.is_valid_label_value(L.label_value(chip))
    assert same_product(manual_name(text), chip) == bool(chip.strip())
