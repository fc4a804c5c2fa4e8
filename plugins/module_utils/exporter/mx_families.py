# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The families MetaX's own exporter (mx-exporter) serves, beside ``metax_gpu_*``. Pure.

Dashboards, alerts and tools built for MetaX's GPU Operator query
mx-exporter's names, units and labels (``mx_gpu_usage``,
``mx_memory_used{type="vram"}``, ``mx_board_power`` in mW ...; see
docs/metrics.md, "MetaX exporter families"). gpu-exporter serves each of
them whose value it reads from mx-smi, from the same reading as its own
families, so a dashboard made for the real product shows the same GPUs.

Series are per physical GPU (mx-exporter's ``deviceId`` is mx-smi's GPU
number); a value no source reported is left out, never written as 0. The
labels are mx-exporter's: ``deviceId``, ``uuid``, ``Hostname``,
``driver_version``, ``bios_version``, ``modelName``, and
``exported_namespace``/``exported_pod``/``exported_container`` while the
kubelet has assigned the whole GPU to a container (the names a Prometheus
ServiceMonitor leaves them under). A label we have no value for is left
out (``die_id``: mx-smi prints no die number).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

from ..gpu.mxsmi_ecc import ECC_ERROR_KEYS
from .readings import DeviceMetrics, Reading

Labels = Tuple[Tuple[str, str], ...]
Sample = Tuple[Labels, float]
MX_LABELS = ("deviceId", "uuid", "Hostname", "driver_version", "bios_version", "modelName")
MX_OWNER_LABELS = ("exported_namespace", "exported_pod", "exported_container")
# mx_memory_*{type}: device memory (what mx-smi's Memory-Usage cell reports) is
# "vram", the value dashboards made for the real product select
MEMORY_TYPE = "vram"
KIB = 1024


@dataclass(frozen=True)
class MxFamily:
    name: str
    kind: str
    help: str
    unit: str         # for docs/metrics.md
    source: str       # for docs/metrics.md
    samples: Callable[[DeviceMetrics], Sequence[Sample]]


def _one(value: Optional[float], extra: Labels = ()) -> Sequence[Sample]:
    return [] if value is None else [(extra, float(value))]


def _kib(value: Optional[int]) -> Optional[float]:
    return None if value is None else value / KIB


def _usage(d: DeviceMetrics) -> Optional[float]:
    if d.memory_used_bytes is None or not d.memory_total_bytes:
        return None
    return round(100.0 * d.memory_used_bytes / d.memory_total_bytes, 2)


def _percent(ratio: Optional[float]) -> Optional[float]:
    return None if ratio is None else round(ratio * 100.0, 2)


def _milliwatts(watts: Optional[float]) -> Optional[float]:
    return None if watts is None else round(watts * 1000.0, 3)


_VRAM: Labels = (("type", MEMORY_TYPE),)

