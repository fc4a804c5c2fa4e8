# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The errors of the driver code (``backend.py`` and the modules it is split into); every one
means the request was not met, and says whether the node was changed."""

from __future__ import annotations

from typing import Dict

from ..errors import MetaxGpuError


class DriverError(MetaxGpuError):
    """The request cannot be met (bad input, no package, wrong tool); nothing was changed."""


class DriverInUseError(DriverError):
    """The driver would be unloaded while GPUs are in use and ``force`` is off."""


class DriverCommandError(DriverError):
    """A package tool or the load command failed (the node may be half-way)."""


class DriverVerifyError(DriverError):
    """After the change the driver does not check out (version, /dev/mxcd, mx-smi)."""

    def __init__(self, message: str, checks: Dict[str, object]) -> None:
        super().__init__(message)
        self.checks = checks
