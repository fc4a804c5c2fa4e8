"""Argument specs and doc fragments come in pairs: same options, types and defaults.

A doc fragment ``plugins/doc_fragments/<name>.py`` documents exactly the
options of ``<NAME>_ARGSPEC`` in ``plugins/module_utils/common.py``; modules
compose the spec with copy.deepcopy and extend the fragment by name.
"""
from __future__ import annotations

import glob
import importlib
import os

import pytest
import yaml

from ansible_collections.metax.gpu.plugins.module_utils import common

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
FRAGMENTS = sorted(os.path.splitext(os.path.basename(p))[0]
                   for p in glob.glob(os.path.join(ROOT, "plugins", "doc_fragments", "*.py"))
                   if not p.endswith("__init__.py"))


@pytest.mark.parametrize("name", FRAGMENTS)
def test_fragment_and_argspec_agree(name):
    fragment = importlib.import_module("ansible_collections.metax.gpu.plugins.doc_fragments." + name)
    documented = yaml.safe_load(fragment.ModuleDocFragment.DOCUMENTATION)["options"]
    spec = getattr(common, name.upper() + "_ARGSPEC")
    assert sorted(documented) == sorted(spec)
    for option, doc in documented.items():
        assert doc.get("type", "str") == spec[option].get("type", "str"), option
        assert doc.get("default") == spec[option].get("default"), option
        assert bool(doc.get("no_log")) == bool(spec[option].get("no_log")), option


def test_action_group_node_lists_the_modules_taking_host_root():
    with open(os.path.join(ROOT, "meta", "runtime.yml")) as handle:
        runtime = yaml.safe_load(handle)
    node = set(runtime["action_groups"]["node"])
    taking_host_root = set()
    for path in glob.glob(os.path.join(ROOT, "plugins", "modules", "*.py")):
        with open(path) as handle:
            if "metax.gpu.host_root" in handle.read():
                taking_host_root.add(os.path.splitext(os.path.basename(path))[0])
    assert node == taking_host_root
