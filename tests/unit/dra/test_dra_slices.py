# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""gpu-dra's ResourceSlices from simulated nodes read by the real discovery (pure builder)."""

from __future__ import annotations

import copy
import re

from ansible_collections.metax.gpu.plugins.module_utils.dra import slices as S
from ansible_collections.metax.gpu.plugins.module_utils.gpu.discovery import discover
from ansible_collections.metax.gpu.plugins.module_utils.gpu.labels import node_labels
from ansible_collections.metax.gpu.plugins.module_utils.names import DRA_DRIVER, DRA_TAINT_UNHEALTHY, LABEL_GPU_PRODUCT
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def attr(device, name):
    value = device["attributes"][name]
    (kind, inner), = value.items()
    return inner


def test_every_gpu_is_a_device_with_typed_attributes(make_node):
    inv = discover(make_node("8xC500"))
    devices = S.build_devices(inv)
    assert len(devices) == 8
    product = node_labels(inv, "native")[LABEL_GPU_PRODUCT]
    for dev, gpu in zip(devices, inv.gpus):
        assert DNS_LABEL.match(dev["name"]) and dev["name"] == S.device_name(gpu.bdf)
        assert attr(dev, "productName") == product == "MXC500"     # as gpu-label names it
        assert attr(dev, "uuid") == gpu.uuid and attr(dev, "serial") == gpu.serial
        assert attr(dev, S.ATTR_PCI_BUS_ID) == gpu.bdf
        assert attr(dev, S.ATTR_PCIE_ROOT) == gpu.pci_path.root_complex and gpu.pci_path.root_complex.startswith("pci")
        assert attr(dev, "numaNode") == gpu.numa_node
        assert attr(dev, "function") == "PF"
        assert set(dev["attributes"]["driverVersion"]) == {"version"}
        assert dev["capacity"] == {"memory": {"value": "64Gi"}}
        assert "taints" not in dev
    # the manual's two MetaXLink groups of four
    groups = [attr(d, "metaxLinkGroup") for d in devices]
    assert groups == [0, 0, 0, 0, 4, 4, 4, 4]


def test_gpus_without_metaxlink_are_each_their_own_group(make_node):
    inv = discover(make_node("4xN100"))
    groups = [attr(d, "metaxLinkGroup") for d in S.build_devices(inv)]
    assert groups == [0, 1, 2, 3]


