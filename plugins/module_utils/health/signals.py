# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The health signals of a MetaX node, one reading per GPU. Pure.

Every signal a real node offers (samples/README.md, "Health signals"), named
once here; the policy table (``policy``), gpu-device's node condition and
gpu-exporter's families use these names. Each signal is a number per GPU:

``state``    0 or 1 (1: the fault holds now), e.g. ``gpu-not-available``;
``counter``  a count that only grows until the driver or the GPU is reset
             (ECC, PCI events, RAS, MetaXLink AER, EIDs seen since gpu-device
             started).

A signal whose source did not answer is absent from a reading (unknown), never
0: the policy treats absent as "no news", so an mx-smi without ``-j`` does not
clear an ECC fault it can no longer see.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Mapping, Optional, Sequence, Tuple

from ..gpu.model import Inventory
from ..gpu.mxsmi_json import MxSmiJson

STATE = "state"
COUNTER = "counter"


@dataclass(frozen=True)
class SignalInfo:
    name: str
    kind: str          # STATE or COUNTER
    meaning: str       # for docs/health.md and the condition's readers
    source: str


# The four checks gpu-device always made (manual Table 2.2), then what mx-smi and the kernel log add.
_TABLE: Tuple[SignalInfo, ...] = (
    SignalInfo("gpu-lost", STATE, "the GPU fell off the PCI bus", "sysfs"),
    SignalInfo("driver-not-loaded", STATE, "the MetaX kernel module is not loaded", "sysfs (/sys/module/metax)"),
    SignalInfo("driver-unbound", STATE, "the GPU is not bound to the MetaX driver", "sysfs (the function's driver link)"),
    SignalInfo("mx-smi-unresponsive", STATE, "mx-smi does not answer or prints nothing we can read", "mx-smi"),
    SignalInfo("gpu-not-available", STATE, "mx-smi reports the GPU's state as not available", "mx-smi table GPU-State, -L, -j"),
    SignalInfo("ecc-sram-correctable", COUNTER, "SRAM ECC errors the hardware corrected", "mx-smi --count-ecc"),
    SignalInfo("ecc-sram-uncorrectable", COUNTER, "SRAM ECC errors it could not correct", "mx-smi --count-ecc"),
    SignalInfo("ecc-dram-correctable", COUNTER, "device memory (HBM) ECC errors corrected", "mx-smi --count-ecc"),
    SignalInfo("ecc-dram-uncorrectable", COUNTER, "device memory ECC errors not corrected: data was lost",
               "mx-smi --count-ecc"),
    SignalInfo("ecc-retired-pages", COUNTER, "device memory pages retired after double-bit ECC errors",
               "mx-smi --count-ecc (Retired Pages)"),
    SignalInfo("pci-aer-ue", COUNTER, "PCIe AER uncorrectable errors the driver saw", "mx-smi -j pci_event_info.aer_ue"),
    SignalInfo("pci-aer-ce", COUNTER, "PCIe AER correctable errors", "mx-smi -j pci_event_info.aer_ce"),
    SignalInfo("pci-synfld", COUNTER, "PCIe sync-flood events (a fatal error flooded the link)",
               "mx-smi -j pci_event_info.synfld"),
    SignalInfo("pci-dbe", COUNTER, "double-bit error events the driver raised", "mx-smi -j pci_event_info.dbe"),
    SignalInfo("pci-mmio", COUNTER, "MMIO access failures (the GPU stopped answering register reads)",
               "mx-smi -j pci_event_info.mmio"),
    SignalInfo("ras-uncorrected", COUNTER, "RAS uncorrected errors, summed over the GPU's blocks",
               "mx-smi -j ras_count.uncorrected_error"),
    SignalInfo("ras-corrected", COUNTER, "RAS corrected errors, summed over blocks", "mx-smi -j ras_count.corrected_error"),
    SignalInfo("mxlk-aer-ue", COUNTER, "MetaXLink AER uncorrectable errors, summed over the GPU's links",
               "mx-smi -j mxlk_aer_count"),
    SignalInfo("mxlk-aer-ce", COUNTER, "MetaXLink AER correctable errors, summed over links", "mx-smi -j mxlk_aer_count"),
    SignalInfo("eid-driver", COUNTER, "driver error ids (EIDs) in the kernel log since gpu-device started",
               "kernel log (the policy's eid.pattern)"),
    SignalInfo("eid-sdk", COUNTER, "SDK error ids in the kernel log / syslog since gpu-device started",
               "kernel log (the policy's eid.pattern)"),
)
SIGNALS: Dict[str, SignalInfo] = {s.name: s for s in _TABLE}
SIGNAL_NAMES: Tuple[str, ...] = tuple(s.name for s in _TABLE)

