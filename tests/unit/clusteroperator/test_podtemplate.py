# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""podTemplateSpec merge: component beats global, lists append, maps merge, named items merge."""

from __future__ import annotations

from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator.podtemplate import apply_overrides, merge

TEMPLATE = {
    "metadata": {"labels": {"app": "gpu-device"}},
    "spec": {
        "nodeSelector": {"metax-tech.com/gpu.installed": "true"},
        "tolerations": [{"operator": "Exists"}],
        "containers": [{"name": "gpu-device", "image": "a", "env": [{"name": "NODE_NAME", "value": "x"}]}],
    },
}


def test_maps_merge_and_scalars_replace():
    assert merge({"a": 1, "b": {"c": 2}}, {"b": {"d": 3}, "a": 5}) == {"a": 5, "b": {"c": 2, "d": 3}}


def test_lists_append():
    assert merge([1, 2], [3]) == [1, 2, 3]
    assert merge({"t": [{"key": "a"}]}, {"t": [{"key": "b"}]}) == {"t": [{"key": "a"}, {"key": "b"}]}


def test_named_items_merge_instead_of_duplicating():
    out = merge([{"name": "c", "image": "a", "args": ["x"]}], [{"name": "c", "args": ["y"]}, {"name": "d"}])
    assert out == [{"name": "c", "image": "a", "args": ["x", "y"]}, {"name": "d"}]


def test_component_beats_global_and_both_apply():
    global_override = {"metadata": {"labels": {"team": "a"}},
                       "spec": {"priorityClassName": "low", "tolerations": [{"key": "g", "operator": "Exists"}]}}
    component_override = {
        "metadata": {"labels": {"team": "b"}},
        "spec": {"priorityClassName": "high", "tolerations": [{"key": "c", "operator": "Exists"}],
                 "containers": [{"name": "gpu-device", "env": [{"name": "EXTRA", "value": "1"}]}]},
    }
    out = apply_overrides(TEMPLATE, global_override, component_override)
    assert out["metadata"]["labels"] == {"app": "gpu-device", "team": "b"}
    assert out["spec"]["priorityClassName"] == "high"
    assert out["spec"]["tolerations"] == [{"operator": "Exists"}, {"key": "g", "operator": "Exists"},
                                          {"key": "c", "operator": "Exists"}]
    assert out["spec"]["containers"] == [{"name": "gpu-device", "image": "a",
                                          "env": [{"name": "NODE_NAME", "value": "x"},
                                                  {"name": "EXTRA", "value": "1"}]}]
    assert out["spec"]["nodeSelector"] == TEMPLATE["spec"]["nodeSelector"]


def test_inputs_are_not_modified_and_no_override_is_identity():
    before = repr(TEMPLATE)
    assert apply_overrides(TEMPLATE, None, {}) == TEMPLATE
    apply_overrides(TEMPLATE, {"spec": {"tolerations": [{"key": "x"}]}}, None)
    assert repr(TEMPLATE) == before
