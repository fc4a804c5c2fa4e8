# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""What the cluster commands print: timestamped progress lines on stderr, phases and their timings.

The format is lib.sh's (``[HH:MM:SS] msg``, ``WARNING:``, ``ERROR:``, the
phase table at the end of `up`/`down`), so logs read as they always did.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Callable, TextIO


class ClusterError(Exception):
    """A failure the user has to act on: printed as ``ERROR: <message>``, exit 1."""


def _ts() -> str:
    return time.strftime("%H:%M:%S")


def log(msg: str, out: TextIO = sys.stderr) -> None:
    out.write("[%s] %s\n" % (_ts(), msg))
    out.flush()


def warn(msg: str, out: TextIO = sys.stderr) -> None:
    log("WARNING: " + msg, out)


def error(msg: str, out: TextIO = sys.stderr) -> None:
    log("ERROR: " + msg, out)


@dataclass
class Phases:
    """phase_start/phase_report of lib.sh: each phase's wall seconds, printed as a table."""

    clock: Callable[[], float] = time.monotonic
    emit: Callable[[str], None] = log
    done: list[tuple[str, int]] = field(default_factory=list)
    _name: str = ""
    _t0: float = 0.0

    def start(self, name: str) -> None:
        self.end()
        self._name, self._t0 = name, self.clock()
        self.emit("== " + name)

    def end(self) -> None:
        if self._name:
            self.done.append((self._name, int(self.clock() - self._t0)))
            self._name = ""

    def report(self, title: str) -> str:
        self.end()
        if not self.done:
            return ""
        lines = ["", "Phase timings (%s):" % title]
        lines += ["  %-38s %5ss" % (name, secs) for name, secs in self.done]
        lines.append("  %-38s %5ss" % ("total", sum(secs for _name, secs in self.done)))
        return "\n".join(lines) + "\n"
