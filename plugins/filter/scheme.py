# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Filters of the install and uninstall roles: which scheme is installed, and whether another may be.

The logic is module_utils/scheme.py (pure, unit-tested); these only expose it.
"""

from __future__ import annotations

from ansible_collections.metax.gpu.plugins.module_utils.scheme import installed_schemes, releases_of, scheme_refusal


class FilterModule:
    """metax.gpu scheme filters."""

    def filters(self):
        return {
            "installed_schemes": installed_schemes,
            "scheme_refusal": scheme_refusal,
            "scheme_releases": releases_of,
        }
