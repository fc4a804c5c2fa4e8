# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Argument specs shared by the node-side modules (kept next to the doc fragments)."""

from __future__ import annotations

HOST_ROOT_ARGSPEC = {
    "host_root": {"type": "path", "default": "/"},
}
