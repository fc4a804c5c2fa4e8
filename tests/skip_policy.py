"""Under CI, a skipped test fails the run unless tests/allowed-skips.yml lists it.

A test that needs a tool, a binary, a privilege, a module cache or a service
gets it from the `deps` phase (scripts/deps.sh, requirements/system.txt),
never from whichever phase ran before it. A skip for a missing one is a
machine that differs from CI's, and under CI it fails loudly instead of
passing with the test untested. Outside CI a skip stays a skip, and the
closing summary of scripts/run-tests.sh names it.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass
from typing import List, Optional

import yaml

ALLOWLIST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "allowed-skips.yml")


def in_ci(environ=None) -> bool:
    """CI set and not false/0 (the same rule as .ci/run's callers)."""
    value = (os.environ if environ is None else environ).get("CI", "").strip().lower()
    return value not in ("", "0", "false", "no", "off")


@dataclass(frozen=True)
class AllowedSkip:
    test: str      # fnmatch pattern on the test's node id
    reason: str    # text the skip's own reason must contain
    why: str       # why this skip is not a missing dependency


def load_allowlist(path: str = ALLOWLIST) -> List[AllowedSkip]:
    with open(path) as handle:
        entries = yaml.safe_load(handle) or []
    return [AllowedSkip(str(e["test"]), str(e["reason"]), str(e["why"])) for e in entries]


def skip_reason(longrepr) -> str:
    """The reason of a skipped report (pytest gives (path, lineno, 'Skipped: reason'))."""
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        text = str(longrepr[2])
    else:
        text = str(longrepr)
    return text[len("Skipped: "):] if text.startswith("Skipped: ") else text


def allowed(nodeid: str, reason: str, allowlist: List[AllowedSkip]) -> Optional[AllowedSkip]:
    for entry in allowlist:
        if fnmatch.fnmatchcase(nodeid, entry.test) and entry.reason in reason:
            return entry
    return None
