"""Node labels (DESIGN section 3 / manual Table 2.7) from inventories of simulated nodes."""
from __future__ import annotations

import dataclasses
import os
import re

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
        P + "gpu.product": "MXC500",
        P + "gpu.sriov": "forbidden",
        P + "gpu.vfnum": "0",
        P + "gpu.count": "8",
    }


def test_4xn100_cloud(make_node):
    labels = L.node_labels(discover(make_node("4xN100")), "cloud")
    assert labels[P + "gpu.family"] == "MXN" and labels[P + "gpu.product"] == "MXN100"
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
    assert labels[P + "gpu.count"] == "2" and labels[P + "gpu.product"] == "MXC550"


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
    # without mx-smi the PCI device id says only the family: 0x4001 may be an MXC500 or an MXC550
    assert labels[P + "gpu.product"] == "MXC" and labels[P + "gpu.family"] == "MXC"
    assert labels[P + "gpu.memory"] == "64GB"


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
    gpus[5] = dataclasses.replace(gpus[5], product="MXN100", family="MXN", memory_gib=16)
    gpus[6] = dataclasses.replace(gpus[6], product="new model/X (rev 2)", family="unknown", memory_gib=0)
    labels = L.node_labels(dataclasses.replace(inv, gpus=tuple(gpus)), "native")
    assert labels[N.LABEL_GPU_PRODUCT] == "MXC500_MXN100_new-model-X-rev-2"
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


FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


def _real_node_labels():
    """The metax-tech.com/ labels of the real MXC550 node running MetaX's operator 0.9.2."""
    with open(os.path.join(FIXTURES, "kubernetes", "node-labels-operator-0.9.2-MXC550.txt")) as handle:
        found = re.findall(r"^\s+(metax-tech\.com/[^:]+):\s*\"?([^\"\n]*)\"?$", handle.read(), re.MULTILINE)
    return dict(found)


def test_an_mxc550_node_carries_the_labels_metax_operator_0_9_2_writes(make_node):
    real = _real_node_labels()
    assert real[N.LABEL_GPU_PRODUCT] == "MXC550" and real[N.LABEL_GPU_FAMILY] == "MXC"
    inv = discover(make_node("2xC550-sriov"))
    ours = L.node_labels(inv, "cloud", DriverState(loaded=True, version="2.12.13"))
    same = (N.LABEL_GPU_PRODUCT, N.LABEL_GPU_FAMILY, N.LABEL_GPU_MEMORY, N.LABEL_GPU_INSTALLED, N.LABEL_DRIVER_MODE,
            N.LABEL_DRIVER_MAJOR, N.LABEL_DRIVER_MINOR, N.LABEL_DRIVER_PATCH)
    assert {k: ours[k] for k in same} == {k: real[k] for k in same}
    # gpu.sriov says what this node's GPUs can do (the simulated C550 can split, the real one could not)
    assert real[N.LABEL_GPU_SRIOV] == "forbidden" and ours[N.LABEL_GPU_SRIOV] == "off"
    # the real node shows no gpu.vfnum; ours is an additional label (docs/discovery.md says why it stays)
    assert N.LABEL_GPU_VFNUM not in real and ours[N.LABEL_GPU_VFNUM] == "0"


@pytest.mark.parametrize("printed, product, family", [
    ("MXC550-PL", "MXC550-PL", "MXC"), ("MetaX C500", "MXC500", "MXC"), ("MetaX N260", "MXN260", "MXN"),
])
def test_a_chip_name_with_a_suffix_or_a_new_model_is_labelled_as_printed(make_node, printed, product, family):
    from ansible_collections.metax.gpu.plugins.module_utils.gpu.model import chip_name, family_of
    inv = discover(make_node("1xC500"))
    gpus = tuple(dataclasses.replace(g, product=chip_name(printed), family=family_of(printed)) for g in inv.gpus)
    labels = L.node_labels(dataclasses.replace(inv, gpus=gpus), "native")
    assert labels[N.LABEL_GPU_PRODUCT] == product and labels[N.LABEL_GPU_FAMILY] == family


@pytest.mark.parametrize("current, desired_product, desired_family, kept", [
    ("MXC500", "MXC", "MXC", "MXC500"),          # driver unloaded: the product mx-smi named stays
    ("MXC550-PL", "MXC", "MXC", "MXC550-PL"),
    ("MXN100", "MXC", "MXC", "MXC"),             # another family: the hardware changed
    ("MXC", "MXC", "MXC", "MXC"),
    (None, "MXC", "MXC", "MXC"),
    ("MXC500", "MXC550", "MXC", "MXC550"),       # mx-smi names a product: it wins
    ("MXC500", "MXC_MXN", "MXC_MXN", "MXC_MXN"),
])
def test_a_family_only_answer_keeps_the_product_mx_smi_named(current, desired_product, desired_family, kept):
    desired = {N.LABEL_GPU_PRODUCT: desired_product, N.LABEL_GPU_FAMILY: desired_family}
    now = {N.LABEL_GPU_PRODUCT: current} if current else {}
    assert L.keep_known_product(now, desired)[N.LABEL_GPU_PRODUCT] == kept
    assert L.keep_known_product(now, desired)[N.LABEL_GPU_FAMILY] == desired_family
