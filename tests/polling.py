# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Waiting in tests: poll a predicate until it holds, or fail saying what was awaited and why it may not have come."""

from __future__ import annotations

import time
from typing import Callable, Iterable, Optional, TypeVar

import pytest

T = TypeVar("T")


def poll(predicate: Callable[[], T], timeout: float, interval: float = 1.0) -> Optional[T]:
    """The predicate's first truthy value, or None once ``timeout`` has passed (for callers with a fallback)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            return None
        time.sleep(interval)


def wait_until(predicate: Callable[[], T], timeout: float, what: str = "the condition", interval: float = 1.0,
               diagnose: Iterable[Callable[[], str]] = ()) -> T:
    """The predicate's first truthy value; on timeout the test fails with ``what`` and each ``diagnose()``."""
    value = poll(predicate, timeout, interval)
    if value:
        return value
    context = []
    for describe in diagnose:
        try:
            context.append(describe())
        except Exception as exc:  # pylint: disable=broad-except  # a diagnosis must not hide the timeout
            context.append("(diagnostics failed: %s)" % exc)
    pytest.fail("timed out after %ss waiting for %s%s" % (timeout, what, "".join("\n" + c for c in context)))
