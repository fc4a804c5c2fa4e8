# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Parser for ``mx-smi -j`` (JSON output, mx-smi 2.2.12 and later).

What the real tool prints (tests/unit/gpu/fixtures/mx-smi/json-2.2.12-1xC500-sgpu.txt):
a ``mx-smi  version: X`` line, then one JSON object whose device entries are
keyed by PCI address next to scalar keys (``smi_version``,
``driver_version``...). Numbers are strings (``"hotspot": "38.500"``) or
numbers (``"utilization": 0``); both are read. Board power is per rail
(``board_power.power.Way0..``) and summed. ``unavailable_reason`` is empty
for a usable GPU. The JSON has no memory and no process list: gpu-exporter
reads those from the table.

Health (docs/health.md): ``pci_event_info`` lists events per kind (their
count is read); ``ras_count`` holds ``uncorrected_error`` and
``corrected_error`` objects, empty in the real capture: a non-empty one is
read as ``{"<block>": <count>}`` (the simulator's form, no real capture) and
its counts summed. MetaXLink AER counts per link are read from a key naming
``mxlk`` (or ``metaxlink``) and ``aer``, as ``{"<link>": {"ce": n, "ue": n}}``
(the simulator's ``mxlk_aer_count``; no real capture): absent means unknown,
not zero.

A device entry or value that cannot be read is reported in
``MxSmiJson.problems`` (naming the key) and left out; only output that holds
no JSON object at all raises :class:`~.mxsmi.MxSmiParseError`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from .mxsmi import MxSmiParseError
from .pci import normalize_bdf

JSON_COMMAND = "mx-smi -j"
_VERSION = re.compile(r"^\s*mx-smi\s+version:\s*(\S+)", re.IGNORECASE)
_NUMBER = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*%?\s*$")


@dataclass(frozen=True)
class JsonDevice:
    bdf: str
    index: Optional[int]                  # ``device_id``
    unavailable_reason: str               # "" when the GPU is usable
    utilization_percent: Optional[float]
    temperature_celsius: Optional[float]  # ``hotspot``
    power_watts: Optional[float]          # sum of ``board_power.power``
    vbios_version: Optional[str] = None
    gpu_clock_mhz: Optional[float] = None     # ``clocks.XCORE``
    memory_clock_mhz: Optional[float] = None  # ``clocks.MC``
    # ``pci_event_info``: events listed per kind (aer_ue, aer_ce, synfld, dbe, mmio)
    pci_events: Tuple[Tuple[str, int], ...] = ()
    # ``ras_count``: uncorrected and corrected errors summed over blocks; None when absent
    ras_uncorrected: Optional[int] = None
    ras_corrected: Optional[int] = None
    # MetaXLink AER per link: (link, correctable, uncorrectable); () when the JSON has none
    mxlk_aer: Tuple[Tuple[str, int, int], ...] = ()

    @property
    def available(self) -> bool:
        return not self.unavailable_reason.strip()


@dataclass(frozen=True)
class MxSmiJson:
    version: Optional[str]
    driver_version: Optional[str]
    maca_version: Optional[str]
    devices: Tuple[JsonDevice, ...]
    problems: Tuple[str, ...] = ()


def number(value: Any) -> Optional[float]:
    """``"38.500"``, ``0``, ``"0%"`` -> float; anything else (``"NA"``, ``None``, dicts) -> None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        found = _NUMBER.match(value)
        if found:
            return float(found.group(1))
    return None


def _power(entry: Dict[str, Any]) -> Optional[float]:
    board = entry.get("board_power")
    rails = board.get("power") if isinstance(board, dict) else None
    if not isinstance(rails, dict) or not rails:
        return None
    values = [number(v) for v in rails.values()]
    if any(v is None for v in values):
        return None
    return round(sum(v for v in values if v is not None), 3)


def _clock(entry: Dict[str, Any], key: str) -> Optional[float]:
    clocks = entry.get("clocks")
    return number(clocks.get(key)) if isinstance(clocks, dict) else None


def _pci_events(entry: Dict[str, Any]) -> Tuple[Tuple[str, int], ...]:
    events = entry.get("pci_event_info")
    if not isinstance(events, dict):
        return ()
    return tuple((str(kind), len(listed)) for kind, listed in sorted(events.items()) if isinstance(listed, list))


_MXLK_AER_KEY = re.compile(r"(mxlk|metaxlink).*aer|aer.*(mxlk|metaxlink)", re.IGNORECASE)


def _count(value: Any) -> Optional[int]:
    """A count: a number, a numeric string, or a list (its length, as pci_event_info lists events)."""
    if isinstance(value, list):
        return len(value)
    found = number(value)
    return int(found) if found is not None and found >= 0 else None


def _ras(entry: Dict[str, Any], key: str, bdf: str, problems: List[str]) -> Optional[int]:
    counts = entry.get("ras_count")
    if not isinstance(counts, dict) or key not in counts:
        return None
    blocks = counts[key]
    if not isinstance(blocks, dict):
        single = _count(blocks)
        if single is None:
            problems.append("`%s` output not understood: ras_count.%s of %s is %r" % (JSON_COMMAND, key, bdf, blocks))
        return single
    total = 0
    for block, value in blocks.items():
        found = _count(value)
        if found is None:
            problems.append("`%s` output not understood: ras_count.%s.%s of %s is %r"
                            % (JSON_COMMAND, key, block, bdf, value))
            continue
        total += found
    return total


def _mxlk_aer(entry: Dict[str, Any], bdf: str, problems: List[str]) -> Tuple[Tuple[str, int, int], ...]:
    key = next((k for k in entry if _MXLK_AER_KEY.search(str(k))), None)
    links = entry.get(key) if key is not None else None
    if not isinstance(links, dict):
        return ()
    out = []
    for link, counts in sorted(links.items(), key=lambda kv: (len(str(kv[0])), str(kv[0]))):
        if not isinstance(counts, dict):
            problems.append("`%s` output not understood: %s.%s of %s is %r" % (JSON_COMMAND, key, link, bdf, counts))
            continue
        found = {}
        for kind in ("ce", "ue"):
            name = next((k for k in counts if str(k).lower().rsplit("_", maxsplit=1)[-1] == kind), None)
            found[kind] = _count(counts[name]) if name is not None else None
        if found["ce"] is None or found["ue"] is None:
            problems.append("`%s` output not understood: %s.%s of %s is %r" % (JSON_COMMAND, key, link, bdf, counts))
            continue
        out.append((str(link), found["ce"], found["ue"]))
    return tuple(out)


def _device(bdf: str, entry: Dict[str, Any], problems: List[str]) -> JsonDevice:
    index = entry.get("device_id")
    reason = entry.get("unavailable_reason", "")
    readings = {}
    for key in ("utilization", "hotspot"):
        if key in entry:
            readings[key] = number(entry[key])
            if readings[key] is None:
                problems.append("`%s` output not understood: %s of %s is %r" % (JSON_COMMAND, key, bdf, entry[key]))
    return JsonDevice(
        bdf=bdf, index=index if isinstance(index, int) and not isinstance(index, bool) else None,
        unavailable_reason=reason if isinstance(reason, str) else str(reason),
        utilization_percent=readings.get("utilization"), temperature_celsius=readings.get("hotspot"),
        power_watts=_power(entry),
        vbios_version=str(entry["vbios_version"]) if entry.get("vbios_version") not in (None, "") else None,
        gpu_clock_mhz=_clock(entry, "XCORE"), memory_clock_mhz=_clock(entry, "MC"), pci_events=_pci_events(entry),
        ras_uncorrected=_ras(entry, "uncorrected_error", bdf, problems),
        ras_corrected=_ras(entry, "corrected_error", bdf, problems), mxlk_aer=_mxlk_aer(entry, bdf, problems))


def parse_json(text: str) -> MxSmiJson:
    """Parse ``mx-smi -j``: the version line (optional), then one JSON object."""
    version = None
    start = None
    lines = text.splitlines()
    for lineno, line in enumerate(lines):
        found = _VERSION.match(line)
        if found and version is None:
            version = found.group(1)
        if line.lstrip().startswith("{"):
            start = lineno
            break
    if start is None:
        first = next(((n, l) for n, l in enumerate(lines, start=1) if l.strip()), (1, ""))
        raise MxSmiParseError(JSON_COMMAND, "no JSON object", first[0], first[1])
    try:
        data = json.loads("\n".join(lines[start:]))
    except ValueError as exc:
        raise MxSmiParseError(JSON_COMMAND, "invalid JSON: %s" % exc, start + 1, lines[start])
    if not isinstance(data, dict):
        raise MxSmiParseError(JSON_COMMAND, "the JSON is not an object", start + 1, lines[start])
    problems: List[str] = []
    devices: List[JsonDevice] = []
    for key, entry in data.items():
        try:
            bdf = normalize_bdf(key)
        except ValueError:
            continue        # timestamp, versions, attached_gpus...
        if not isinstance(entry, dict):
            problems.append("`%s` output not understood: device %s is not an object" % (JSON_COMMAND, key))
            continue
        devices.append(_device(bdf, entry, problems))
    attached = data.get("attached_gpus")
    if isinstance(attached, int) and attached > len(devices):
        # VFs may be listed on top of the GPUs; fewer entries than GPUs is a layout we did not follow
        problems.append("`%s` output not understood: %d GPUs attached, %d devices read"
                        % (JSON_COMMAND, attached, len(devices)))

    def text_of(key: str) -> Optional[str]:
        value = data.get(key)
        return str(value) if value not in (None, "") else None

    return MxSmiJson(version=text_of("smi_version") or version, driver_version=text_of("driver_version"),
                     maca_version=text_of("maca_version"), devices=tuple(devices), problems=tuple(problems))
