# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The component contract: readiness gates, minimal mode, deploy: false and node cleanup."""

from __future__ import annotations

import re
from pathlib import Path

from ansible_collections.metax.gpu.plugins.module_utils import names
from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator import components
from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator.contract import (
    cleanup_patch, deployed, gate_selector)

FIXTURES = Path(__file__).parent / "fixtures"

# container-runtime (issue 26), the driver and the MACA components (issue 25) are registered
RUNTIME = components.CONTAINER_RUNTIME
DRIVER = components.DRIVER        # its DaemonSet is the real metax-driver
MACA = components.MACA            # and this one the real metax-maca
FULL = components.REGISTRY
# container-runtime, the driver and MACA are deployed unless switched off (spec.<key>.deploy: false, or
# minimal), as in the real product (issue 38); a CR without deploy deploys them (the CRD's default too)
RUNTIME_ON = {"runtime": {"deploy": True}, "driver": {"deploy": True}, "maca": {"deploy": True}}
CHAIN_OFF = {"runtime": {"deploy": False}, "driver": {"deploy": False}, "maca": {"deploy": False}}


def real_selectors():
    """DaemonSet name -> node selector dict, from the real operator's `kubectl get ds`."""
    out = {}
    for line in (FIXTURES / "operator-0.9.2-daemonsets.txt").read_text().splitlines()[2:]:
        fields = line.split()
        if len(fields) < 8 or not fields[0].startswith("metax-"):
            continue
        sel = fields[6]
        out[fields[0][len("metax-"):]] = {} if sel == "<none>" else dict(p.split("=") for p in sel.split(","))
    return out


def test_full_chain_reproduces_the_real_operators_selectors():
    real = real_selectors()
    for component in (RUNTIME, DRIVER, MACA, components.GPU_DEVICE, components.GPU_LABEL):
        assert gate_selector(component, FULL, RUNTIME_ON) == real[component.name.replace("metax-", "", 1)], \
            component.name


def test_the_chain_skips_labels_nobody_sets():
    # Without runtime and MACA components, gpu-device waits only for gpu.installed.
    assert gate_selector(components.GPU_DEVICE, components.REGISTRY, CHAIN_OFF) == {
        names.LABEL_GPU_INSTALLED: "true"}
    assert gate_selector(components.GPU_LABEL, components.REGISTRY, CHAIN_OFF) == {}


def test_an_empty_spec_is_the_whole_chain_as_the_real_product():
    # a CR without deploy members (the real 0.9.2 CR has none for these) deploys the chain
    assert gate_selector(components.GPU_DEVICE, components.REGISTRY, {}) == gate_selector(
        components.GPU_DEVICE, components.REGISTRY, RUNTIME_ON) == {
        names.LABEL_GPU_INSTALLED: "true", names.LABEL_MACA_READY: "true", names.LABEL_RUNTIME_READY: "true"}


def test_minimal_mode_and_deploy_false_drop_the_label_from_the_chain():
    minimal = {"minimal": True}
    assert gate_selector(components.GPU_DEVICE, FULL, minimal) == {names.LABEL_GPU_INSTALLED: "true"}
    no_maca = dict(RUNTIME_ON, maca={"deploy": False})
    assert gate_selector(components.GPU_DEVICE, FULL, no_maca) == {
        names.LABEL_GPU_INSTALLED: "true", names.LABEL_RUNTIME_READY: "true"}


def test_deployed():
    assert deployed(components.GPU_DEVICE, {})
    assert deployed(RUNTIME, {}) and deployed(RUNTIME, RUNTIME_ON) and not deployed(RUNTIME, CHAIN_OFF)
    assert deployed(DRIVER, {}) and deployed(MACA, {}) and not deployed(DRIVER, {"minimal": True})
    assert not deployed(components.GPU_AWARE, {})
    assert deployed(components.GPU_AWARE, {"gpuAware": {"deploy": True}})
    assert not deployed(components.GPU_AWARE, {"gpuAware": {"deploy": True}, "minimal": True})
    assert deployed(components.GPU_LABEL, {"minimal": True})
    assert not deployed(components.GPU_LABEL, {"labelgen": {"deploy": False}})
    assert not deployed(MACA, {"minimal": True})


def test_cleanup_patch_removes_owned_keys_only():
    labels = {"metax-tech.com/gpu.installed": "true", "metax-tech.com/gpu.product": "C500",
              "metax-tech.com/driver.ready": "true", "metax-tech.com/maca.ready": "true",
              "kubernetes.io/hostname": "vm", "metax-tech.com/agents.paused": "x"}
    annotations = {names.ANNOTATION_DEVICES: "[]", "node.alpha.kubernetes.io/ttl": "0"}
    patch = cleanup_patch(labels, annotations, components.REGISTRY)
    assert patch == {"labels": {"metax-tech.com/gpu.installed": None, "metax-tech.com/gpu.product": None,
                                "metax-tech.com/driver.ready": None, "metax-tech.com/maca.ready": None},
                     "annotations": {names.ANNOTATION_DEVICES: None}}
    assert set(cleanup_patch(labels, {}, FULL)["labels"]) == {
        k for k in labels if k.startswith("metax-tech.com/") and k != "metax-tech.com/agents.paused"}
    assert cleanup_patch({"kubernetes.io/os": "linux"}, {}, FULL) == {}


def test_every_registered_component_is_documented_in_chain_order():
    seen = set()
    owners = {c.ready_label: c.name for c in FULL if c.ready_label}
    for component in components.REGISTRY:
        for label in component.requires:
            owner = owners.get(label)
            assert owner is None or owner in seen or owner not in components.BY_NAME, (component.name, label)
        seen.add(component.name)
    assert re.match(r"^[a-z-]+$", "".join(components.BY_NAME))
