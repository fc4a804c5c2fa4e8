# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Node labels published by gpu-label (DESIGN section 3, manual Table 2.7).

Pure: an :class:`~.model.Inventory` (or None when discovery found no MetaX
GPU), the driver state and the driver management mode in, a label map out.
The labeller owns exactly :data:`OWNED_LABEL_KEYS`; :func:`label_changes`
turns a desired map into a merge patch that also removes stale owned labels
(for example the version labels after the driver is unloaded).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Dict, List, Mapping, Optional, Tuple

from .. import names as N
from .model import DriverState, Inventory, family_of

# Every key the labeller may set, so it can delete the ones it no longer sets
# (names.py: the admission policy allows gpu-label exactly these).
OWNED_LABEL_KEYS: Tuple[str, ...] = N.GPU_LABEL_KEYS

DRIVER_MODES = ("native", "cloud")

# Kubernetes label values: empty, or up to 63 characters of [A-Za-z0-9._-]
# beginning and ending with an alphanumeric.
_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_MAX_VALUE = 63


def owned_label_keys() -> Tuple[str, ...]:
    return OWNED_LABEL_KEYS


def is_valid_label_value(value: str) -> bool:
    return len(value) <= _MAX_VALUE and bool(_VALUE_RE.match(value))


def label_value(text: str) -> str:
    """Coerce free text (a product name from new hardware) into a valid label value."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", text.strip())[:_MAX_VALUE]
    cleaned = re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", cleaned)
    return cleaned or "unknown"


def _joined(values: List[str]) -> str:
    """One value per node: the common one, or the distinct ones in GPU order joined by '_'.

    A mixed node then matches no single-product selector, which is the truth.
    """
    distinct = list(Counter(values))
    return label_value("_".join(label_value(v) for v in distinct))


def node_labels(inventory: Optional[Inventory], driver_mode: str,
                driver: Optional[DriverState] = None) -> Dict[str, str]:
    """The label map for a node.

    ``driver`` overrides ``inventory.driver`` (gpu-label may read the module
    state separately). No GPU: only ``gpu.installed=false``. Driver not
    loaded: ``driver.ready=false`` and no version labels (the version of a
    module that is not loaded means nothing for scheduling). A loaded driver
    whose version cannot be parsed keeps ``driver.ready=true`` and omits the
    parts it cannot read.
    """
    if driver_mode not in DRIVER_MODES:
        raise ValueError("driver mode must be one of %s, got %r" % ("/".join(DRIVER_MODES), driver_mode))
    if inventory is None or not inventory.gpus:
        return {N.LABEL_GPU_INSTALLED: "false"}
    state = driver if driver is not None else inventory.driver
    gpus = inventory.gpus
    labels = {
        N.LABEL_GPU_INSTALLED: "true",
        N.LABEL_DRIVER_READY: "true" if state.loaded else "false",
        N.LABEL_DRIVER_MODE: driver_mode,
        N.LABEL_GPU_FAMILY: _joined([g.family for g in gpus]),
        N.LABEL_GPU_PRODUCT: _joined([g.product for g in gpus]),
        N.LABEL_GPU_SRIOV: inventory.sriov.status,
        N.LABEL_GPU_VFNUM: str(inventory.sriov.numvfs) if inventory.sriov.numvfs > 0 else "0",
        N.LABEL_GPU_COUNT: str(len(gpus)),
    }
    memories = [g.memory_gib for g in gpus if g.memory_gib > 0]
    if memories:
        labels[N.LABEL_GPU_MEMORY] = _joined(["%dGB" % m for m in memories])
    if state.loaded:
        for key, part in zip((N.LABEL_DRIVER_MAJOR, N.LABEL_DRIVER_MINOR, N.LABEL_DRIVER_PATCH), state.version_parts):
            if part is not None:
                labels[key] = str(part)
    return labels


def keep_known_product(current: Mapping[str, str], desired: Dict[str, str]) -> Dict[str, str]:
    """``desired`` with the current ``gpu.product`` kept where discovery could say only the family.

    Without mx-smi (driver unloaded for an upgrade) the PCI id of an MXC500
    says only ``MXC``; the product mx-smi named on this node before is still
    the truth and a selector on it should not flap. Kept only while it is of
    the family discovery sees now.
    """
    product, family = desired.get(N.LABEL_GPU_PRODUCT), desired.get(N.LABEL_GPU_FAMILY)
    known = current.get(N.LABEL_GPU_PRODUCT)
    if product is None or product != family or not known or known == product:
        return desired
    if family_of(known) != family or family_of(known) == known:
        return desired
    return dict(desired, **{N.LABEL_GPU_PRODUCT: known})


def label_changes(current: Mapping[str, str], desired: Mapping[str, str]) -> Dict[str, Optional[str]]:
    """Merge patch for ``metadata.labels``: changed values, and None for owned keys to remove.

    Labels this module does not own are never touched. Empty when nothing changes.
    """
    patch: Dict[str, Optional[str]] = {}
    for key, value in desired.items():
        if current.get(key) != value:
            patch[key] = value
    for key in OWNED_LABEL_KEYS:
        if key in current and key not in desired:
            patch[key] = None
    return patch
