# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Prometheus metrics of gpu-device and its HTTP endpoint (/metrics, /healthz).

Metric names (all gauges are per node; see docs/agents.md):

``metax_gpu_devices``                     devices advertised to the kubelet
``metax_gpu_devices_healthy``             of which Healthy
``metax_gpu_devices_allocated``           of which assigned to containers (pod-resources API)
``metax_gpu_device_healthy{device}``      1 Healthy / 0 Unhealthy, per device ID
``metax_gpu_allocation_duration_seconds{rpc}``  histogram of Allocate / GetPreferredAllocation
``metax_gpu_allocation_errors_total{rpc}``      requests answered with an error
``metax_gpu_registrations_total``         successful registrations with the kubelet
``metax_gpu_annotation_patches_total{result}``  node annotation patches (ok / error)
``metax_gpu_discovery_warnings``          warnings of the latest device scan
``metax_gpu_mx_smi_unparsed``             of which about mx-smi output not understood
                                          (discovery fell back to PCI/sysfs for it)

Without prometheus_client the metrics are no-ops. The library (one guarded
import) and the bounded HTTP server of /metrics and /healthz are the
agents' own: kubelet/metrics.py.
"""

from __future__ import annotations

import threading
from typing import Any, Iterable, Set, Tuple

from ..kubelet.metrics import counter, exposition, gauge, histogram, new_registry


class DevicePluginMetrics:
    """The metrics of one gpu-device instance (its own registry)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._device_ids: Set[str] = set()
        # prometheus_client metrics (kubelet.metrics.NOOP stand-ins when it is not installed)
        reg = self.registry = new_registry()
        self.devices: Any = gauge("metax_gpu_devices", "MetaX GPU devices advertised to the kubelet", registry=reg)
        self.healthy: Any = gauge("metax_gpu_devices_healthy", "Advertised devices that are Healthy", registry=reg)
        self.allocated: Any = gauge("metax_gpu_devices_allocated",
                                    "Devices assigned to containers (kubelet pod-resources API)", registry=reg)
        self.device_healthy: Any = gauge("metax_gpu_device_healthy", "1 when the device is Healthy, else 0",
                                         ["device"], registry=reg)
        self.latency: Any = histogram("metax_gpu_allocation_duration_seconds",
                                      "Time to answer Allocate and GetPreferredAllocation", ["rpc"], registry=reg)
        self.errors: Any = counter("metax_gpu_allocation_errors", "Allocation requests answered with an error",
                                   ["rpc"], registry=reg)
        self.registrations: Any = counter("metax_gpu_registrations", "Successful registrations with the kubelet",
                                          registry=reg)
        self.patches: Any = counter("metax_gpu_annotation_patches", "Node annotation patches", ["result"],
                                    registry=reg)
        self.discovery_warnings: Any = gauge("metax_gpu_discovery_warnings", "Warnings of the latest device scan",
                                             registry=reg)
        self.mx_smi_unparsed: Any = gauge("metax_gpu_mx_smi_unparsed",
                                          "Warnings of the latest device scan about mx-smi output that was not "
                                          "understood (discovery fell back to PCI/sysfs)", registry=reg)

    def set_devices(self, devices: Iterable[Tuple[str, bool]]) -> None:
        """``devices``: (id, healthy) of every advertised device."""
        items = list(devices)
        with self._lock:
            self.devices.set(len(items))
            self.healthy.set(sum(1 for _id, ok in items if ok))
            ids = set()
            for dev_id, ok in items:
                self.device_healthy.labels(dev_id).set(1 if ok else 0)
                ids.add(dev_id)
            for gone in self._device_ids - ids:
                try:
                    self.device_healthy.remove(gone)
                except KeyError:
                    pass
            self._device_ids = ids

    def exposition(self) -> bytes:
        return exposition(self.registry)
