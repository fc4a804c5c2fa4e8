"""gpu-device stops advertising GPUs handed to VMs, and its topology annotations follow (issue 43)."""
from __future__ import annotations

import json

from ansible_collections.metax.gpu.plugins.module_utils import names
from ansible_collections.metax.gpu.plugins.module_utils.deviceplugin.annotations import node_annotations
from ansible_collections.metax.gpu.plugins.module_utils.deviceplugin.containers import discover_for_containers, \
    without_vm_gpus
from ansible_collections.metax.gpu.plugins.module_utils.deviceplugin.devices import DeviceState
from ansible_collections.metax.gpu.plugins.module_utils.gpu.discovery import discover
from ansible_collections.metax.gpu.plugins.module_utils.vfio import backend
from ansible_collections.metax.gpu.plugins.module_utils.vfio.plan import plan, reconcile


def _state(host):
    state = DeviceState(host, discover_fn=discover_for_containers)
    state.refresh()
    return state


def test_gpus_6_and_7_leave_the_pool_and_the_annotations(make_node):
    host = make_node("8xC500")
    state = _state(host)
    bdfs = [d.id for d in state.snapshot().devices]
    assert len(bdfs) == 8
    backend.apply(host, plan(backend.read_node(host), to_vm=[6, 7]))
    assert state.refresh() is True
    snap = state.snapshot()
    assert [d.id for d in snap.devices] == bdfs[:6] and all(d.healthy for d in snap.devices)
    annotations = node_annotations(snap, frozenset())
    assert sorted(json.loads(annotations[names.ANNOTATION_SCORES]), key=int) == [str(n) for n in range(1, 7)]
    entries = json.loads(annotations[names.ANNOTATION_DEVICES])
    assert [e["bdf"] for e in entries] == bdfs[:6]
    # the second MetaXLink group keeps its two GPUs left, with their indices (CDI names stay)
    assert [g.gpu_indices for g in snap.inventory.topology.link_groups] == [(0, 1, 2, 3), (4, 5)]
    assert [e["index"] for e in entries] == [0, 1, 2, 3, 4, 5]
    backend.apply(host, reconcile(backend.read_node(host), wanted=[]))
    assert state.refresh() is True
    assert [d.id for d in state.snapshot().devices] == bdfs


def test_a_gpu_on_its_way_is_already_out(make_node):
    host = make_node("8xC500")
    bdf = backend.read_node(host).gpus[0].bdf
    host.write_attribute("sys/bus/pci/devices/%s/driver_override" % bdf, "vfio-pci")
    assert bdf not in [d.id for d in discover_for_containers(host).devices]


def test_nothing_held_is_the_same_inventory(make_node):
    host = make_node("2xC550-sriov")
    inventory = discover(host)
    assert without_vm_gpus(inventory, frozenset()) is inventory
    assert discover_for_containers(host).devices == inventory.devices
