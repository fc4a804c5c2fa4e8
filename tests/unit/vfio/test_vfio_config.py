"""driver-config's vfio entry in the real 0.9.2 shape (a YAML list of nodeName/gpus)."""
from __future__ import annotations

import pytest
import yaml

from ansible_collections.metax.gpu.plugins.module_utils.vfio.config import Selection, entries, node_selection, \
    parse_gpus, unknown_nodes
from ansible_collections.metax.gpu.plugins.module_utils.vfio.plan import PassthroughError

REAL_SHAPE = """
- nodeName: vm
  gpus: "6,7"
- nodeName: vm-3
  gpus: "all"
"""


def test_the_real_shape():
    doc = yaml.safe_load(REAL_SHAPE)
    assert node_selection(doc, "vm") == Selection(indices=(6, 7))
    assert node_selection(doc, "vm-3") == Selection(all=True)
    assert node_selection(doc, "vm-2") is None
    assert unknown_nodes(doc, ["vm", "vm-2"]) == ["vm-3"]


@pytest.mark.parametrize("text,expected", [("0", (0,)), (" 7 , 6,6", (6, 7)), (3, (3,)), ("ALL", None)])
def test_gpus_forms(text, expected):
    got = parse_gpus(text)
    assert got == (Selection(all=True) if expected is None else Selection(indices=expected))


@pytest.mark.parametrize("text", ["", "6;7", "-1", "gpu6", True, None, [6]])
def test_bad_gpus_are_named(text):
    with pytest.raises(PassthroughError, match="all"):
        parse_gpus(text)


@pytest.mark.parametrize("doc,match", [
    ({"nodeName": "vm"}, "list"),
    ([{"gpus": "1"}], "nodeName"),
    ([{"nodeName": "vm"}], "no gpus"),
    ([{"nodeName": "vm", "gpus": "1"}, {"nodeName": "vm", "gpus": "2"}], "twice"),
    ([{"nodeName": "vm", "gpus": "1", "vfnum": 2}], "unknown key"),
])
def test_bad_entries_are_refused(doc, match):
    with pytest.raises(PassthroughError, match=match):
        entries(doc)


def test_empty_key_is_no_entry():
    assert entries(None) == {} and entries("") == {} and entries([]) == {}
