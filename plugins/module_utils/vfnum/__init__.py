# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""GPU virtualisation (vfnum, SR-IOV VFs per GPU): plan, in-use check, apply.

Standard library only and no ``ansible`` import: the ``metax.gpu.vfnum``
module uses it today, an in-cluster driver manager can use it unchanged.
"""
