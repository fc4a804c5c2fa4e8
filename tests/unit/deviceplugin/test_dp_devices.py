# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The advertised device list: health, vanished GPUs, SR-IOV reconfiguration."""

from __future__ import annotations

from ansible_collections.metax.gpu.plugins.module_utils.deviceplugin.devices import (
    DeviceState, health_transitions,
)
from ansible_collections.metax.gpu.plugins.module_utils.gpu.discovery import discover
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator


def healthy(state):
    return [d.healthy for d in state.snapshot().devices]


def present(state):
    return [d.present for d in state.snapshot().devices]


def set_vfs(host, count):
    for bdf in generator.load_state(host)["gpus"]:
        bdf = bdf["bdf"]
        host.write_attribute("sys/bus/pci/devices/%s/sriov_numvfs" % bdf, "0")
        if count:
            host.write_attribute("sys/bus/pci/devices/%s/sriov_numvfs" % bdf, str(count))


def test_gone_gpu_stays_unhealthy_then_recovers(make_node):
    host = make_node("8xC500")
    state = DeviceState(host)
    assert state.refresh()
    first = state.snapshot()
    assert len(first.devices) == 8 and len(first.healthy_ids) == 8
    assert first.inventory.topology.metaxlink_known
    assert not state.refresh()                     # nothing changed: same version
    assert state.version == first.version
    generator.fail_gpu(host, 3, "bus")
    assert state.refresh()
    snap = state.snapshot()
    gone = [d for d in snap.devices if not d.present]
    assert [(d.id, d.healthy) for d in gone] == [("0000:06:00.0", False)]
    assert len(snap.devices) == 8                  # capacity stays
    assert len(snap.inventory.devices) == 7        # the allocator sees the 7 left
    assert health_transitions(first, snap) == [("0000:06:00.0", False)]
    generator.recover_gpu(host, 3)
    assert state.refresh()
    assert [d.id for d in state.snapshot().devices] == [d.id for d in first.devices]
    assert all(healthy(state)) and all(present(state))


def test_driver_unload_and_metaxlink_rescan(make_node):
    host = make_node("8xC500")
    state = DeviceState(host)
    state.refresh()
    generator.unload_driver(host)
    assert state.refresh()
    assert not any(healthy(state))
    assert all(present(state))       # still on the bus
    generator.load_driver(host)
    assert state.refresh()
    assert all(healthy(state))
    # MetaXLink is known again after the driver came back (full rescan)
    assert state.snapshot().inventory.topology.metaxlink_known


def test_sriov_reconfiguration_replaces_devices(make_node):
    host = make_node("2xC550-sriov")
    state = DeviceState(host)
    state.refresh()
    assert [d.id for d in state.snapshot().devices] == [g.bdf for g in discover(host).gpus]
    set_vfs(host, 4)
    assert state.refresh()
    snap = state.snapshot()
    assert len(snap.devices) == 8 and all(d.healthy and d.present for d in snap.devices)
    assert all(d.device.is_vf for d in snap.devices)
    set_vfs(host, 0)
    state.refresh()
    assert len(state.snapshot().devices) == 2


def test_vfs_of_a_vanished_gpu_stay_unhealthy(make_node):
    host = make_node("2xC550-sriov")
    set_vfs(host, 2)
    state = DeviceState(host)
    state.refresh()
    assert len(state.snapshot().devices) == 4
    generator.fail_gpu(host, 1, "bus")
    state.refresh()
    devices = state.snapshot().devices
    assert len(devices) == 4
    assert [d.healthy for d in devices] == [True, True, False, False]


def test_unreadable_root_makes_everything_unhealthy(make_node):
    host = make_node("1xC500")
    calls = []

    def flaky(h, topology=True):
        calls.append(topology)
        if len(calls) > 2:
            raise OSError("sysfs went away")
        return discover(h, topology=topology)
    state = DeviceState(host, discover_fn=flaky)
    state.refresh()
    assert state.snapshot().healthy_ids == ["0000:03:00.0"]
    assert state.refresh()
    assert state.snapshot().healthy_ids == [] and len(state.snapshot().devices) == 1
    assert "sysfs went away" in state.last_error


def test_health_disabled_scans_once(make_node):
    host = make_node("8xC500")
    generator.fail_gpu(host, 0, "smi")
    state = DeviceState(host, check_health=False)
    state.refresh()
    scans = state.scans
    assert len(state.snapshot().healthy_ids) == 8
    generator.fail_gpu(host, 1, "bus")
    assert not state.refresh()
    assert state.scans == scans
