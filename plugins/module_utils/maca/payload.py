# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Which of the GPU Operator's ``maca.payload.images`` serves a node (pure).

The vendor names an MXMACA payload image by product: ``maca-c500:<tag>``
(manual section 1.4.3) or ``mxc500-maca:<tag>`` (the real operator's CR).
A node takes the image of its GPUs' product; failing that, one of the same
family (the real CR serves an MXC550 node with ``mxc500-maca``: one MXMACA
per family); failing that, the only image listed. Standard library only:
this runs on nodes.
"""

from __future__ import annotations

import re
from typing import Optional, Sequence

from ..gpu.model import family_of, same_product
from .layout import MacaLayoutError

# c500 in maca-c500, mxc500-maca, maca-c500-container
_PRODUCT_TOKEN = re.compile(r"(?:^|[-_])(?:mx)?([a-z]\d{3})(?:$|[-_])")


def product_of_image(ref: str) -> Optional[str]:
    """``C500`` of ``.../maca-c500:2.18.0.3-ubuntu18.04-amd64`` (None: the name names no product)."""
    name = ref.rsplit("/", 1)[-1].partition(":")[0].partition("@")[0].lower()
    match = _PRODUCT_TOKEN.search(name)
    return match.group(1).upper() if match else None


def _family(product: Optional[str]) -> Optional[str]:
    family = family_of(product or "")
    return None if family == "unknown" else family


def select_image(images: Sequence[str], products: Sequence[str]) -> int:
    """The index in ``images`` of the payload for a node whose GPUs are ``products``.

    MacaLayoutError when none fits, or when the node's products would need
    two different payloads (one /opt/maca per node).
    """
    if not images:
        raise MacaLayoutError("maca.payload.images is empty")
    wanted = sorted(set(products))
    if not wanted:
        raise MacaLayoutError("no MetaX GPU found on the node")
    named = [product_of_image(ref) for ref in images]
    chosen = set()
    for product in wanted:
        # the image says c500, discovery MXC500 (the chip name): one product, two spellings
        exact = [i for i, p in enumerate(named) if p is not None and same_product(p, product)]
        family = [i for i, p in enumerate(named) if p is not None and _family(p) == _family(product)
                  and _family(product) is not None]
        if exact:
            chosen.add(exact[0])
        elif family:
            chosen.add(family[0])
        elif len(images) == 1:
            chosen.add(0)
        else:
            raise MacaLayoutError("no MXMACA payload for %s among %s" % (product, ", ".join(images)))
    if len(chosen) > 1:
        raise MacaLayoutError("the node's GPUs (%s) need different MXMACA payloads (%s): one /opt/maca per node"
                              % (", ".join(wanted), ", ".join(images[i] for i in sorted(chosen))))
    return chosen.pop()
