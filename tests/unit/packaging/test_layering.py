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


# -- floors: which layer may import which ---------------------------------------
#
# Each rule names an inversion that once existed (issue 40) and fails if it comes back.
# Targets are dotted paths below plugins/module_utils ("driver.inuse"); plugins/filter
# modules are "filter:<name>".

PLUGINS = os.path.join(MODULE_UTILS, "..")
FILTERS = os.path.join(PLUGINS, "filter")
COLLECTION = "ansible_collections.metax.gpu.plugins."


def _targets(rel, path):
    """Dotted targets of every import in ``path`` (``rel`` below module_utils, or ``filter/x.py``)."""
    package = rel.split(os.sep)[:-1]
    for module, level, _guarded in _imports(path):
        if level:
            base = package[:len(package) - (level - 1)]
            if base[:1] == ["filter"]:
                yield "filter:" + module
                continue
            yield ".".join(base + (module.split(".") if module else []))
        elif module.startswith(COLLECTION + "module_utils."):
            yield module[len(COLLECTION + "module_utils."):]
        elif module.startswith(COLLECTION + "filter."):
            yield "filter:" + module[len(COLLECTION + "filter."):]


def _all_targets():
    out = [(rel, list(_targets(rel, path))) for rel, path in FILES]
    for name in sorted(os.listdir(FILTERS)):
        if name.endswith(".py"):
            rel = os.path.join("filter", name)
            out.append((rel, list(_targets(rel, os.path.join(FILTERS, name)))))
    return out


TARGETS = _all_targets()


def _under(name, prefix):
    return name == prefix or name.startswith(prefix + ".")


def _violations(importers, forbidden, allowed=()):
    """(importer, target) pairs where a file under ``importers`` imports something under ``forbidden``."""
    found = []
    for rel, targets in TARGETS:
        dotted = rel[:-3].replace(os.sep, ".")
        if not any(_under(dotted, p) for p in importers):
            continue
        for target in targets:
            if any(_under(target, f) for f in forbidden) and not any(_under(target, a) for a in allowed):
                found.append((rel, target))
    return found


def test_floor_kube_imports_no_driver():
    """kube/ is the Kubernetes I/O layer under driver/: which pods hold GPUs is kube/pods."""
    assert _violations(["kube"], ["driver", "vfnum", "agents", "clusteroperator"]) == []


def test_floor_filter_plugins_import_no_filter_plugin():
    """Filter plugins share code through module_utils (node_checks, kube.pods, driver.rollout), never each other."""
    offenders = [(rel, t) for rel, targets in TARGETS if rel.startswith("filter" + os.sep)
                 for t in targets if t.startswith("filter:")]
    assert offenders == []


def test_floor_only_the_simulator_imports_the_simulator():
    """gpu/allocator_cli and everything shipped take no simulator import (sim/allocator_cli passes presets in)."""
    offenders = [(rel, t) for rel, targets in TARGETS if not rel.startswith("sim" + os.sep)
                 for t in targets if _under(t, "sim")]
    assert offenders == []


# gpu-exporter's metrics server is still deviceplugin.metrics (another change moves it to
# kubelet/ with one metrics library for every agent): remove the entry then.
EXPORTER_PENDING = ("deviceplugin.metrics",)


def test_floor_exporter_imports_no_device_plugin():
    """The exporter reads the kubelet through kubelet/, not through gpu-device's package."""
    importers = ["exporter", "agents.gpu_exporter"]
    assert _violations(importers, ["deviceplugin"], allowed=EXPORTER_PENDING) == []
    # each pending exception is still needed (else it is stale: delete it)
    for pending in EXPORTER_PENDING:
        assert any(_under(t, pending) for rel, t in _violations(importers, ["deviceplugin"])), pending


def test_floor_kubelet_is_below_the_agents_that_use_it():
    """kubelet/ serves gpu-device and gpu-exporter: it imports neither (only the generated stubs)."""
    assert _violations(["kubelet"], ["deviceplugin", "exporter", "agents"], allowed=["deviceplugin.api"]) == []


def test_floor_grpc_is_imported_once():
    """The guarded grpc import is kubelet/grpc_api's (and the generated stubs')."""
    importers = sorted(rel for rel, path in FILES
                       if not rel.endswith(GENERATED) and any(m.split(".")[0] == "grpc" for m, lvl, _g in _imports(path)
                                                              if not lvl))
    assert importers == [os.path.join("kubelet", "grpc_api.py")]


def _string_constants(path):
    tree = ast.parse(open(path).read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.value


def test_floor_open_device_users_is_written_once():
    """One /proc/<pid>/fd scan (gpu/users.py); driver/inuse and vfnum/backend word its results."""
    scanners = sorted(rel for rel, path in FILES if not rel.endswith(GENERATED)
                      and any(s.startswith("proc/") and s.endswith("/fd") for s in _string_constants(path)))
    assert scanners == [os.path.join("gpu", "users.py")]
