"""Node labels (DESIGN section 3 / manual Table 2.7) from inventories of simulated nodes."""
from __future__ import annotations

import dataclasses

import pytest

from ansible_collections.metax.gpu.plugins.module_utils import names as N
from ansible_collections.metax.gpu.plugins.module_utils.gpu import labels as L
from ansible_collections.metax.gpu.plugins.module_utils.gpu.discovery import discover
from ansible_collections.metax.gpu.plugins.module_utils.gpu.model import DriverState
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator

P = "metax-tech.com/"


def test_8xc500_native(make_node):
    inv = discover(make_node("8xC500"))
    assert L.node_labels(inv, "native") == {
        P + "gpu.installed": "true",
        P + "driver.ready": "true",
        P + "gpu.driver.major": "2",
        P + "gpu.driver.minor": "14",
        P + "gpu.driver.patch": "6",
        P + "gpu.driver.mode": "native",
        P + "gpu.family": "MXC",
        P + "gpu.memory": "64GB",
        P + "gpu.product": "C500",
        P + "gpu.sriov": "forbidden",
        P + "gpu.vfnum": "0",
        P + "gpu.count": "8",
    }


def test_4xn100_cloud(make_node):
    labels = L.node_labels(discover(make_node("4xN100")), "cloud")
    assert labels[P + "gpu.family"] == "MXN" and labels[P + "gpu.product"] == "N100"
    assert labels[P + "gpu.memory"] == "16GB" and labels[P + "gpu.driver.mode"] == "cloud"


def test_sriov_on_reports_vfnum(make_node):
    host = make_node("2xC550-sriov")
    inv = discover(host)
    labels = L.node_labels(inv, "cloud")
    assert labels[P + "gpu.sriov"] == "off" and labels[P + "gpu.vfnum"] == "0"
    for gpu in inv.gpus:
        host.write_attribute("/sys/bus/pci/devices/%s/sriov_numvfs" % gpu.bdf, "4")
    labels = L.node_labels(discover(host), "cloud")
    assert labels[P + "gpu.sriov"] == "on" and labels[P + "gpu.vfnum"] == "4"
    assert labels[P + "gpu.count"] == "2" and labels[P + "gpu.product"] == "C550"


def test_no_gpu_only_installed_false(make_node):
    assert L.node_labels(None, "native") == {P + "gpu.installed": "false"}
    inv = discover(make_node("8xC500"))
    empty = dataclasses.replace(inv, gpus=(), devices=())
    assert L.node_labels(empty, "cloud") == {P + "gpu.installed": "false"}


def test_driver_not_loaded_drops_version_labels(make_node):
    host = make_node("8xC500")
    generator.unload_driver(host)
    labels = L.node_labels(discover(host), "native")
    assert labels[P + "driver.ready"] == "false"
    assert not any(k in labels for k in (N.LABEL_DRIVER_MAJOR, N.LABEL_DRIVER_MINOR, N.LABEL_DRIVER_PATCH))
    assert labels[P + "gpu.product"] == "C500"     # PCI ids still say what is installed


def test_driver_override_and_partial_version(make_node):
    inv = discover(make_node("8xC500"))
    labels = L.node_labels(inv, "native", DriverState(loaded=True, version="3.1"))
    assert labels[N.LABEL_DRIVER_MAJOR] == "3" and labels[N.LABEL_DRIVER_MINOR] == "1" and N.LABEL_DRIVER_PATCH not in labels
    labels = L.node_labels(inv, "native", DriverState(loaded=True, version=None))
    assert labels[N.LABEL_DRIVER_READY] == "true" and N.LABEL_DRIVER_MAJOR not in labels
    labels = L.node_labels(inv, "native", DriverState(loaded=False, version="2.14.6"))
    assert labels[N.LABEL_DRIVER_READY] == "false" and N.LABEL_DRIVER_MAJOR not in labels


def test_mixed_and_unknown_products(make_node):
    inv = discover(make_node("8xC500"))
    gpus = list(inv.gpus)
    gpus[5] = dataclasses.replace(gpus[5], product="N100", family="MXN", memory_gib=16)
    gpus[6] = dataclasses.replace(gpus[6], product="new model/X (rev 2)", family="unknown", memory_gib=0)
    labels = L.node_labels(dataclasses.replace(inv, gpus=tuple(gpus)), "native")
    assert labels[N.LABEL_GPU_PRODUCT] == "C500_N100_new-model-X-rev-2"
    assert labels[N.LABEL_GPU_FAMILY] == "MXC_MXN_unknown"
    assert labels[N.LABEL_GPU_MEMORY] == "64GB_16GB"


def test_bad_mode_rejected(make_node):
    with pytest.raises(ValueError, match="native/cloud"):
        L.node_labels(None, "host")


def test_every_value_is_a_valid_label_value_and_key_is_owned(make_node):
    for name in ("8xC500", "4xN100", "2xC550-sriov", "16xC500", "1xC500"):
        labels = L.node_labels(discover(make_node(name)), "cloud")
        for key, value in labels.items():
            assert key in L.OWNED_LABEL_KEYS and key.startswith(N.LABEL_PREFIX)
            assert L.is_valid_label_value(value), (key, value)
    assert L.owned_label_keys() == L.OWNED_LABEL_KEYS
    assert len(set(L.OWNED_LABEL_KEYS)) == len(L.OWNED_LABEL_KEYS)


@pytest.mark.parametrize("text, expected", [
    ("C500", "C500"), ("  x y  ", "x-y"), ("-._", "unknown"), ("a" * 80, "a" * 63), ("é", "unknown"),
])
def test_label_value(text, expected):
    assert L.label_value(text) == expected and L.is_valid_label_value(expected)


def test_label_changes_removes_stale_owned_keys_only():
    current = {N.LABEL_DRIVER_MAJOR: "2", N.LABEL_DRIVER_READY: "true", N.LABEL_GPU_INSTALLED: "true", "other/x": "y"}
    desired = {N.LABEL_DRIVER_READY: "false", N.LABEL_GPU_INSTALLED: "true"}
    assert L.label_changes(current, desired) == {N.LABEL_DRIVER_READY: "false", N.LABEL_DRIVER_MAJOR: None}
    assert L.label_changes(desired, desired) == {}
