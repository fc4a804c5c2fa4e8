# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The GPU Operator scheme's library: component contract, CR <-> values mapping, rendering, status."""
