# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Names shared with the kubelet and the rest of the cluster (DESIGN section 3)."""

from __future__ import annotations

# Re-exported: the deviceplugin modules read them as C.ANNOTATION_*.
from ..names import ANNOTATION_DEVICES, ANNOTATION_KEYS, ANNOTATION_LOSSES, ANNOTATION_SCORES  # noqa: F401  pylint: disable=unused-import

# Re-exported: the kubelet's sockets and versions (kubelet/constants.py is their home).
from ..kubelet.constants import API_VERSION, DEVICE_PLUGIN_DIR, KUBELET_SOCKET_NAME, POD_RESOURCES_SOCKET  # noqa: F401  pylint: disable=unused-import

# kubelet device-plugin API (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1)
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
# our socket in the device-plugin directory: metax-gpu-<random>.sock, a new
# name each time the server starts (see server.PluginServer)
PLUGIN_SOCKET_PREFIX = "metax-gpu-"

# Node annotations published by gpu-device: gpu-aware reads all three; HAMi
# reads only the two topology tables (never gpu.devices): ANNOTATION_* above,
# from names.py, where the admission policy's allowed set for gpu-device
# comes from.

# What a container gets from Allocate.
DEVICE_MXCD = "/dev/mxcd"
DRI_DIR = "/dev/dri"
ENV_VISIBLE_DEVICES = "METAX_VISIBLE_DEVICES"      # device IDs (PCI addresses), comma separated
ENV_DEVICE_INDICES = "METAX_DEVICE_INDICES"         # node-local device indices, same order
ENV_DEVICE_UUIDS = "METAX_DEVICE_UUIDS"             # GPU UUIDs where mx-smi reported them
DEVICE_PERMISSIONS = "rw"
