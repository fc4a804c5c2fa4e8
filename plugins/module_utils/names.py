# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Names the cluster sees: the one place they are defined (DESIGN section 3).

Resource, label and annotation keys, ConfigMap and image names are contracts
with the kubelet, the scheduler, HAMi and administrators' selectors. Every
other module imports them from here.
"""

from __future__ import annotations

DOMAIN = "metax-tech.com"
PREFIX = DOMAIN + "/"

# Extended resource: one device per GPU, or per VF when vfnum > 1.
RESOURCE_NAME = PREFIX + "gpu"

# Node annotations published by gpu-device.
ANNOTATION_SCORES = PREFIX + "gpu.topology.scores"
ANNOTATION_LOSSES = PREFIX + "gpu.topology.losses"
ANNOTATION_DEVICES = PREFIX + "gpu.devices"
ANNOTATION_KEYS = (ANNOTATION_SCORES, ANNOTATION_LOSSES, ANNOTATION_DEVICES)

# ConfigMap holding gpu-aware's weights (manual Table 2.5).
GPU_AWARE_CONFIGMAP = "gpu-aware-plugin"
