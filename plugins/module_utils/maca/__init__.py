# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""MXMACA on the host: versioned directories behind an atomically switched /opt/maca (docs/runtime.md)."""
