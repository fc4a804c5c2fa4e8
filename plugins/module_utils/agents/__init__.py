# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Process entrypoints of the in-cluster agents: gpu-device, gpu-label, gpu-aware, gpu-exporter,
container-runtime, driver-manager, maca-manager and operator-controller."""