def test_vfs_are_devices_of_their_own_tied_to_their_pf(make_node):
    host = make_node("2xC550-sriov")
    pf_dirs = sorted(generator.gpu_sysfs_dirs(host).values())
    generator.set_numvfs(host, pf_dirs[0], 4)
    inv = discover(host)
    devices = S.build_devices(inv)
    vfs = [d for d in devices if attr(d, "function") == "VF"]
    pfs = [d for d in devices if attr(d, "function") == "PF"]
    assert len(vfs) == 4 and len(pfs) == 1          # the virtualised PF is not allocatable itself
    gpu0 = inv.gpus[0]
    assert {attr(v, "physicalFunction") for v in vfs} == {gpu0.bdf}
    assert sorted(attr(v, S.ATTR_PCI_BUS_ID) for v in vfs) == sorted(gpu0.vf_bdfs)
    assert all(v["capacity"]["memory"]["value"] == "%dMi" % (gpu0.memory_gib * 1024 // 4) for v in vfs)
    assert all("uuid" not in v["attributes"] for v in vfs)
    assert len({v["name"] for v in devices}) == 5


def test_unhealthy_devices_are_tainted_and_gone_ones_kept(make_node):
    inv = discover(make_node("8xC500"))
    bdfs = [g.bdf for g in inv.gpus]
    devices = S.build_devices(inv, health={bdfs[2]: False})
    assert S.tainted(devices) == [(S.device_name(bdfs[2]), S.REASON_UNHEALTHY)]
    assert devices[2]["taints"] == [{"key": DRA_TAINT_UNHEALTHY, "value": "Unhealthy", "effect": "NoSchedule"}]
    # a device gone from the bus keeps its last entry, tainted Gone
    smaller = discover(make_node("1xC500"))
    kept = S.build_devices(smaller, previous=devices, gone=[bdfs[5], "0000:ff:00.0"])
    assert [d["name"] for d in kept][-1] == S.device_name(bdfs[5])
    assert S.tainted(kept) == [(S.device_name(bdfs[5]), S.REASON_GONE)]
    assert "taints" not in devices[5]        # the previous list is not changed


def test_semver():
    assert S.semver("2.14.6") == "2.14.6"
    assert S.semver("3.0.0.8") == "3.0.0+8"
    assert S.semver("03.1.2") == "3.1.2"
    assert S.semver("2.14") is None and S.semver("2.x.1") is None and S.semver(None) is None


def test_plan_creates_then_is_quiet_then_bumps_the_generation(make_node):
    inv = discover(make_node("8xC500"))
    devices = S.build_devices(inv)
    first = S.plan("node-a", devices, [])
    assert first.generation == 1 and len(first.create) == 1 and not first.update and not first.delete
    item = first.create[0]
    assert item["apiVersion"] == "resource.k8s.io/v1" and item["kind"] == "ResourceSlice"
    assert item["spec"]["driver"] == DRA_DRIVER and item["spec"]["nodeName"] == "node-a"
    assert item["spec"]["pool"] == {"name": "node-a", "generation": 1, "resourceSliceCount": 1}
    stored = copy.deepcopy(item)
    stored["metadata"]["resourceVersion"] = "17"
    assert not S.plan("node-a", devices, [stored]).changed
    # a GPU fails: the taint is published with the next generation, as an update
    sick = S.build_devices(inv, health={inv.gpus[0].bdf: False})
    second = S.plan("node-a", sick, [stored])
    assert second.generation == 2 and not second.create and not second.delete
    assert second.update[0]["metadata"]["resourceVersion"] == "17"
    assert second.update[0]["spec"]["pool"]["generation"] == 2
    # the API server stamps timeAdded: unchanged still, and kept on the next update
    stamped = copy.deepcopy(second.update[0])
    stamped["spec"]["devices"][0]["taints"][0]["timeAdded"] = "2026-11-28T10:00:00Z"
    assert not S.plan("node-a", sick, [stamped]).changed
    sicker = S.build_devices(inv, health={inv.gpus[0].bdf: False, inv.gpus[1].bdf: False})
    third = S.plan("node-a", sicker, [stamped])
    assert third.generation == 3
    assert third.update[0]["spec"]["devices"][0]["taints"][0]["timeAdded"] == "2026-11-28T10:00:00Z"
    assert "timeAdded" not in third.update[0]["spec"]["devices"][1]["taints"][0]
    # recovered: the taints go
    fourth = S.plan("node-a", devices, [third.update[0]])
    assert fourth.generation == 4 and S.tainted(fourth.update[0]["spec"]["devices"]) == []


def test_plan_splits_large_pools_and_deletes_what_the_pool_no_longer_has(make_node):
    inv = discover(make_node("8xC500"))
    devices = S.build_devices(inv)
    split = S.plan("n", devices, [], per_slice=3)
    assert [s["metadata"]["name"] for s in split.create] == ["n-%s-%d" % (DRA_DRIVER, i) for i in range(3)]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in split.create} == {3}
    assert sum(len(s["spec"]["devices"]) for s in split.create) == 8
    merged = S.plan("n", devices, split.create, per_slice=64)
    assert merged.generation == 2 and len(merged.update) == 1 and merged.delete == [
        "n-%s-1" % DRA_DRIVER, "n-%s-2" % DRA_DRIVER]
    # a node without GPUs publishes one empty slice (the pool exists, with nothing in it)
    empty = S.plan("n", [], [])
    assert len(empty.create) == 1 and "devices" not in empty.create[0]["spec"]
