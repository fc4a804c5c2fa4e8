"""One error base: a module catches MetaxGpuError and nothing else it expects."""
from __future__ import annotations

import ast
import importlib
import os

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.errors import MetaxGpuError

MODULE_UTILS = os.path.join(os.path.dirname(__file__), "..", "..", "plugins", "module_utils")
PACKAGE = "ansible_collections.metax.gpu.plugins.module_utils"
OPTIONAL = {"deviceplugin/server.py", "kubelet/registration.py", "kubelet/podresources.py",
            "agents/gpu_device.py"}     # need grpc


def _exception_classes():
    """Every class in module_utils whose name says it is an error, found in the source."""
    for dirpath, _dirs, files in os.walk(MODULE_UTILS):
        for name in sorted(files):
            if not name.endswith(".py") or name.endswith(("_pb2.py", "_pb2_grpc.py")):
                continue
            rel = os.path.relpath(os.path.join(dirpath, name), MODULE_UTILS)
            tree = ast.parse(open(os.path.join(dirpath, name)).read())
            for node in tree.body:
                if isinstance(node, ast.ClassDef) and any(
                        isinstance(b, ast.Name) and (b.id.endswith(("Error", "Exception")) or b.id == "MetaxGpuError")
                        for b in node.bases):
                    yield rel, node.name


# private control-flow exceptions (leading underscore) never reach a caller
CLASSES = sorted(c for c in set(_exception_classes()) if not c[1].startswith("_"))


def test_the_scan_finds_the_known_errors():
    names = {name for _rel, name in CLASSES}
    assert {"HostRootError", "DiscoveryError", "AllocationError", "WeightError", "BadRequest"} <= names


@pytest.mark.parametrize("rel, name", CLASSES, ids=["%s:%s" % c for c in CLASSES])
def test_every_library_error_derives_from_the_base(rel, name):
    if rel in OPTIONAL:
        pytest.importorskip("grpc")
    module = importlib.import_module(PACKAGE + "." + rel[:-3].replace(os.sep, "."))
    cls = getattr(module, name)
    assert issubclass(cls, MetaxGpuError), "%s.%s" % (rel, name)
