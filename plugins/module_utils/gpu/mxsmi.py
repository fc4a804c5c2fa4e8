# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Parsers for ``mx-smi`` output: the device table, ``-L`` and ``topo -m``.

The table also yields each GPU's readings (:class:`GpuSample`: utilisation,
temperature, power, memory used) and the process count per GPU, for
gpu-exporter; a reading whose cell is missing or unreadable is None.

The device table is read by its header, never by position or width: real
``mx-smi`` prints each GPU as several rows of ``|``-separated cells whose
widths do not line up with the header (see docs/discovery.md and
tests/unit/gpu/fixtures/mx-smi/). The header rows name the cells; a GPU's
record is as many data rows as there are header rows, and a field is the
cell in the same row and cell position as its header name. Extra cells,
blank lines, separators and reordered cells are therefore harmless.

Only output with no recognisable structure raises :class:`MxSmiParseError`;
a record that cannot be read is skipped and reported in
``MxSmiTable.problems`` (naming the line), so one odd GPU never hides the
others. Discovery turns both into warnings and falls back to PCI/sysfs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from ..errors import MetaxGpuError
from .model import LinkClass, chip_name
from .pci import normalize_bdf

_LEADING_INDEX = re.compile(r"^\s*(\d+)(?:\s+(.*?))?\s*$")
_MEMORY = re.compile(r"(\d+)\s*/\s*(\d+)\s*(MiB|MB|GiB|GB)\b", re.IGNORECASE)
_LIST_INDEX = re.compile(r"^GPU#(\d+)$")
_LIST_BDF = re.compile(r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
_LIST_DETAILS = re.compile(r"^(.*?)\s*\(([^()]*:[^()]*)\)$")
_VERSION_LINE = re.compile(r"^\s*mx-smi\s+version\s*:", re.IGNORECASE)
_DRIVER = re.compile(r"Kernel Mode Driver Version:\s*(\S+)")
_MACA = re.compile(r"MACA Version:\s*(\S+)")
_BIOS = re.compile(r"BIOS Version:\s*([^\s|]+)")
_ATTACHED = re.compile(r"^\s*Attached GPUs\s*:\s*(\d+)\s*$")
# a persistence mode printed in the name cell (2.2.8: ``0  MetaX N260  OFF`` under
# ``GPU  NAME  Persistence-M``): a word of its own after the name
_PERSISTENCE_HEADER = re.compile(r"\bpersist", re.IGNORECASE)
_PERSISTENCE_VALUE = re.compile(r"\s+(on|off|enabled?|disabled?|n/?a)$", re.IGNORECASE)
_UNHEALTHY_STATES = ("unavailable", "fault", "error", "lost", "offline")
# Words of a second table after the GPU table (processes): it ends the GPU table.
_OTHER_TABLE = re.compile(r"\b(process|pid)\b", re.IGNORECASE)
TABLE_COMMAND = "mx-smi"


class MxSmiParseError(MetaxGpuError):
    """mx-smi printed something we cannot interpret."""

    def __init__(self, what: str, message: str, lineno: Optional[int] = None, line: Optional[str] = None):
        text = "cannot parse `%s` output: %s" % (what, message)
        if lineno is not None:
            text += " (line %d: %r)" % (lineno, (line or "")[:120])
        super().__init__(text)


def _problem(what: str, message: str, lineno: int, line: str) -> str:
    return "`%s` output not understood: %s (line %d: %r)" % (what, message, lineno, line.strip()[:120])


def product_of(name: str) -> str:
    """The chip name MetaX's tools and labels use: ``MetaX C500`` / ``MXC500`` -> ``MXC500``."""
    return chip_name(name)


@dataclass(frozen=True)
class MxSmiGpu:
    index: int
    name: str                       # as printed, e.g. "MetaX C500" or "MXC500"
    bdf: str
    memory_total_mib: Optional[int]
    state: str                      # "" when the table has no state cell

    @property
    def available(self) -> bool:
        """False only for a state mx-smi reports as bad; unknown counts as available."""
        return not any(word in self.state.lower() for word in _UNHEALTHY_STATES)

    @property
    def product(self) -> str:
        return product_of(self.name)


@dataclass(frozen=True)
class GpuSample:
    """What the table says a GPU is doing now; None where its cell is absent or unreadable."""

    bdf: str
    utilization_percent: Optional[float] = None
    temperature_celsius: Optional[float] = None
    power_watts: Optional[float] = None
    power_cap_watts: Optional[float] = None     # None also for a cap printed as NA
    memory_used_mib: Optional[int] = None
    memory_total_mib: Optional[int] = None


@dataclass(frozen=True)
class MxSmiTable:
    driver_version: Optional[str]
    maca_version: Optional[str]
    gpus: Tuple[MxSmiGpu, ...]
    problems: Tuple[str, ...] = ()  # records skipped or incomplete, each naming its line
    samples: Tuple[GpuSample, ...] = ()   # one per entry of ``gpus``, same order
    # GPU index -> processes listed in the process table; None when the
    # output has no process table (then the count is unknown, not zero)
    processes: Optional[Dict[int, int]] = field(default=None, hash=False)
    bios_version: Optional[str] = None


def _cells(line: str) -> List[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _is_separator(stripped: str) -> bool:
    return set(stripped) <= set("|=-+: ")


# header cell -> field; the first matching rule wins
_FIELD_RULES: Tuple[Tuple[str, "re.Pattern[str]"], ...] = (
    ("bdf", re.compile(r"\bbus[- ]?id\b|\bpci\b", re.IGNORECASE)),
    ("memory", re.compile(r"\bmemory", re.IGNORECASE)),
    ("state", re.compile(r"\bgpu[- ]?state\b|^state$", re.IGNORECASE)),
    ("name", re.compile(r"\bname\b", re.IGNORECASE)),
    ("index", re.compile(r"^(gpu|index|id)\b(?![-:])", re.IGNORECASE)),
)
_HEADER_FIELDS = ("bdf", "memory", "state", "name")
# Readings, found by header name like the fields above; one cell may carry
# several (``Temp        Pwr:Usage/Cap`` over ``29C  53W / 450W``), so each
# value is picked out of its cell by its unit.
_READING_RULES: Tuple[Tuple[str, "re.Pattern[str]"], ...] = (
    ("util", re.compile(r"\bgpu[- ]?util\b", re.IGNORECASE)),
    ("temp", re.compile(r"\btemp\b", re.IGNORECASE)),
    ("power", re.compile(r"\bpwr\b|\bpower\b", re.IGNORECASE)),
)
_PERCENT = re.compile(r"(\d+(?:\.\d+)?)\s*%")
_CELSIUS = re.compile(r"(\d+(?:\.\d+)?)\s*C\b")
_WATTS = re.compile(r"(\d+(?:\.\d+)?)\s*W\b")
_CAP = re.compile(r"/\s*(\d+(?:\.\d+)?)\s*W\b")
_USED = re.compile(r"(\d+)\s*/\s*\d+\s*(MiB|MB|GiB|GB)\b", re.IGNORECASE)
_PROCESS_ROW = re.compile(r"^(\d+)\s+(\d+)\s+\S")


def _reading_fields(cells: List[str]) -> Dict[str, int]:
    found: Dict[str, int] = {}
    for pos, cell in enumerate(cells):
        for name, rule in _READING_RULES:
            if rule.search(cell):
                found.setdefault(name, pos)
    return found


def _header_fields(cells: List[str]) -> Dict[str, int]:
    found: Dict[str, int] = {}
    for pos, cell in enumerate(cells):
        for name, rule in _FIELD_RULES:
            if rule.search(cell):
                found.setdefault(name, pos)
                break
    return found


@dataclass
class _Layout:
    rows: int                                      # data rows per GPU
    where: Dict[str, Tuple[int, int]]              # field -> (row, cell)
    widths: Tuple[int, ...]                        # cells per header row
    readings: Dict[str, Tuple[int, int]] = field(default_factory=dict)   # reading -> (row, cell)
    name_persistence: bool = False                 # the name's header cell also names Persistence-M


def _find_layout(rows: List[Tuple[int, str, bool]]) -> Tuple[Optional[_Layout], int]:
    """The header block: consecutive table rows naming known cells.

    Returns the layout and the position in ``rows`` after the header.
    """
    for pos, (_lineno, line, separator) in enumerate(rows):
        if separator:
            continue
        first = _header_fields(_cells(line))
        if not any(f in first for f in _HEADER_FIELDS):
            continue
        # the header starts below the separator above it (its first rows
        # may name only cells we do not read)
        while pos > 0 and not rows[pos - 1][2] and not _holds_data(rows[pos - 1][1]):
            pos -= 1
        where: Dict[str, Tuple[int, int]] = {}
        readings: Dict[str, Tuple[int, int]] = {}
        widths: List[int] = []
        persistence = False
        end = pos
        while end < len(rows) and not rows[end][2]:
            cells = _cells(rows[end][1])
            fields = _header_fields(cells)
            # the header runs to the separator under it; a row holding data
            # (a PCI address or a memory value) means there was none
            if end > pos and _holds_data(rows[end][1]):
                break
            for name, cell in fields.items():
                where.setdefault(name, (len(widths), cell))
                if name == "name" and where[name] == (len(widths), cell) and _PERSISTENCE_HEADER.search(cells[cell]):
                    persistence = True
            for name, cell in _reading_fields(cells).items():
                readings.setdefault(name, (len(widths), cell))
            widths.append(len(cells))
            end += 1
        if "bdf" in where:
            return _Layout(len(widths), where, tuple(widths), readings, persistence), end
    return None, len(rows)


def _field(record: List[Optional[Tuple[int, str]]], layout: _Layout, name: str,
           readings: bool = False) -> Optional[Tuple[str, int, str]]:
    """(cell text, lineno, line) of field ``name`` (or reading) in ``record``, None when absent."""
    where = layout.readings if readings else layout.where
    if name not in where:
        return None
    row, cell = where[name]
    entry = record[row]
    if entry is None:
        return None
    lineno, line = entry
    cells = _cells(line)
    if cell >= len(cells) or not cells[cell]:
        return None
    return cells[cell], lineno, line


def _holds_data(line: str) -> bool:
    """A table row with a PCI address or a memory value: a GPU's data, not a header."""
    return bool(_MEMORY.search(line)) or any(_bdf_in(line, c) for c in range(len(_cells(line))))


def _bdf_in(line: str, cell: int) -> bool:
    cells = _cells(line)
    if cell >= len(cells) or not cells[cell]:
        return False
    try:
        normalize_bdf(cells[cell].split()[0])
    except ValueError:
        return False
    return True


def _memory_mib(text: str) -> Optional[int]:
    found = _MEMORY.search(text)
    if not found:
        return None
    total = int(found.group(2))
    return total * 1024 if found.group(3).upper().startswith("G") else total


def _read_record(record: List[Optional[Tuple[int, str]]], layout: _Layout, ordinal: int,
                 problems: List[str]) -> Optional[MxSmiGpu]:
    bus = _field(record, layout, "bdf")
    if bus is None:
        return None
    try:
        bdf = normalize_bdf(bus[0].split()[0])
    except (ValueError, IndexError):
        return None
    index: Optional[int] = None
    name = ""
    named = _field(record, layout, "name")
    if named is not None:
        found = _LEADING_INDEX.match(named[0])
        if found:
            index, name = int(found.group(1)), found.group(2) or ""
        else:
            name = named[0]
        name = _without_persistence(name, layout.name_persistence)
    if index is None:
        numbered = _field(record, layout, "index")
        found = _LEADING_INDEX.match(numbered[0]) if numbered else None
        index = int(found.group(1)) if found else ordinal
    memory = None
    mem = _field(record, layout, "memory")
    if mem is not None:
        memory = _memory_mib(mem[0])
        if memory is None:
            problems.append(_problem(TABLE_COMMAND, "bad Memory-Usage %r of GPU %d" % (mem[0], index),
                                     mem[1], mem[2]))
    state = _field(record, layout, "state")
    missing = [label for name, label, value in (("memory", "Memory-Usage", mem), ("state", "GPU-State", state))
               if value is None and name in layout.where]
    if missing:
        problems.append(_problem(TABLE_COMMAND, "GPU %d has no %s cell" % (index, " or ".join(missing)),
                                 bus[1], bus[2]))
    return MxSmiGpu(index, name, bdf, memory, state[0] if state else "")


_SPACED_ON_OFF = re.compile(r"\s{2,}(on|off)$", re.IGNORECASE)


def _without_persistence(name: str, header_says_so: bool) -> str:
    """The board name without a persistence mode printed in its cell (``MetaX N260  OFF``).

    When the header cell names Persistence-M, its value is the last word; without
    such a header only a column-spaced ``On``/``Off`` is taken for one.
    """
    found = (_PERSISTENCE_VALUE if header_says_so else _SPACED_ON_OFF).search(name)
    return name[:found.start()].rstrip() if found and found.start() > 0 else name


def _number(pattern: "re.Pattern[str]", cell: Optional[Tuple[str, int, str]]) -> Optional[float]:
    found = pattern.search(cell[0]) if cell is not None else None
    return float(found.group(1)) if found else None


def _read_sample(record: List[Optional[Tuple[int, str]]], layout: _Layout, gpu: MxSmiGpu) -> GpuSample:
    """The readings of one GPU record; a cell that says nothing readable (``NA``) gives None."""
    power = _field(record, layout, "power", readings=True)
    used: Optional[int] = None
    mem = _field(record, layout, "memory")
    found = _USED.search(mem[0]) if mem is not None else None
    if found:
        used = int(found.group(1)) * (1024 if found.group(2).upper().startswith("G") else 1)
    return GpuSample(
        bdf=gpu.bdf,
        utilization_percent=_number(_PERCENT, _field(record, layout, "util", readings=True)),
        temperature_celsius=_number(_CELSIUS, _field(record, layout, "temp", readings=True)),
        power_watts=_number(_WATTS, power), power_cap_watts=_number(_CAP, power),
        memory_used_mib=used, memory_total_mib=gpu.memory_total_mib)


def _count_processes(rows: List[Tuple[int, str, bool]]) -> Dict[int, int]:
    """GPU index -> rows of the process table (``GPU  PID  Process Name ...``)."""
    counts: Dict[int, int] = {}
    for _lineno, line, separator in rows:
        if separator:
            continue
        found = _PROCESS_ROW.match(" ".join(_cells(line)).strip())
        if found:
            counts[int(found.group(1))] = counts.get(int(found.group(1)), 0) + 1
    return counts


def parse_table(text: str) -> MxSmiTable:
    """Parse the default ``mx-smi`` output (one record of header-many rows per GPU)."""
    lines = text.splitlines()
    driver = maca = bios = None
    rows: List[Tuple[int, str, bool]] = []
    attached: Optional[Tuple[int, int, str]] = None
    for lineno, line in enumerate(lines, start=1):
        counted = _ATTACHED.match(line) if attached is None else None
        if counted:
            attached = (int(counted.group(1)), lineno, line)
        found = _DRIVER.search(line) if driver is None else None
        if found:
            driver = found.group(1)
        found = _MACA.search(line) if maca is None else None
        if found:
            maca = found.group(1)
        found = _BIOS.search(line) if bios is None else None
        if found:
            bios = found.group(1)
        stripped = line.strip()
        if stripped.startswith("|") or stripped.startswith("+"):
            rows.append((lineno, stripped, _is_separator(stripped)))
    layout, pos = _find_layout(rows)
    if layout is None:
        first = next(((n, l) for n, l in enumerate(lines, start=1) if l.strip()), (1, ""))
        raise MxSmiParseError(TABLE_COMMAND, "no device table header naming a Bus-id cell",
                              first[0], first[1])
    problems: List[str] = []
    gpus: List[MxSmiGpu] = []
    samples: List[GpuSample] = []
    processes: Optional[Dict[int, int]] = None
    data = []
    rest = rows[pos:]
    for at, (lineno, line, separator) in enumerate(rest):
        cells = _cells(line)
        if separator or not any(cells) or (len(cells) == 1 and 1 not in layout.widths):
            continue    # full-width rows (titles, notes) are no GPU's
        if _OTHER_TABLE.search(line):
            # the process table: the GPU table is over, unless GPU rows follow
            later = [(n, l) for n, l, _sep in rest[at + 1:] if _bdf_in(l, layout.where["bdf"][1])]
            if later:
                problems.append(_problem(TABLE_COMMAND, "GPU rows after a process table", later[0][0],
                                         later[0][1]))
            break
        data.append((lineno, line))
    # the process table, whether or not the loop above met it (its title is
    # a full-width row, skipped there)
    starts = [at for at, (_n, line, sep) in enumerate(rest) if not sep and _OTHER_TABLE.search(line)]
    if starts:
        processes = _count_processes(rest[starts[0] + 1:])
    # A record is anchored on the row whose Bus-id cell holds a PCI address;
    # its other rows are the neighbours in header order, unless they are
    # anchors themselves (a GPU printed with a row missing).
    bdf_row, bdf_cell = layout.where["bdf"]
    anchors = [i for i, (_n, line) in enumerate(data) if _bdf_in(line, bdf_cell)]
    anchor_set = set(anchors)
    used = set()
    for anchor in anchors:
        record: List[Optional[Tuple[int, str]]] = []
        start = anchor - bdf_row
        for at in range(start, start + layout.rows):
            ok = 0 <= at < len(data) and at not in used and (at == anchor or at not in anchor_set)
            record.append(data[at] if ok else None)
            if ok:
                used.add(at)
        gpu = _read_record(record, layout, len(gpus), problems)
        if gpu is None:
            continue
        if any(g.index == gpu.index for g in gpus):
            problems.append(_problem(TABLE_COMMAND, "duplicate GPU index %d" % gpu.index,
                                     data[anchor][0], data[anchor][1]))
        elif any(g.bdf == gpu.bdf for g in gpus):
            problems.append(_problem(TABLE_COMMAND, "duplicate Bus-id %s" % gpu.bdf,
                                     data[anchor][0], data[anchor][1]))
        else:
            gpus.append(gpu)
            samples.append(_read_sample(record, layout, gpu))
    previous = -2
    for at, (lineno, line) in enumerate(data):
        if at not in used and at != previous + 1:
            problems.append(_problem(TABLE_COMMAND, "row belongs to no GPU record (no readable Bus-id)",
                                     lineno, line))
        if at not in used:
            previous = at
    if attached is not None and attached[0] != len(gpus):
        # fewer GPUs read than the tool counts: the rest were printed in a way
        # we did not follow (or elided), which says nothing about their health
        problems.append(_problem(TABLE_COMMAND, "%d GPUs attached, %d read from the table"
                                 % (attached[0], len(gpus)), attached[1], attached[2]))
    return MxSmiTable(driver, maca, tuple(gpus), tuple(problems), tuple(samples), processes, bios)


def _list_record(line: str) -> Tuple[Optional[Tuple[int, Dict[str, str]]], str]:
    """One ``-L`` line: ((index, fields), "") or (None, why it cannot be read).

    Read by structure, never by column: ``GPU#<n>``, the chip name (any
    number of words), the PCI address, then the state, and the details in
    the last parentheses as ``KEY: value`` pairs (``UUID``, and ``SN`` if a
    version prints one).
    """
    tokens = line.split()
    head = _LIST_INDEX.match(tokens[0]) if tokens else None
    if head is None:
        return None, "expected 'GPU#<index>  <chip>  <PCI address>  <state> (UUID: ...)'"
    at_bdf = next((n for n, token in enumerate(tokens) if _LIST_BDF.match(token)), None)
    if at_bdf is None or at_bdf < 2:
        return None, "no chip name and PCI address after %s" % tokens[0]
    rest = " ".join(tokens[at_bdf + 1:])
    details = _LIST_DETAILS.match(rest)
    state = (details.group(1) if details else rest).strip()
    fields = {"name": " ".join(tokens[1:at_bdf]), "bdf": normalize_bdf(tokens[at_bdf]), "state": state}
    if details:
        for part in details.group(2).split(","):
            key, sep, value = part.partition(":")
            if sep:
                key = key.strip().lower()
                fields["serial" if key in ("sn", "serial") else key] = value.strip()
    if state.lower() != "available":
        return None, "GPU %s is %r" % (head.group(1), state or "in no state")
    if not fields.get("uuid"):
        return None, "GPU %s has no UUID" % head.group(1)
    return (int(head.group(1)), fields), ""


def parse_list(text: str, problems: Optional[List[str]] = None) -> Dict[int, Dict[str, str]]:
    """Parse ``mx-smi -L``: index -> {"name", "bdf", "state", "uuid"[, "serial"]}.

    The real form (``../shared/samples/mx-smi/list-2.2.9-MXC500-excerpt.txt``)
    is ``GPU#0  MXC500  0000:08:00.0  Available (UUID: GPU-...)`` after a
    ``mx-smi  version: X`` line. A GPU that is not available (printed as
    ``Not Available(<reason>)`` with no UUID) or any other line not
    understood is skipped; with ``problems`` it is reported there, without
    it the first such line raises.
    """
    result: Dict[int, Dict[str, str]] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or _VERSION_LINE.match(line):
            continue
        record, why = _list_record(line)
        if record is not None and record[0] in result:
            why = "duplicate GPU index %d" % record[0]
        elif record is not None:
            result[record[0]] = record[1]
            continue
        if problems is None:
            raise MxSmiParseError("mx-smi -L", why, lineno, line)
        problems.append(_problem("mx-smi -L", why, lineno, line))
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
