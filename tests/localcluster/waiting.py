# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Waiting for a component: poll a check until it passes, fail early when its process died.

A timeout or a dead process ends `up` with the last lines of the
component's log and what to do next.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Protocol

from .output import ClusterError, warn


class Processes(Protocol):
    logs: str

    def running(self, name: str) -> bool:
        ...

    def exited(self, name: str) -> bool:
        ...


def tail(path: str, lines: int = 25) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return "".join(fh.readlines()[-lines:])
    except OSError:
        return ""


def wait_for(host: Processes, desc: str, timeout: float, logname: str, check: Callable[[], bool],
             interval: float = 0.5) -> None:
    """Until CHECK passes; LOGNAME: the process whose death (or log) explains a failure ("" = none)."""
    deadline = time.monotonic() + timeout
    log_path = "%s/%s.log" % (host.logs, logname)
    while True:
        try:
            if check():
                return
        except (OSError, RuntimeError):
            pass  # not up yet: a refused connection, a command that fails until it is
        if time.monotonic() >= deadline:
            if logname and os.path.exists(log_path):
                warn("last lines of %s:\n%s" % (log_path, tail(log_path).rstrip("\n")))
            raise ClusterError("timed out after %ds waiting for %s.\n  Logs: %s/. Run 'make cluster-down' (always "
                               "safe) and then 'make cluster-up' again." % (timeout, desc, host.logs))
        if logname and host.exited(logname):
            warn("%s exited; last lines of %s:\n%s" % (logname, log_path, tail(log_path).rstrip("\n")))
            raise ClusterError("%s exited while waiting for %s. Run 'make cluster-down', fix the cause, then "
                               "'make cluster-up'." % (logname, desc))
        time.sleep(interval)
