# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""One reading of a node's GPUs: what gpu-exporter serves until the next one.

Pure: :func:`device_metrics` merges what discovery knows (index, UUID,
product, PF/VF structure), what ``mx-smi -j`` and the ``mx-smi`` table say
now, and who holds each device (the kubelet's pod-resources API) into one
:class:`DeviceMetrics` per GPU and per VF, in base units (ratio 0-1, bytes,
watts, degrees Celsius). JSON values win over the table's; the table fills
what the JSON lacks (memory and processes, absent from real ``-j`` output).
A value no source reports stays None and its series is left out rather than
guessed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Tuple

from ..gpu.model import Inventory
from ..gpu.mxsmi import GpuSample, MxSmiTable
from ..gpu.mxsmi_ecc import ECC_ERROR_KEYS
from ..gpu.mxsmi_json import JsonDevice, MxSmiJson
from ..health.signals import EidCounts

MIB = 1024 * 1024
Owner = Tuple[str, str, str]     # namespace, pod, container


@dataclass(frozen=True)
class DeviceMetrics:
    gpu: int                      # index of the physical GPU (discovery's, as gpu-device numbers them)
    bdf: str                      # this function's PCI address (the device ID the kubelet sees)
    uuid: str                     # "" when unknown (VFs have none)
    product: str
    vf: bool
    healthy: bool
    utilization_ratio: Optional[float] = None
    memory_used_bytes: Optional[int] = None
    memory_total_bytes: Optional[int] = None
    temperature_celsius: Optional[float] = None
    power_watts: Optional[float] = None
    power_limit_watts: Optional[float] = None
    processes: Optional[int] = None
    owner: Optional[Owner] = None
    # for the mx-exporter families (exporter/mx_families.py); None where no source has it
    smi_index: Optional[int] = None            # mx-smi's GPU number (``-j`` device_id, the table's index)
    hotspot_celsius: Optional[float] = None    # ``-j`` hotspot only (the table does not say which sensor)
    gpu_clock_mhz: Optional[float] = None
    memory_clock_mhz: Optional[float] = None
    bios_version: Optional[str] = None
    pci_events: Tuple[Tuple[str, int], ...] = ()
    ecc_errors: Optional[int] = None           # ``--count-ecc``: SRAM and DRAM, correctable and not
    # health signals (docs/health.md): ``--count-ecc`` per kind (ECC_ERROR_KEYS and retired_*),
    # ``-j`` RAS and MetaXLink AER per link (link, ce, ue), EIDs from the kernel log
    ecc: Tuple[Tuple[str, int], ...] = ()
    ras_uncorrected: Optional[int] = None
    ras_corrected: Optional[int] = None
    mxlk_aer: Tuple[Tuple[str, int, int], ...] = ()
    eids: Optional[EidCounts] = None


@dataclass(frozen=True)
class Reading:
    """Everything one scrape serves; made once per interval, shared by every scraper."""

    taken_at: float                     # wall clock, seconds
    devices: Tuple[DeviceMetrics, ...]
    mx_smi_ok: bool                     # mx-smi answered and was understood this time
    source: str                         # "json+table", "json", "table" or "none"
    duration_seconds: float             # how long the reading took (mx-smi and pod-resources)
    pod_resources_ok: bool
    problems: Tuple[str, ...] = ()      # what could not be read, each once
    driver_version: str = ""            # the kernel driver's, as mx-smi reports it (else sysfs)


def driver_version(inventory: Optional[Inventory], smi_json: Optional[MxSmiJson], table: Optional[MxSmiTable]) -> str:
    """The driver version mx-smi reports (``-j``, else the table's header), else the loaded module's."""
    for found in (smi_json.driver_version if smi_json else None, table.driver_version if table else None,
                  inventory.driver.version if inventory is not None and inventory.driver.loaded else None):
        if found:
            return found
    return ""


def _ratio(percent: Optional[float]) -> Optional[float]:
    if percent is None:
        return None
    return max(0.0, min(1.0, percent / 100.0))


def _mib(value: Optional[int]) -> Optional[int]:
    return None if value is None else value * MIB


def _ecc_errors(counts: Optional[Mapping[str, int]]) -> Optional[int]:
    """SRAM and DRAM errors, correctable and not (retired pages are not errors)."""
    if counts is None:
        return None
    return sum(counts.get(key, 0) for key in ECC_ERROR_KEYS)


def device_metrics(inventory: Inventory, smi_json: Optional[MxSmiJson], table: Optional[MxSmiTable],
                   owners: Mapping[str, Owner],
                   ecc: Optional[Mapping[str, Mapping[str, int]]] = None,
                   eids: Optional[Mapping[str, EidCounts]] = None) -> Tuple[DeviceMetrics, ...]:
    """One entry per GPU and per VF of ``inventory``, PF first then its VFs, in discovery order.

    A GPU that a complete mx-smi answer does not list, or lists as
    unavailable, is unhealthy; when mx-smi gave no answer, health is what
    sysfs and the driver say (discovery's).
    """
    by_json: Dict[str, JsonDevice] = {d.bdf: d for d in smi_json.devices} if smi_json else {}
    samples: Dict[str, GpuSample] = {s.bdf: s for s in table.samples} if table else {}
    table_gpus = {g.bdf: g for g in table.gpus} if table else {}
    processes_by_bdf: Dict[str, int] = {}
    if table is not None and table.processes is not None:
        processes_by_bdf = {g.bdf: table.processes.get(g.index, 0) for g in table.gpus}
    listed = set(by_json) | set(table_gpus)
    complete = (smi_json is not None and not smi_json.problems) or (table is not None and not table.problems)
    answered = bool(listed)
    out = []
    for gpu in inventory.gpus:
        js = by_json.get(gpu.bdf)
        tg = table_gpus.get(gpu.bdf)
        if js is not None:
            available = js.available and (tg is None or tg.available)
        elif tg is not None:
            available = tg.available
        else:
            available = not (answered and complete)
        gpu_healthy = gpu.healthy and available
        sample = samples.get(gpu.bdf, GpuSample(gpu.bdf))
        total = sample.memory_total_mib
        out.append(DeviceMetrics(
            gpu=gpu.index, bdf=gpu.bdf, uuid=gpu.uuid or "", product=gpu.product, vf=False,
            healthy=gpu_healthy,
            utilization_ratio=_ratio(js.utilization_percent if js and js.utilization_percent is not None
                                     else sample.utilization_percent),
            memory_used_bytes=_mib(sample.memory_used_mib),
            memory_total_bytes=_mib(total) if total else (gpu.memory_gib * 1024 * MIB or None),
            temperature_celsius=(js.temperature_celsius if js and js.temperature_celsius is not None
                                 else sample.temperature_celsius),
            power_watts=js.power_watts if js and js.power_watts is not None else sample.power_watts,
            power_limit_watts=sample.power_cap_watts,
            processes=processes_by_bdf.get(gpu.bdf),
            owner=owners.get(gpu.bdf),
            smi_index=js.index if js is not None and js.index is not None else (tg.index if tg is not None else None),
            hotspot_celsius=js.temperature_celsius if js is not None else None,
            gpu_clock_mhz=js.gpu_clock_mhz if js is not None else None,
            memory_clock_mhz=js.memory_clock_mhz if js is not None else None,
            bios_version=(js.vbios_version if js is not None and js.vbios_version else
                          (table.bios_version if table is not None else None)),
            pci_events=js.pci_events if js is not None else (),
            ecc_errors=_ecc_errors((ecc or {}).get(gpu.bdf)),
            ecc=tuple(sorted(((ecc or {}).get(gpu.bdf) or {}).items())),
            ras_uncorrected=js.ras_uncorrected if js is not None else None,
            ras_corrected=js.ras_corrected if js is not None else None,
            mxlk_aer=js.mxlk_aer if js is not None else (),
            eids=(eids.get(gpu.bdf, EidCounts()) if eids is not None else None)))
        for device in inventory.devices:
            if device.gpu_index != gpu.index or not device.is_vf:
                continue
            vf = by_json.get(device.bdf)
            out.append(DeviceMetrics(
                gpu=gpu.index, bdf=device.bdf, uuid=device.uuid or "", product=gpu.product, vf=True,
                healthy=gpu_healthy and device.healthy and (vf is None or vf.available),
                utilization_ratio=_ratio(vf.utilization_percent) if vf else None,
                temperature_celsius=vf.temperature_celsius if vf else None,
                power_watts=vf.power_watts if vf else None,
                owner=owners.get(device.bdf)))
    return tuple(out)
