"""Import rules between the layers of plugins/module_utils.

* the library (everything but ``agents/``) never imports the agent entrypoints;
* nothing below the agents imports ``ansible.*`` (agents run without Ansible);
* third-party packages are imported only under ``try/except ImportError``.
"""
from __future__ import annotations

import ast
import os
import sys

import pytest

MODULE_UTILS = os.path.join(os.path.dirname(__file__), "..", "..", "..", "plugins", "module_utils")
STDLIB = set(getattr(sys, "stdlib_module_names", ())) | {"__future__"}
# Third-party packages each file may import, guarded; generated gRPC stubs excepted.
GENERATED = ("_pb2.py", "_pb2_grpc.py", "gen_protos.py")


def _files():
    for dirpath, _dirs, files in os.walk(MODULE_UTILS):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                yield os.path.relpath(path, MODULE_UTILS), path


def _imports(path):
    """(module name, level, guarded) of every import in the file."""
    tree = ast.parse(open(path).read(), path)
    guarded = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
                isinstance(h.type, ast.Name) and h.type.id == "ImportError" for h in node.handlers):
            for inner in node.body:
                for sub in ast.walk(inner):
                    guarded.add(id(sub))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, 0, id(node) in guarded
        elif isinstance(node, ast.ImportFrom):
            yield node.module or "", node.level, id(node) in guarded


FILES = list(_files())


@pytest.mark.parametrize("rel, path", FILES, ids=[rel for rel, _path in FILES])
def test_import_rules(rel, path):
    in_agents = rel.startswith("agents" + os.sep)
    package = rel.split(os.sep)[:-1]
    for module, level, guarded in _imports(path):
        if level:
            # resolve against module_utils/: level 1 is this file's package
            target = package[:len(package) - (level - 1)] + (module.split(".") if module else [])
            assert in_agents or target[:1] != ["agents"], "%s imports the agent entrypoints (%s)" % (
                rel, ".".join(target))
            continue
        top = module.split(".")[0]
        assert in_agents or ".module_utils.agents" not in module, "%s imports %s" % (rel, module)
        assert top != "ansible", (
            "%s imports %s: module_utils are shared with the agents, which run without Ansible" % (rel, module))
        if top not in STDLIB and top != "ansible_collections" and not rel.endswith(GENERATED):
            assert guarded, "%s imports third-party %s without a try/except ImportError guard" % (rel, module)
