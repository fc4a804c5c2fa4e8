# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Parsers for ``mx-smi`` output: the device table, ``-L`` and ``topo -m``.

They accept the variations seen on real machines (extra columns, blank
lines, an 8-digit PCI domain, ``MX<n>`` link counts) and reject anything
else with the offending line quoted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from ..errors import MetaxGpuError
from .model import LinkClass
from .pci import normalize_bdf

_GPU_ROW = re.compile(r"^\s*(\d+)\s+(\S+)")
_MEMORY = re.compile(r"(\d+)\s*/\s*(\d+)\s*MiB", re.IGNORECASE)
_LIST_LINE = re.compile(r"^GPU\s+(\d+):\s*(\S+)\s*\((.*)\)\s*$")
_DRIVER = re.compile(r"Kernel Mode Driver Version:\s*(\S+)")
_MACA = re.compile(r"MACA Version:\s*(\S+)")
_UNHEALTHY_STATES = ("unavailable", "fault", "error", "lost", "offline")


class MxSmiParseError(MetaxGpuError):
    """mx-smi printed something we cannot interpret."""

    def __init__(self, what: str, message: str, lineno: Optional[int] = None, line: Optional[str] = None):
        text = "cannot parse `%s` output: %s" % (what, message)
        if lineno is not None:
            text += " (line %d: %r)" % (lineno, (line or "")[:120])
        super().__init__(text)


@dataclass(frozen=True)
class MxSmiGpu:
    index: int
    name: str
    bdf: str
    memory_total_mib: Optional[int]
    state: str

    @property
    def available(self) -> bool:
        return not any(word in self.state.lower() for word in _UNHEALTHY_STATES)


@dataclass(frozen=True)
class MxSmiTable:
    driver_version: Optional[str]
    maca_version: Optional[str]
    gpus: Tuple[MxSmiGpu, ...]


def _cells(line: str) -> List[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def parse_table(text: str) -> MxSmiTable:
    """Parse the default ``mx-smi`` output (two table lines per GPU)."""
    lines = text.splitlines()
    driver = maca = None
    gpus: List[MxSmiGpu] = []
    pending: Optional[Tuple[int, str, str, int, str]] = None
    saw_table = False
    for lineno, line in enumerate(lines, start=1):
        found = _DRIVER.search(line) if driver is None else None
        if found:
            driver = found.group(1)
        found = _MACA.search(line) if maca is None else None
        if found:
            maca = found.group(1)
        stripped = line.strip()
        if not stripped.startswith("|") or set(stripped) <= set("|=-+ "):
            if stripped.startswith("+") or stripped.startswith("|="):
                saw_table = True
            continue
        cells = _cells(stripped)
        if pending is None:
            match = _GPU_ROW.match(cells[0])
            if match and len(cells) >= 2 and cells[1]:
                try:
                    bdf = normalize_bdf(cells[1].split()[0])
                except ValueError:
                    raise MxSmiParseError("mx-smi", "bad Bus-id %r" % cells[1], lineno, line)
                pending = (int(match.group(1)), match.group(2), bdf, lineno, line)
            continue
        index, name, bdf, first_lineno = pending[:4]
        memory = None
        state = ""
        if len(cells) >= 2:
            mem = _MEMORY.search(cells[1])
            if mem:
                memory = int(mem.group(2))
        if len(cells) >= 3:
            state = cells[2]
        if memory is None:
            raise MxSmiParseError("mx-smi", "GPU %d (line %d) has no Memory-Usage line after it" % (index, first_lineno), lineno, line)
        gpus.append(MxSmiGpu(index, name, bdf, memory, state or "Available"))
        pending = None
    if pending is not None:
        raise MxSmiParseError("mx-smi", "GPU row without its second line", pending[3], pending[4])
    if not saw_table and not gpus:
        raise MxSmiParseError("mx-smi", "no device table found", 1, lines[0] if lines else "")
    indices = [g.index for g in gpus]
    if len(set(indices)) != len(indices):
        raise MxSmiParseError("mx-smi", "duplicate GPU indices %s" % indices)
    return MxSmiTable(driver, maca, tuple(gpus))


def parse_list(text: str) -> Dict[int, Dict[str, str]]:
    """Parse ``mx-smi -L``: index -> {"name", "uuid", "serial"}."""
    result: Dict[int, Dict[str, str]] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        match = _LIST_LINE.match(line.strip())
        if not match:
            raise MxSmiParseError("mx-smi -L", "expected 'GPU N: NAME (UUID: ...)'", lineno, line)
        fields = {"name": match.group(2)}
        for part in match.group(3).split(","):
            if ":" in part:
                key, value = part.split(":", 1)
                key = key.strip().lower()
                fields["serial" if key in ("sn", "serial") else key] = value.strip()
        result[int(match.group(1))] = fields
    return result


def parse_topology(text: str) -> Dict[Tuple[int, int], LinkClass]:
    """Parse ``mx-smi topo -m`` into {(i, j): LinkClass} for i < j (GPU indices)."""
    lines = [(n, l) for n, l in enumerate(text.splitlines(), start=1) if l.strip()]
    header_at = None
    for pos, (_lineno, line) in enumerate(lines):
        tokens = line.split()
        if tokens and tokens[0].startswith("GPU") and tokens[0][3:].isdigit() and \
                not line.startswith(tokens[0]):
            header_at = pos
            break
    if header_at is None:
        raise MxSmiParseError("mx-smi topo -m", "no GPU header row found", lines[0][0] if lines else None,
                              lines[0][1] if lines else None)
    columns = []
    for token in lines[header_at][1].split():
        if token.startswith("GPU") and token[3:].isdigit():
            columns.append(int(token[3:]))
        else:
            break   # CPU Affinity, NUMA Affinity, NIC columns... follow
    links: Dict[Tuple[int, int], LinkClass] = {}
    rows_seen = set()
    for lineno, line in lines[header_at + 1:]:
        tokens = line.split()
        if not (tokens[0].startswith("GPU") and tokens[0][3:].isdigit()):
            if tokens[0].rstrip(":").lower() == "legend":
                break
            continue   # NIC rows and the like
        row = int(tokens[0][3:])
        cells = tokens[1:1 + len(columns)]
        if len(cells) < len(columns):
            raise MxSmiParseError("mx-smi topo -m", "row has %d link cells, expected %d"
                                  % (len(cells), len(columns)), lineno, line)
        rows_seen.add(row)
        for col, cell in zip(columns, cells):
            if col == row:
                if cell.upper() != "X":
                    raise MxSmiParseError("mx-smi topo -m", "diagonal is %r, expected X" % cell, lineno, line)
                continue
            try:
                link = LinkClass.from_legend(cell)
            except ValueError:
                raise MxSmiParseError("mx-smi topo -m", "unknown link %r" % cell, lineno, line)
            key = (row, col) if row < col else (col, row)
            if key in links and links[key] != link:
                raise MxSmiParseError("mx-smi topo -m", "asymmetric link GPU%d-GPU%d" % key, lineno, line)
            links[key] = link
    if rows_seen != set(columns):
        raise MxSmiParseError("mx-smi topo -m", "rows %s do not match columns %s"
                              % (sorted(rows_seen), columns))
    return links
