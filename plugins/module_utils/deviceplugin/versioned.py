# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""A state whose changes carry a version number that ListAndWatch streams wait on.

Shared by gpu-device's DeviceState and vfio-manager's GroupState: a subclass
changes its data under ``self._cond``, then bumps ``self._version`` and
notifies; a stream waits for a version other than the one it sent, or for a
:meth:`wake` at shutdown.
"""

from __future__ import annotations

import threading


class Versioned:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._version = 0
        self._wakeups = 0

    @property
    def version(self) -> int:
        with self._cond:
            return self._version

    def wait_for_change(self, version: int, timeout: float) -> int:
        """Block until the version differs from ``version``, :meth:`wake` or ``timeout``."""
        with self._cond:
            wakeups = self._wakeups
            self._cond.wait_for(lambda: self._version != version or self._wakeups != wakeups, timeout=timeout)
            return self._version

    def wake(self) -> None:
        """Wake every waiter (used at shutdown)."""
        with self._cond:
            self._wakeups += 1
            self._cond.notify_all()