MX_FAMILIES: Tuple[MxFamily, ...] = (
    MxFamily("mx_gpu_usage", "gauge", "GPU utilization (%)", "%", "`-j` utilization, else the table's GPU-Util",
             lambda d: _one(_percent(d.utilization_ratio))),
    MxFamily("mx_memory_total", "gauge", "Device memory in total (KB)", "KB (1024 bytes)",
             "the table's Memory-Usage total", lambda d: _one(_kib(d.memory_total_bytes), _VRAM)),
    MxFamily("mx_memory_used", "gauge", "Device memory in use (KB)", "KB (1024 bytes)",
             "the table's Memory-Usage used", lambda d: _one(_kib(d.memory_used_bytes), _VRAM)),
    MxFamily("mx_memory_usage", "gauge", "Device memory in use (%)", "%", "used / total of the table",
             lambda d: _one(_usage(d), _VRAM)),
    MxFamily("mx_board_power", "gauge", "Board power draw (mW)", "mW",
             "`-j` board_power (rails summed), else the table's Pwr:Usage", lambda d: _one(_milliwatts(d.power_watts))),
    MxFamily("mx_chip_hotspot_temp", "gauge", "Chip hotspot temperature (C)", "°C", "`-j` hotspot",
             lambda d: _one(d.hotspot_celsius)),
    MxFamily("mx_gpu_clock", "gauge", "GPU core clock (MHz)", "MHz", "`-j` clocks.XCORE",
             lambda d: _one(d.gpu_clock_mhz)),
    MxFamily("mx_mem_clock", "gauge", "Memory clock (MHz)", "MHz", "`-j` clocks.MC",
             lambda d: _one(d.memory_clock_mhz)),
    MxFamily("mx_gpu_state", "gauge", "GPU state: 0 not available, 1 available", "1/0",
             "driver bound and mx-smi reporting the GPU available (as metax_gpu_healthy)",
             lambda d: _one(1.0 if d.healthy else 0.0)),
    MxFamily("mx_pci_event", "gauge", "Driver PCI events by type (aer_ue, aer_ce, synfld, dbe, mmio)", "events",
             "`-j` pci_event_info: the events listed per type",
             lambda d: [((("type", kind),), float(count)) for kind, count in d.pci_events]),
    MxFamily("mx_ecc_error_count", "gauge", "Total ECC errors", "errors",
             "`--count-ecc`: SRAM and DRAM, correctable and uncorrectable, summed (run every 4th reading)",
             lambda d: _one(d.ecc_errors)),
    # health signals (docs/health.md): what gpu-device's health policy reads, per GPU
    MxFamily("mx_ecc_error_detail", "gauge", "ECC errors by memory (sram, dram) and type (ce, ue)", "errors",
             "`--count-ecc`: each of SRAM/DRAM Correctable/Uncorrectable",
             lambda d: [((("memory", k.split("_")[0]), ("type", "ce" if k.endswith("_correctable") else "ue")),
                         float(v)) for k, v in d.ecc if k in ECC_ERROR_KEYS]),
    MxFamily("mx_retired_pages", "gauge", "Device memory pages retired, by cause (dbe: double-bit ECC)", "pages",
             "`--count-ecc` Retired Pages",
             lambda d: [((("type", k[len("retired_"):]),), float(v)) for k, v in d.ecc if k.startswith("retired_")]),
    MxFamily("mx_ras_count", "gauge", "RAS errors summed over the GPU's blocks, by type (uncorrected, corrected)",
             "errors", "`-j` ras_count",
             lambda d: [((("type", t),), float(v)) for t, v in (("uncorrected", d.ras_uncorrected),
                                                                ("corrected", d.ras_corrected)) if v is not None]),
    MxFamily("mx_mxlk_aer_count", "gauge", "MetaXLink AER errors per link, by type (ce, ue)", "errors",
             "`-j` mxlk_aer_count (the simulator's form: docs/health.md)",
             lambda d: [((("mxlkId", link), ("type", t)), float(v)) for link, ce, ue in d.mxlk_aer
                        for t, v in (("ce", ce), ("ue", ue))]),
    MxFamily("mx_driver_eid_errors", "gauge", "The last driver error id (EID) in the kernel log (0: none seen)", "EID",
             "the kernel log, read from gpu-exporter's start (eid pattern: docs/health.md)",
             lambda d: _one(None if d.eids is None else float(d.eids.last_driver or 0))),
    MxFamily("mx_sdk_eid_errors", "gauge", "The last SDK error id (EID) in the kernel log (0: none seen)", "EID",
             "the kernel log, as mx_driver_eid_errors",
             lambda d: _one(None if d.eids is None else float(d.eids.last_sdk or 0))),
    MxFamily("mx_driver_eid_count", "gauge", "Driver EIDs seen in the kernel log since gpu-exporter started",
             "EIDs", "the kernel log", lambda d: _one(None if d.eids is None else float(d.eids.driver))),
    MxFamily("mx_sdk_eid_count", "gauge", "SDK EIDs seen in the kernel log since gpu-exporter started",
             "EIDs", "the kernel log", lambda d: _one(None if d.eids is None else float(d.eids.sdk))),
    MxFamily("mx_device_type", "gauge", "1, with the GPU's chip name in deviceType", "1",
             "discovery's product (the chip name, as gpu.product)",
             lambda d: [((("deviceType", d.product),), 1.0)] if d.product else []),
)


def mx_labels(node: str, driver_version: str, device: DeviceMetrics) -> Labels:
    """mx-exporter's labels of one GPU; those without a value are left out."""
    pairs: List[Tuple[str, str]] = [
        ("deviceId", str(device.smi_index if device.smi_index is not None else device.gpu)),
        ("uuid", device.uuid)]
    if device.owner:
        namespace, pod, container = device.owner
        pairs += [("exported_namespace", namespace), ("exported_pod", pod), ("exported_container", container)]
    pairs += [("Hostname", node), ("driver_version", driver_version), ("bios_version", device.bios_version or ""),
              ("modelName", device.product)]
    return tuple((k, v) for k, v in pairs if v)


def mx_samples(node: str, reading: Optional[Reading]) -> List[Tuple[MxFamily, List[Sample]]]:
    """(family, samples) of every family that has a sample; physical GPUs only (a VF has no deviceId)."""
    devices = [d for d in (reading.devices if reading is not None else ()) if not d.vf]
    version = reading.driver_version if reading is not None else ""
    out = []
    for family in MX_FAMILIES:
        found: List[Sample] = []
        for device in devices:
            base = mx_labels(node, version, device)
            found += [(base + extra, value) for extra, value in family.samples(device)]
        if found:
            out.append((family, found))
    return out
