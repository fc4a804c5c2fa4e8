# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The Prometheus text exposition (format 0.0.4) of a reading. Pure.

Every metric is listed in :data:`DEVICE_METRICS` and :data:`EXPORTER_METRICS`
(docs/metrics.md is generated from the same words). Per-device series carry
``node``, ``gpu``, ``uuid``, ``bdf``, ``product`` and ``function`` (``pf`` or
``vf``), and ``namespace``/``pod``/``container`` while the kubelet has
assigned the device to a container. A value no source reported is left out
(no series), never written as 0. The mx-exporter families (``mx_*``,
:mod:`.mx_families`) follow the device families, from the same reading.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from .mx_families import mx_samples
from .readings import DeviceMetrics, Reading

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DEVICE_LABELS = ("node", "gpu", "uuid", "bdf", "product", "function")
OWNER_LABELS = ("namespace", "pod", "container")


@dataclass(frozen=True)
class MetricDef:
    name: str
    kind: str          # gauge | counter
    help: str
    unit: str          # for docs/metrics.md
    value: Optional[Callable[[DeviceMetrics], Optional[float]]] = None


DEVICE_METRICS: Tuple[MetricDef, ...] = (
    MetricDef("metax_gpu_utilization_ratio", "gauge", "GPU utilisation reported by mx-smi (0-1)", "ratio",
              lambda d: d.utilization_ratio),
    MetricDef("metax_gpu_memory_used_bytes", "gauge", "Device memory in use", "bytes",
              lambda d: d.memory_used_bytes),
    MetricDef("metax_gpu_memory_total_bytes", "gauge", "Device memory in total", "bytes",
              lambda d: d.memory_total_bytes),
    MetricDef("metax_gpu_temperature_celsius", "gauge", "GPU temperature (hotspot where mx-smi -j reports it)",
              "celsius", lambda d: d.temperature_celsius),
    MetricDef("metax_gpu_power_watts", "gauge", "Board power draw", "watts", lambda d: d.power_watts),
    MetricDef("metax_gpu_power_limit_watts", "gauge", "Board power cap", "watts", lambda d: d.power_limit_watts),
    MetricDef("metax_gpu_healthy", "gauge",
              "1 when the device is usable (driver bound, mx-smi reports it available), else 0", "boolean",
              lambda d: 1 if d.healthy else 0),
    MetricDef("metax_gpu_processes", "gauge", "Processes using the GPU (mx-smi's process table)", "processes",
              lambda d: d.processes),
    MetricDef("metax_gpu_allocated", "gauge",
              "1 while the kubelet has assigned the device to a container (labels namespace, pod, container)",
              "boolean", lambda d: 1 if d.owner else 0),
)

EXPORTER_METRICS: Tuple[MetricDef, ...] = (
    MetricDef("metax_gpu_exporter_mx_smi_up", "gauge",
              "1 when the latest reading got an answer from mx-smi that was understood", "boolean"),
    MetricDef("metax_gpu_exporter_mx_smi_runs_total", "counter",
              "mx-smi runs by command (json, table, ecc) and result (ok, error, timeout, unparsed)", "runs"),
    MetricDef("metax_gpu_exporter_reading_duration_seconds", "gauge",
              "Time the latest reading took (mx-smi and pod-resources)", "seconds"),
    MetricDef("metax_gpu_exporter_reading_age_seconds", "gauge",
              "Seconds since the reading this scrape serves was taken", "seconds"),
    MetricDef("metax_gpu_exporter_reading_timestamp_seconds", "gauge",
              "Unix time of the reading this scrape serves", "seconds"),
    MetricDef("metax_gpu_exporter_readings_total", "counter", "Readings started (one per interval at most)",
              "readings"),
    MetricDef("metax_gpu_exporter_scrapes_total", "counter", "Requests of /metrics served", "scrapes"),
    MetricDef("metax_gpu_exporter_pod_resources_up", "gauge",
              "1 when the latest reading learnt the allocations from the kubelet's pod-resources API", "boolean"),
    MetricDef("metax_gpu_exporter_problems", "gauge",
              "Problems of the latest reading (mx-smi failures, output not understood); each is logged",
              "problems"),
)


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs: Sequence[Tuple[str, str]]) -> str:
    if not pairs:
        return ""
    return "{" + ",".join('%s="%s"' % (k, escape(v)) for k, v in pairs) + "}"