# parse_count_ecc keys -> signals
ECC_SIGNALS = (("sram_correctable", "ecc-sram-correctable"), ("sram_uncorrectable", "ecc-sram-uncorrectable"),
               ("dram_correctable", "ecc-dram-correctable"), ("dram_uncorrectable", "ecc-dram-uncorrectable"),
               ("retired_dbe", "ecc-retired-pages"))
# pci_event_info kinds -> signals
PCI_SIGNALS = (("aer_ue", "pci-aer-ue"), ("aer_ce", "pci-aer-ce"), ("synfld", "pci-synfld"),
               ("dbe", "pci-dbe"), ("mmio", "pci-mmio"))


@dataclass(frozen=True)
class EidCounts:
    """EIDs of one GPU since the reader started: counts and the last id, per source."""

    driver: int = 0
    sdk: int = 0
    last_driver: Optional[int] = None
    last_sdk: Optional[int] = None


@dataclass(frozen=True)
class GpuReading:
    bdf: str
    index: int
    uuid: str
    values: Mapping[str, int] = field(hash=False)      # signal -> value; absent: unknown
    details: Mapping[str, str] = field(hash=False, default_factory=dict)   # signal -> what an administrator reads

    def value(self, signal: str) -> Optional[int]:
        return self.values.get(signal)


@dataclass(frozen=True)
class NodeReading:
    taken_at: float                      # wall clock, seconds
    gpus: Tuple[GpuReading, ...]
    problems: Tuple[str, ...] = ()


def gpu_readings(inventory: Inventory, lost: Sequence[Tuple[str, int]] = (),
                 smi_json: Optional[MxSmiJson] = None, ecc: Optional[Mapping[str, Mapping[str, int]]] = None,
                 eids: Optional[Mapping[str, EidCounts]] = None) -> Tuple[GpuReading, ...]:
    """One reading per GPU of ``inventory`` and per GPU gpu-device knew that is gone (``lost``: (bdf, index)).

    ``ecc`` is :func:`gpu.mxsmi.parse_count_ecc`'s answer, ``smi_json``
    ``mx-smi -j``'s (None: not read this time, its signals unknown), ``eids``
    the EID counts per GPU address.
    """
    by_json = {d.bdf: d for d in smi_json.devices} if smi_json is not None else {}
    out = []
    loaded = inventory.driver.loaded
    for gpu in inventory.gpus:
        values: Dict[str, int] = {"gpu-lost": 0, "driver-not-loaded": 0 if loaded else 1}
        details: Dict[str, str] = {}
        if loaded:
            values["driver-unbound"] = 0 if gpu.driver_bound else 1
            values["mx-smi-unresponsive"] = 0 if inventory.mx_smi_available else 1
        js = by_json.get(gpu.bdf)
        if loaded and gpu.driver_bound and inventory.mx_smi_available:
            unavailable = not gpu.healthy or (js is not None and not js.available)
            values["gpu-not-available"] = 1 if unavailable else 0
            if js is not None and not js.available:
                details["gpu-not-available"] = js.unavailable_reason.strip()
        counts = (ecc or {}).get(gpu.bdf)
        if counts is not None:
            for key, signal in ECC_SIGNALS:
                if key in counts:
                    values[signal] = int(counts[key])
        if js is not None:
            events = dict(js.pci_events)
            for kind, signal in PCI_SIGNALS:
                if kind in events:
                    values[signal] = int(events[kind])
            if js.ras_uncorrected is not None:
                values["ras-uncorrected"] = js.ras_uncorrected
            if js.ras_corrected is not None:
                values["ras-corrected"] = js.ras_corrected
            if js.mxlk_aer:
                values["mxlk-aer-ce"] = sum(ce for _link, ce, _ue in js.mxlk_aer)
                values["mxlk-aer-ue"] = sum(ue for _link, _ce, ue in js.mxlk_aer)
                for signal, ue in (("mxlk-aer-ce", False), ("mxlk-aer-ue", True)):
                    bad = ["link %s: %d" % (link, n) for link, n in
                           ((name, u if ue else c) for name, c, u in js.mxlk_aer) if n]
                    if bad:
                        details[signal] = ", ".join(bad)
        if eids is not None:
            seen = eids.get(gpu.bdf, EidCounts())
            values["eid-driver"], values["eid-sdk"] = seen.driver, seen.sdk
            if seen.last_driver is not None:
                details["eid-driver"] = "last EID %d" % seen.last_driver
            if seen.last_sdk is not None:
                details["eid-sdk"] = "last SDK EID %d" % seen.last_sdk
        out.append(GpuReading(gpu.bdf, gpu.index, gpu.uuid or "", values, details))
    present = {g.bdf for g in inventory.gpus}
    for bdf, index in lost:
        if bdf not in present:
            out.append(GpuReading(bdf, index, "", {"gpu-lost": 1}, {"gpu-lost": "not on the PCI bus"}))
    return tuple(out)
