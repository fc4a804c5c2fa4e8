# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""GPUs for virtual machines (issue 43): hand MetaX GPUs to ``vfio-pci`` and back.

Standard library only and no ``ansible`` import: the ``metax.gpu.gpu_passthrough``
module and the operator's vfio-manager agent use it unchanged (the vfnum shape:
:mod:`.plan` is pure, :mod:`.backend` does the I/O through a HostRoot).
"""