def format_value(value: float) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "+Inf" if value > 0 else "-Inf"
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return repr(value)
    return str(value)


def device_labels(node: str, device: DeviceMetrics) -> List[Tuple[str, str]]:
    pairs = [("node", node), ("gpu", str(device.gpu)), ("uuid", device.uuid), ("bdf", device.bdf),
             ("product", device.product), ("function", "vf" if device.vf else "pf")]
    if device.owner:
        pairs += list(zip(OWNER_LABELS, device.owner))
    return pairs


def _family(lines: List[str], metric: MetricDef, samples: Iterable[Tuple[Sequence[Tuple[str, str]], float]]) -> None:
    lines.append("# HELP %s %s" % (metric.name, metric.help))
    lines.append("# TYPE %s %s" % (metric.name, metric.kind))
    for labels, value in samples:
        lines.append("%s%s %s" % (metric.name, _labels(labels), format_value(value)))


@dataclass(frozen=True)
class ExporterState:
    """The exporter's own numbers at scrape time."""

    runs: Mapping[Tuple[str, str], int]   # (command, result) -> count
    readings: int
    scrapes: int
    age_seconds: Optional[float]


def render(node: str, reading: Optional[Reading], state: ExporterState) -> str:
    """The exposition: device families (empty families are left out), then the exporter's own."""
    lines: List[str] = []
    devices = reading.devices if reading is not None else ()
    for metric in DEVICE_METRICS:
        getter = metric.value
        if getter is None:
            continue
        samples = []
        for device in devices:
            value = getter(device)
            if value is not None:
                samples.append((device_labels(node, device), float(value)))
        if samples:
            _family(lines, metric, samples)
    # mx-exporter's names, for dashboards made for MetaX's own operator (exporter/mx_families.py)
    for mx, found in mx_samples(node, reading):
        _family(lines, MetricDef(mx.name, mx.kind, mx.help, mx.unit), found)
    own: Dict[str, List[Tuple[Sequence[Tuple[str, str]], float]]] = {m.name: [] for m in EXPORTER_METRICS}
    nodes = [("node", node)]
    if reading is not None:
        own["metax_gpu_exporter_mx_smi_up"].append((nodes, 1.0 if reading.mx_smi_ok else 0.0))
        own["metax_gpu_exporter_reading_duration_seconds"].append((nodes, reading.duration_seconds))
        own["metax_gpu_exporter_reading_timestamp_seconds"].append((nodes, reading.taken_at))
        own["metax_gpu_exporter_pod_resources_up"].append((nodes, 1.0 if reading.pod_resources_ok else 0.0))
        own["metax_gpu_exporter_problems"].append((nodes, float(len(reading.problems))))
    else:
        own["metax_gpu_exporter_mx_smi_up"].append((nodes, 0.0))
    if state.age_seconds is not None:
        own["metax_gpu_exporter_reading_age_seconds"].append((nodes, state.age_seconds))
    for (command, result), count in sorted(state.runs.items()):
        own["metax_gpu_exporter_mx_smi_runs_total"].append(
            (nodes + [("command", command), ("result", result)], float(count)))
    own["metax_gpu_exporter_readings_total"].append((nodes, float(state.readings)))
    own["metax_gpu_exporter_scrapes_total"].append((nodes, float(state.scrapes)))
    for metric in EXPORTER_METRICS:
        if own[metric.name]:
            _family(lines, metric, own[metric.name])
    return "\n".join(lines) + "\n"
