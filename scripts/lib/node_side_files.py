"""Print the files that run on a GPU node: every module and the module_utils it imports.

An import walk over the AST (lazy imports included, as Ansible's own
dependency finder does), following this collection's imports only. agents/
and sim/ never ship in a module (tests/unit/packaging/test_module_payload.py)
and run on Python 3.11, so they are not node-side. Used by the lint phase to
check the Python 3.8 floor with vermin.
"""
from __future__ import annotations

import ast
import glob
import os
import sys

PREFIX = "ansible_collections.metax.gpu."


def _resolve(path: str, root: str, node: ast.AST) -> list:
    """Collection-relative module paths (``plugins/module_utils/x``) an import refers to."""
    names = []
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            package = os.path.relpath(os.path.dirname(path), root).split(os.sep)
            base = package[:len(package) - (node.level - 1)]
            mod = base + (node.module.split(".") if node.module else [])
            names = [".".join(mod)] + [".".join(mod + [a.name]) for a in node.names]
            return [n.replace(".", "/") for n in names]
        if node.module:
            names = [node.module] + [node.module + "." + a.name for a in node.names]
    return [n[len(PREFIX):].replace(".", "/") for n in names if n.startswith(PREFIX)]


def node_side(root: str) -> list:
    todo = sorted(glob.glob(os.path.join(root, "plugins", "modules", "*.py")))
    seen = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        with open(path) as handle:
            tree = ast.parse(handle.read(), path)
        for node in ast.walk(tree):
            for rel in _resolve(path, root, node):
                for candidate in (rel + ".py", rel + "/__init__.py"):
                    full = os.path.join(root, candidate)
                    if os.path.isfile(full) and full not in seen:
                        todo.append(full)
    return sorted(os.path.relpath(p, root) for p in seen)


if __name__ == "__main__":
    for name in node_side(sys.argv[1] if len(sys.argv) > 1 else "."):
        print(name)
