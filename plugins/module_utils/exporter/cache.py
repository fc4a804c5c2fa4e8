# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""One reading per interval, shared by every scraper, and never a hung scrape.

:class:`SharedReading` starts a reading (``read()``, which runs mx-smi) when
a scrape finds the last one older than the interval and none has started
within the interval; every scrape in between gets the same reading. So
mx-smi runs at most once per interval whatever the number of scrapers, and
not at all while nobody scrapes. A scrape waits for a reading in progress at
most ``wait`` seconds, then answers with the previous one (its age is a
metric); a reading that fails or hangs is the reader's to report (its own
timeout ends it), never the scraper's.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Generic, Optional, TypeVar

LOG = logging.getLogger("gpu-exporter.cache")
T = TypeVar("T")


class SharedReading(Generic[T]):
    """``get()`` -> the latest reading (None before the first ended)."""

    def __init__(self, read: Callable[[], T], interval: float, wait: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._read = read
        self.interval = interval
        self.wait = wait
        self._clock = clock
        self._cond = threading.Condition()
        self._value: Optional[T] = None
        self._finished_at: Optional[float] = None
        self._started_at: Optional[float] = None
        self._running = False
        self.started = 0          # readings started (each one runs mx-smi)
        self.failed = 0           # readings that raised

    def _due(self, now: float) -> bool:
        if self._running:
            return False
        if self._started_at is not None and now - self._started_at < self.interval:
            return False          # the hard bound: one start per interval
        return self._finished_at is None or now - self._finished_at >= self.interval or self._value is None

    def _run(self) -> None:
        value: Optional[T] = None
        try:
            value = self._read()
        except Exception:  # pylint: disable=broad-except  # a reader bug must not stop future readings
            LOG.exception("reading failed")
            with self._cond:
                self.failed += 1
        with self._cond:
            if value is not None:
                self._value = value
            self._finished_at = self._clock()
            self._running = False
            self._cond.notify_all()

    def start_if_due(self) -> bool:
        """Start a reading in the background when one is due; True if started."""
        with self._cond:
            now = self._clock()
            if not self._due(now):
                return False
            self._running = True
            self._started_at = now
            self.started += 1
        threading.Thread(target=self._run, name="reading", daemon=True).start()
        return True

    def get(self) -> Optional[T]:
        """The latest reading, waiting at most ``wait`` seconds for one that is due or running."""
        self.start_if_due()
        deadline = time.monotonic() + self.wait
        with self._cond:
            while self._running:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            return self._value

    @property
    def running(self) -> bool:
        with self._cond:
            return self._running

    def age(self) -> Optional[float]:
        """Seconds since the latest reading ended (None before the first)."""
        with self._cond:
            return None if self._finished_at is None else max(0.0, self._clock() - self._finished_at)
