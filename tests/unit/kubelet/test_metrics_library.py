# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The agents' one metrics library (kubelet/metrics.py): prometheus_client's metrics in each agent's own
registry, and the same calls as no-ops where prometheus_client is not installed."""
from __future__ import annotations

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.deviceplugin.metrics import DevicePluginMetrics
from ansible_collections.metax.gpu.plugins.module_utils.extender.metrics import ExtenderMetrics
from ansible_collections.metax.gpu.plugins.module_utils.kubelet import metrics as lib


def exercise(extender, device):
    """Every kind of call the agents make."""
    extender.requests.labels("filter", "200").inc()
    extender.duration.labels("filter").observe(0.004)
    extender.nodes.labels("passed").inc(5)
    extender.weight.labels("score").set(2)
    extender.config_valid.set(0)
    device.set_devices([("0000:03:00.0", True), ("0000:04:00.0", False)])
    device.set_devices([("0000:03:00.0", True)])          # the gone device's series is removed
    device.latency.labels("Allocate").observe(0.001)
    device.registrations.inc()


@pytest.mark.skipif(not lib.HAS_PROMETHEUS, reason="prometheus_client is not installed")
def test_each_agent_has_its_own_registry_and_the_names_it_had():
    extender, device = ExtenderMetrics(), DevicePluginMetrics()
    exercise(extender, device)
    gpu_aware, gpu_device = extender.exposition().decode(), device.exposition().decode()
    assert "gpu_aware_requests_total" in gpu_aware and "metax_gpu" not in gpu_aware
    assert "metax_gpu_registrations_total 1.0" in gpu_device and "gpu_aware" not in gpu_device
    assert lib.sample(device.registry, "metax_gpu_device_healthy", device="0000:03:00.0") == 1
    assert lib.sample(device.registry, "metax_gpu_device_healthy", device="0000:04:00.0") is None
    assert extender.value("gpu_aware_weight", name="score") == 2


def test_without_prometheus_client_the_same_calls_record_nothing(monkeypatch):
    monkeypatch.setattr(lib, "HAS_PROMETHEUS", False)
    assert lib.new_registry() is None
    extender, device = ExtenderMetrics(), DevicePluginMetrics()
    assert extender.requests is lib.NOOP and device.latency is lib.NOOP
    exercise(extender, device)
    assert extender.exposition() == device.exposition() == lib.MISSING
    assert extender.value("gpu_aware_requests_total", verb="filter", code="200") == 0
    assert lib.RegistryExposition(lib.REGISTRY).exposition() == lib.MISSING
