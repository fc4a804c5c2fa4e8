# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Retry pacing shared by the library and the agents (below both: imports nothing of ours)."""

from __future__ import annotations

import random


class Backoff:
    """Exponential backoff with jitter, capped; ``reset`` after a success."""

    def __init__(self, initial: float = 0.5, cap: float = 30.0) -> None:
        self.initial = initial
        self.cap = cap
        self.current = initial

    def next_delay(self) -> float:
        delay = self.current
        self.current = min(self.cap, self.current * 2)
        # +-20% jitter so agents on many nodes do not retry in step
        return delay * (0.8 + 0.4 * random.random())

    def reset(self) -> None:
        self.current = self.initial
