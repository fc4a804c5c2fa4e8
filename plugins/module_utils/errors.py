# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The collection's one error base.

Every error the library raises on purpose derives from :class:`MetaxGpuError`,
so a module catches exactly one type at its boundary and turns it into
``fail_json(msg=str(exc))``; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class MetaxGpuError(Exception):
    """An expected failure with a message written for the administrator."""
