# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Reading ansible-playbook's output in the cluster tests."""

from __future__ import annotations

import re
from typing import Dict

_RECAP_LINE = re.compile(r"^(\S+)\s*:\s*((?:[a-z]+=\d+\s*)+)$")


def recap(stdout: str) -> Dict[str, Dict[str, int]]:
    """The PLAY RECAP as {host: {"ok": n, "changed": n, ...}}; {} when the output has none."""
    start = stdout.rfind("PLAY RECAP")
    counts: Dict[str, Dict[str, int]] = {}
    for line in stdout[start:].splitlines() if start >= 0 else ():
        match = _RECAP_LINE.match(line.strip())
        if match:
            counts[match.group(1)] = {k: int(v) for k, v in (kv.split("=") for kv in match.group(2).split())}
    return counts
