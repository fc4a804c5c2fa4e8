# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The values -> spec mapping's pure parts (no helm): vfnumsConfig's two shapes, the values a real 0.9.2
install carries that we do not act on, and what a component that is on needs (issue 38).

test_operator_chart.py renders the chart with helm and compares it with these.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator import mapping

CHART = Path(__file__).resolve().parents[3] / "files" / "charts" / "metax-operator"


def test_vfnums_in_the_real_charts_nesting_and_flat():
    assert mapping.vfnums_entries({"nodes": {"node-a": {"vfnum": 4}}}) == {"node-a": {"vfnum": 4}}
    assert mapping.vfnums_entries({"node-a": {"vfnum": 4}}) == {"node-a": {"vfnum": 4}}
    # a node named "nodes" in the flat shape stays a node
    assert mapping.vfnums_entries({"nodes": {"vfnum": 8}}) == {"nodes": {"vfnum": 8}}
    # both at once: the nested entries win for a node named in both
    assert mapping.vfnums_entries({"nodes": {"a": {"vfnum": 2}}, "a": {"vfnum": 1}, "b": {"vfnum": 0}}) == {
        "a": {"vfnum": 2}, "b": {"vfnum": 0}}
    assert mapping.vfnums_entries(None) == {} and mapping.vfnums_entries({}) == {}
    # the input is not changed
    config = {"nodes": {"a": {"vfnum": 2}}}
    mapping.vfnums_entries(config)["a"]["vfnum"] = 8
    assert config == {"nodes": {"a": {"vfnum": 2}}}


def test_values_to_spec_flattens_vfnums_and_keeps_the_firmware_options():
    spec = mapping.values_to_spec({"registry": "r", "driver": {
        "vfnumsConfig": {"nodes": {"node-a": {"vfnum": 4}}}, "fwUpgradePolicy": "Never",
        "payload": {"version": "2.29.0.13", "pullPolicy": "Always"}}}, "0.1.0")
    assert spec["driver"]["vfnumsConfig"] == {"node-a": {"vfnum": 4}}
    assert spec["driver"]["fwUpgradePolicy"] == "Never"
    assert spec["driver"]["payload"] == {"version": "2.29.0.13", "pullPolicy": "Always", "registry": "r"}
    # and the controller hands driver-manager the flat entries whatever shape a CR holds
    values = mapping.spec_to_extension_values({"driver": {"vfnumsConfig": {"nodes": {"b": {"vfnum": 2}}}}}, {})
    assert values["driverManager"]["vfnumsConfig"] == {"b": {"vfnum": 2}}
    assert spec["vfioManager"]["image"]["name"] == "vfio-manager" and "deploy" not in spec["vfioManager"]


def test_ignored_values_are_named_when_set():
    values = {"serviceAccount": {"create": True}, "controller": {"image": "operator-controller"},
              "driver": {"image": {"version": "0.9.2"}, "cmInit": None}, "gpuDevice": {"podTemplateSpecFile": ""}}
    # controller.image as a string is ours; null counts as unset; "" is set
    assert mapping.ignored_values(values) == ["driver.image", "gpuDevice.podTemplateSpecFile", "serviceAccount"]
    values["controller"]["image"] = {"name": "operator-controller", "version": "0.9.2"}
    assert "controller.image" in mapping.ignored_values(values)
    assert mapping.ignored_values({}) == []


def test_every_ignored_value_is_accepted_by_the_schema_and_documented():
    schema = json.loads((CHART / "values.schema.json").read_text())
    docs = (Path(__file__).resolve().parents[3] / "docs" / "operator.md").read_text()
    for path in mapping.IGNORED_VALUES:
        node = schema
        for key in path.split("."):
            node = node["properties"][key]
        assert node, path
        assert "`%s`" % path.rsplit(".", 1)[-1] in docs or "`%s`" % path in docs, path


@pytest.mark.parametrize("values, missing", [
    ({}, ["driver.payload.version", "maca.payload.images"]),
    ({"minimal": True}, []),
    ({"driver": {"deploy": False}, "maca": {"deploy": False}}, []),
    ({"driver": {"payload": {"version": "2.12.13"}}}, ["maca.payload.images"]),
    ({"driver": {"payload": {"version": ""}}, "maca": {"payload": {"images": ["m:1"]}}}, ["driver.payload.version"]),
    ({"driver": {"payload": {"version": "2.12.13"}}, "maca": {"payload": {"images": ["m:1"]}}}, []),
])
def test_a_component_on_needs_its_payload(values, missing):
    assert mapping.missing_requirements(values) == missing


def test_the_health_policy_section_reaches_gpu_devices_values():
    """spec.devicePlugin.healthPolicy -> the Extensions chart's gpuDevice.healthPolicy (docs/health.md), as it is."""
    from ansible_collections.metax.gpu.plugins.module_utils.health.policy import parse_policy
    policy = {"recoveryReadings": 5, "rules": [{"signal": "pci-aer-ue", "threshold": 1, "severity": "critical",
                                                "action": "quarantine", "effect": "NoSchedule"}]}
    values = mapping.spec_to_extension_values({"devicePlugin": {"healthPolicy": policy}}, {})
    assert values["gpuDevice"]["healthPolicy"] == policy
    assert parse_policy(values["gpuDevice"]["healthPolicy"]).recovery_readings == 5
    assert mapping.spec_to_extension_values({}, {})["gpuDevice"]["healthPolicy"] == {}
    assert "healthPolicy" in next(s for s in mapping.SECTIONS if s["spec"] == "devicePlugin")["fields"]
