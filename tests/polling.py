# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Waiting in tests: poll a predicate until it holds, or fail saying what was awaited and why it may not have come."""

from __future__ import annotations

import time
from typing import Callable, Iterable, TypeVar

import pytest

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float, what: str = "the condition", interval: float = 1.0,
               diagnose: Iterable[Callable[[], str]] = ()) -> T:
    """The predicate's first truthy value; on timeout the test fails with ``what`` and each ``diagnose()``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            break
        time.sleep(interval)
    context = []
    for describe in diagnose:
        try:
            context.append(describe())
        except Exception as exc:  # pylint: disable=broad-except  # a diagnosis must not hide the timeout
            context.append("(diagnostics failed: %s)" % exc)
    pytest.fail("timed out after %ss waiting for %s%s" % (timeout, what, "".join("\n" + c for c in context)))
