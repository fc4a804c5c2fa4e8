# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Waiting on the cluster: poll a predicate until it holds or fail the test saying what was awaited."""

from __future__ import annotations

import time
from typing import Callable

import pytest


def wait_until(predicate: Callable[[], object], timeout: float, what: str, interval: float = 1.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    pytest.fail("timed out after %ds waiting for %s" % (timeout, what))
