# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""``mx-smi --count-ecc``: ECC error counts and retired pages per GPU (health signals, the exporter).

Its own module beside :mod:`.mxsmi` (the table, ``-L`` and ``topo -m``
readers): the same rules, read by keys and tolerant of lines never seen.
"""

from __future__ import annotations

import re
from typing import Dict, List, Optional

from .mxsmi import MxSmiParseError, _problem
from .pci import normalize_bdf

ECC_COMMAND = "mx-smi --count-ecc"
_ECC_GPU = re.compile(r"^GPU#(\d+)\s+(.*?)\s+([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s*$")
_ECC_COUNT = re.compile(r"^\s+(SRAM|DRAM)\s+(Correctable|Uncorrectable)\s*:\s*(\S+)\s*$", re.IGNORECASE)
# under ``Retired Pages``: ``Double Bit ECC : 0`` (and, in forms not seen yet,
# other ``<kind> : n`` lines, read by their words)
_ECC_SECTION = re.compile(r"^\s+(ECC Errors|Retired Pages)\s*$", re.IGNORECASE)
_ECC_RETIRED = re.compile(r"^\s+(.*?)\s*:\s*(\S+)\s*$")
# the keys of ``parse_count_ecc`` that count ECC errors (the rest count retired pages)
ECC_ERROR_KEYS = ("sram_correctable", "sram_uncorrectable", "dram_correctable", "dram_uncorrectable")


def _retired_key(label: str) -> str:
    words = re.sub(r"[^a-z0-9]+", "_", label.lower()).strip("_")
    return "retired_dbe" if words == "double_bit_ecc" else "retired_" + words


def parse_count_ecc(text: str, problems: Optional[List[str]] = None) -> Dict[str, Dict[str, int]]:
    """Parse ``mx-smi --count-ecc``: PCI address -> {"sram_correctable": n, ..., "retired_dbe": n}.

    The real form (samples/mx-smi/count-ecc-2.2.12-1xC500.txt): per GPU a
    ``GPU#<n>  <chip>  <BDF>`` line, then indented ``ECC Errors`` lines
    ``SRAM Correctable : 0`` ... and ``Retired Pages`` lines (``Double Bit ECC
    : 0`` -> ``retired_dbe``; another kind of page is ``retired_<its words>``).
    A count that is not a number is reported (with ``problems``; else it
    raises) and that GPU left out; lines of other kinds are ignored.
    """
    out: Dict[str, Dict[str, int]] = {}
    current: Optional[str] = None
    section = ""
    bad = set()
    for lineno, line in enumerate(text.splitlines(), start=1):
        head = _ECC_GPU.match(line.strip()) if not line[:1].isspace() else None
        if head:
            current = normalize_bdf(head.group(3))
            out.setdefault(current, {})
            section = ""
            continue
        if current is None:
            continue
        heading = _ECC_SECTION.match(line)
        if heading:
            section = heading.group(1).lower()
            continue
        found = _ECC_COUNT.match(line)
        retired = _ECC_RETIRED.match(line) if section == "retired pages" and not found else None
        if found:
            key, value = "%s_%s" % (found.group(1).lower(), found.group(2).lower()), found.group(3)
        elif retired:
            key, value = _retired_key(retired.group(1)), retired.group(2)
        else:
            continue
        if value.isdigit():
            out[current][key] = int(value)
        else:
            if problems is None:
                raise MxSmiParseError(ECC_COMMAND, "%s is %r" % (key, value), lineno, line)
            problems.append(_problem(ECC_COMMAND, "%s of %s is %r" % (key, current, value), lineno, line))
            bad.add(current)
    return {bdf: counts for bdf, counts in out.items() if counts and bdf not in bad}
