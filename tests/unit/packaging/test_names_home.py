"""One home per name: names.py spells every metax-tech.com/ key, cdi/spec the CDI device name.

A key spelt anywhere else drifts the day names.py changes (issue 40 found four copies of the
annotation keys and a fifth key outside names.py). Module documentation (YAML in docstrings)
may quote keys; code may not.
"""
from __future__ import annotations

import ast
import glob
import os
import re

from ansible_collections.metax.gpu.plugins.module_utils import names as N

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..")
PLUGINS = os.path.join(ROOT, "plugins")
# a whole string that is one of our keys (a label or annotation name), not a sentence quoting one
KEY = re.compile(r"^%s[A-Za-z0-9][A-Za-z0-9_.-]*$" % re.escape(N.PREFIX))
YAML_KEY = re.compile(r"(?<![\w.-])%s[A-Za-z0-9_.-]*[A-Za-z0-9]" % re.escape(N.PREFIX))
NAMES = {value for value in vars(N).values() if isinstance(value, str)}


def _python_files():
    for dirpath, _dirs, files in os.walk(PLUGINS):
        for name in sorted(files):
            if name.endswith(".py") and not name.endswith(("_pb2.py", "_pb2_grpc.py")):
                path = os.path.join(dirpath, name)
                yield os.path.relpath(path, PLUGINS), path


def _docstrings(tree):
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                yield id(first.value)


def _module_doc_assignments(tree):
    """DOCUMENTATION / EXAMPLES / RETURN strings of a module (YAML documentation, not code)."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id in ("DOCUMENTATION", "EXAMPLES", "RETURN") for t in node.targets):
            yield id(node.value)


def test_no_key_is_spelt_outside_names_py():
    spelt = []
    for rel, path in _python_files():
        if rel == os.path.join("module_utils", "names.py"):
            continue
        tree = ast.parse(open(path).read(), path)
        skip = set(_docstrings(tree)) | set(_module_doc_assignments(tree))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                if KEY.match(node.value):
                    spelt.append("%s:%d %s" % (rel, node.lineno, node.value))
    assert spelt == [], "keys spelt outside names.py (import them from names.py): %s" % spelt


def test_every_key_in_roles_and_playbooks_is_a_name_names_py_defines():
    """The roles' YAML cannot import names.py; each key it spells must still be one names.py defines."""
    unknown = []
    files = glob.glob(os.path.join(ROOT, "roles", "**", "*.yml"), recursive=True)
    files += glob.glob(os.path.join(ROOT, "playbooks", "**", "*.yml"), recursive=True)
    checked = 0
    for path in sorted(files):
        rel = os.path.relpath(path, ROOT)
        if os.sep + "templates" + os.sep in rel or os.sep + "files" + os.sep in rel:
            continue
        for key in YAML_KEY.findall(open(path).read()):
            checked += 1
            if key not in NAMES:
                unknown.append("%s: %s" % (rel, key))
    assert checked, "no key found: the scan is broken"
    assert unknown == []


def test_the_cdi_device_name_is_built_in_one_place():
    """cdi.spec.qualified_name builds ``metax-tech.com/gpu=<name>``; everyone else calls it."""
    from ansible_collections.metax.gpu.plugins.module_utils.cdi.spec import qualified_name
    from ansible_collections.metax.gpu.plugins.module_utils.deviceplugin.cdi import qualified

    assert qualified_name(0) == N.CDI_KIND + "=0" == qualified(0)
    assert qualified_name("GPU-1", "vendor.com/x") == "vendor.com/x=GPU-1"
    users = []
    for rel, path in _python_files():
        tree = ast.parse(open(path).read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and any(a.name == "CDI_KIND" for a in node.names):
                users.append(rel)
    assert users == [os.path.join("module_utils", "cdi", "spec.py")]
