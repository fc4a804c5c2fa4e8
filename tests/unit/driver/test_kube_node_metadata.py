# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""kube/node_metadata: which keys go, the patch that removes them, the refused prefixes (the module against a
real apiserver: tests/integration/test_kube_list_apiserver.py)."""

from __future__ import annotations

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.errors import MetaxGpuError
from ansible_collections.metax.gpu.plugins.module_utils.kube.node_metadata import (
    NodeChange, changes, check_prefix, diff, merge_patch,
)

P = "metax-tech.com/"


def node(name, labels=None, annotations=None):
    return {"metadata": {"name": name, "labels": labels, "annotations": annotations}}


def test_only_nodes_carrying_the_prefix_and_only_its_keys():
    nodes = [node("a", {P + "gpu.count": "8", "kubernetes.io/hostname": "a", "x.metax-tech.com/k": "v"},
                  {P + "gpu-topology": "[]"}),
             node("b", {"kubernetes.io/hostname": "b"}),        # nothing of ours: not written
             node("c", None, {P + "gpu-allocated": "x"})]
    found = changes(nodes, P)
    assert found == [NodeChange("a", {P + "gpu.count": "8"}, {P + "gpu-topology": "[]"}),
                     NodeChange("c", {}, {P + "gpu-allocated": "x"})]
    assert merge_patch(found[0]) == {"metadata": {"labels": {P + "gpu.count": None},
                                                  "annotations": {P + "gpu-topology": None}}}
    assert merge_patch(found[1]) == {"metadata": {"annotations": {P + "gpu-allocated": None}}}
    assert diff(found)["before"]["a"]["labels"] == {P + "gpu.count": "8"}
    assert diff(found)["after"] == {"a": {"labels": {}, "annotations": {}}, "c": {"labels": {}, "annotations": {}}}


@pytest.mark.parametrize("prefix", ["", "/", "metax-tech.com", "a/b/", "kubernetes.io/", "node-role.kubernetes.io/",
                                    "k8s.io/", "topology.k8s.io/"])
def test_refused_prefixes(prefix):
    with pytest.raises(MetaxGpuError):
        check_prefix(prefix)


def test_accepted_prefix():
    assert check_prefix(P) == P and check_prefix("example.kubernetes.io.example.com/")
