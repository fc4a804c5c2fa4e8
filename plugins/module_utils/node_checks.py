# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Is a GPU node as it should be? Pure checks over a Node object (as a dict).

The one definition the filter plugins share (verify's ``gpu_extensions``,
``driver_upgrade``'s validation, ``vfnum``'s node check): filter plugins
import module_utils, never each other.
"""

from __future__ import annotations

import json
from typing import Any, List, Mapping

from . import names as N

# gpu-label's labels on a node with MetaX GPUs and a loaded driver (manual Table 2.7).
REQUIRED_LABELS = (
    N.LABEL_GPU_INSTALLED, N.LABEL_DRIVER_READY, N.LABEL_DRIVER_MAJOR, N.LABEL_DRIVER_MINOR,
    N.LABEL_DRIVER_PATCH, N.LABEL_DRIVER_MODE, N.LABEL_GPU_FAMILY, N.LABEL_GPU_MEMORY,
    N.LABEL_GPU_PRODUCT, N.LABEL_GPU_SRIOV, N.LABEL_GPU_VFNUM,
)


def as_int(value: Any) -> int:
    """An int from a label or status value; -1 when it is none."""
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return -1


def gpu_node_problems(node: Mapping[str, Any]) -> List[str]:
    """Problems of one Node object: missing labels, capacity != devices x vfnum, allocatable != healthy;
    on a node in DRA mode, any device-plugin allocatable."""
    meta = node.get("metadata") or {}
    labels: Mapping[str, str] = meta.get("labels") or {}
    annotations: Mapping[str, str] = meta.get("annotations") or {}
    status = node.get("status") or {}
    problems: List[str] = []
    missing = [key for key in REQUIRED_LABELS if key not in labels]
    if missing:
        problems.append("missing labels " + ", ".join(missing))
    if labels.get(N.LABEL_GPU_INSTALLED) == "false":
        problems.append("gpu-label found no MetaX GPU (%s=false)" % N.LABEL_GPU_INSTALLED)
    if labels.get(N.LABEL_DRIVER_READY) == "false":
        problems.append("the MetaX driver is not loaded (%s=false)" % N.LABEL_DRIVER_READY)
    count = as_int(labels.get(N.LABEL_GPU_COUNT))
    vfnum = as_int(labels.get(N.LABEL_GPU_VFNUM, "0"))
    capacity = as_int((status.get("capacity") or {}).get(N.RESOURCE_NAME))
    allocatable = as_int((status.get("allocatable") or {}).get(N.RESOURCE_NAME))
    if labels.get(N.LABEL_DEVICE_MODE) == N.DEVICE_MODE_DRA:
        # gpu-dra serves the node (ResourceSlices, docs/dra.md): no device-plugin capacity is expected, and
        # any allocatable would be the node served by both
        if allocatable > 0:
            problems.append("%s=%s but the device plugin serves allocatable %s=%d too"
                            % (N.LABEL_DEVICE_MODE, N.DEVICE_MODE_DRA, N.RESOURCE_NAME, allocatable))
        return problems
    if capacity < 0:
        problems.append("no %s in capacity (is gpu-device running on the node?)" % N.RESOURCE_NAME)
    elif count >= 0:
        expected = count * vfnum if vfnum > 0 else count
        if capacity != expected:
            problems.append("capacity %s=%d, expected %d (%d GPUs x vfnum %d)"
                            % (N.RESOURCE_NAME, capacity, expected, count, vfnum))
    raw = annotations.get(N.ANNOTATION_DEVICES)
    if raw is not None and capacity >= 0:
        try:
            devices = json.loads(raw)
            healthy = sum(1 for d in devices if isinstance(d, dict) and d.get("health") == "Healthy")
        except ValueError:
            problems.append("annotation %s is not JSON" % N.ANNOTATION_DEVICES)
        else:
            if allocatable != healthy:
                problems.append("allocatable %s=%d, expected %d healthy devices"
                                % (N.RESOURCE_NAME, allocatable, healthy))
    elif capacity >= 0 and allocatable > capacity:
        problems.append("allocatable %d exceeds capacity %d" % (allocatable, capacity))
    return problems
