# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Which payload of maca.payload.images serves a node (maca/payload.py)."""

from __future__ import annotations

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.maca.layout import MacaLayoutError
from ansible_collections.metax.gpu.plugins.module_utils.maca.payload import product_of_image, select_image

C500 = "cr.metax-tech.com/library/maca-c500:2.23.0.4-ubuntu18.04-amd64"
N100 = "harbor.example.cn/mximages/mxn100-maca:2.29.0.7-ubuntu22.04-amd64"
REAL = "harbor.example.cn/mximages/mxc500-maca:2.29.0.7-ubuntu22.04-amd64"   # the real CR's (samples/kubernetes)


@pytest.mark.parametrize("ref, product", [
    (C500, "C500"), (N100, "N100"), (REAL, "C500"), ("maca-c500-container:2.23.0.4", "C500"),
    ("127.0.0.1:5000/metax-gpu/maca-n100:2.18.0.3", "N100"), ("r/maca:2.18.0.3", None), ("r/mxmaca-sdk:1.0", None),
])
def test_the_product_is_read_from_the_image_name_not_the_registry_or_tag(ref, product):
    assert product_of_image(ref) == product


def test_a_node_takes_its_products_image_then_its_familys():
    images = [N100, C500]
    assert select_image(images, ["N100"] * 4) == 0
    assert select_image(images, ["C500"] * 8) == 1
    # the real operator serves an MXC550 node with mxc500-maca: one MXMACA per family
    assert select_image(images, ["C550", "C550"]) == 1
    assert select_image([REAL, N100], ["C550"]) == 0


def test_a_single_image_serves_every_node_and_none_fits_is_an_error():
    assert select_image([REAL], ["N100"]) == 0
    with pytest.raises(MacaLayoutError, match="no MXMACA payload for N100"):
        select_image([C500, "r/maca-c600:1.0"], ["N100"])
    with pytest.raises(MacaLayoutError, match="empty"):
        select_image([], ["C500"])
    with pytest.raises(MacaLayoutError, match="no MetaX GPU"):
        select_image([C500], [])


def test_a_node_whose_gpus_need_two_payloads_is_refused():
    with pytest.raises(MacaLayoutError, match="need different MXMACA payloads"):
        select_image([C500, N100], ["C500", "N100"])
    # two products of one family share the payload
    assert select_image([C500, N100], ["C500", "C550"]) == 0


def test_discoverys_chip_names_and_a_family_only_answer_find_their_image():
    mxc550 = "r/mxc550-maca:2.24.0.0"
    # discovery spells products as MetaX's tools do (MXC550); the image says c550
    assert select_image([REAL, mxc550, N100], ["MXC550"] * 2) == 1
    assert select_image([REAL, mxc550, N100], ["MXC500"]) == 0
    assert select_image([REAL, mxc550, N100], ["MXN100"]) == 2
    # without mx-smi the PCI id may say only the family: the family's first image
    assert select_image([N100, mxc550, REAL], ["MXC"]) == 1
