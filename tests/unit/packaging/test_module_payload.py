"""What each module ships to a node: built with Ansible's own dependency finder.

``recursive_finder`` is what AnsiballZ uses to decide which module_utils go
into a module's payload (every import in the file, lazy ones included). No
simulator (``sim/``) and no agent entrypoint (``agents/``) may be in it: the
simulator must never run on a real node, and agents run in containers.
"""
from __future__ import annotations

import datetime
import glob
import inspect
import io
import json
import os
import subprocess
import sys
import zipfile

import pytest

PLUGINS = os.path.join(os.path.dirname(__file__), "..", "..", "..", "plugins")
MODULES = sorted(glob.glob(os.path.join(PLUGINS, "modules", "*.py")))
FORBIDDEN = ("plugins/module_utils/sim/", "plugins/module_utils/agents/")


def _finder_payload(module_path: str, collections_paths: list) -> list:
    """File names AnsiballZ would zip for ``module_path`` (run in a child process)."""
    from ansible.executor import module_common
    from ansible.plugins.loader import init_plugin_loader

    init_plugin_loader(collections_paths)
    name = os.path.splitext(os.path.basename(module_path))[0]
    with open(module_path, "rb") as handle:
        data = handle.read()
    kwargs = {}
    if "extension_manager" in inspect.signature(module_common.recursive_finder).parameters:
        # ansible-core >= 2.19
        from ansible._internal._ansiballz._builder import ExtensionManager
        from ansible._internal._datatag._tags import Origin
        kwargs["extension_manager"] = ExtensionManager()
        data = Origin(path=module_path).tag(data)
    with zipfile.ZipFile(io.BytesIO(), "w") as zf:
        module_common.recursive_finder(name, "ansible_collections.metax.gpu.plugins.modules." + name,
                                       data, zf, datetime.datetime(2020, 1, 1), **kwargs)
        return sorted(zf.namelist())


def payloads(module_paths: list) -> dict:
    """Run the finder in a child: its collection loader must not leak into this test session.

    One child for all the modules: starting Ansible's loader costs a child a second or two, and
    ``recursive_finder`` keeps no state between calls (AnsiballZ builds every module of a play in
    one controller process the same way)."""
    # every directory this session imports ansible_collections from, ours first (imported
    # here, not at the top: the child imports this file before installing Ansible's loader)
    import ansible_collections
    collections = [os.path.dirname(p) for p in ansible_collections.__path__]
    code = ("import json, sys; sys.path.insert(0, %r); import test_module_payload as t; "
            "print(json.dumps({p: t._finder_payload(p, %r) for p in %r}))"
            % (os.path.dirname(os.path.abspath(__file__)), collections, list(module_paths)))
    proc = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def payload(module_path: str) -> list:
    return payloads([module_path])[module_path]


@pytest.fixture(scope="module")
def module_payloads() -> dict:
    return payloads(MODULES)


@pytest.mark.parametrize("module_path", MODULES, ids=os.path.basename)
def test_module_payload_ships_no_simulator_and_no_agent(module_path, module_payloads):
    files = module_payloads[module_path]
    ours = [f for f in files if f.startswith("ansible_collections/metax/gpu/")]
    assert ours, "the dependency finder found none of our module_utils: %s" % files
    leaked = [f for f in ours if any(part in f for part in FORBIDDEN)]
    assert not leaked, "%s ships %s" % (os.path.basename(module_path), leaked)


def test_the_finder_sees_lazy_imports(tmp_path):
    """The check above is only as good as the finder: a function-level import of sim is caught."""
    module = tmp_path / "leaky.py"
    module.write_text(
        "def main():\n"
        "    from ansible_collections.metax.gpu.plugins.module_utils.sim.spec import preset\n"
        "    return preset\n")
    assert any("module_utils/sim/spec.py" in f for f in payload(str(module)))
