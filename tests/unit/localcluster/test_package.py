# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The package's shape: stdlib only (cluster.sh runs it before the venv exists), one Files protocol."""

from __future__ import annotations

import ast
import os
import sys

from localcluster import cluster, envfile
from localcluster.component import Files, Write

PKG = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "localcluster")


def test_standard_library_only():
    for name in sorted(os.listdir(PKG)):
        if not name.endswith(".py"):
            continue
        with open(os.path.join(PKG, name), encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                mods = [node.module or ""]
            else:
                continue
            for mod in mods:
                assert mod.split(".")[0] in sys.stdlib_module_names, "%s imports %s" % (name, mod)


def test_every_component_has_the_files_shape(settings, three, inputs):
    comps = cluster.components(settings, three, inputs)
    assert [c.name for c in comps] == ["pki + kubeconfigs", "registries", "kube-scheduler", "node vm", "node vm-2",
                                       "node vm-3"]
    assert all(isinstance(c, Files) for c in comps)


def test_generated_files_unique_and_inside_the_cluster_dirs(settings, three, inputs):
    files = cluster.generated_files(settings, three, inputs)
    paths = [f.path for f in files]
    assert len(paths) == len(set(paths))
    assert all(p.startswith((settings.state_dir + "/", settings.kube_etc + "/")) for p in paths)
    # what holds a secret or key is not world-readable
    secret = [f for f in files if "pw" in f.content or "client-key-data" in f.content]
    assert secret and all(f.mode == 0o600 for f in secret)
    assert {f.write for f in files} == {Write.ALWAYS, Write.IF_ABSENT, Write.IF_CHANGED}


def test_nodes_json_and_inventory(settings, three):
    import json

    import yaml
    records = json.loads(envfile.nodes_json(settings, three))
    assert list(records[0]) == ["index", "name", "preset", "sim_root", "ip", "pod_cidr", "containerd_address",
                                "kubelet_dir", "netns", "control_plane"]
    assert [r["control_plane"] for r in records] == [True, False, False]
    inv = yaml.safe_load(envfile.inventory(records, settings.admin_conf))["all"]
    assert list(inv["children"]["kube_control_plane"]["hosts"]) == ["vm"]
    assert inv["children"]["gpu_nodes"]["hosts"]["vm-3"]["metax_gpu_host_root"] == settings.sim_parent + "/vm-3"
    assert inv["vars"]["metax_gpu_kubeconfig"] == settings.admin_conf


def test_cluster_env(settings, three):
    tools = envfile.Tools("/k/bin", "/c/bin", "/h/bin", "/h/plugins", "/r/containers.conf", "/r/registries.conf")
    env = dict(line[len("export "):].split("=", 1) for line in envfile.cluster_env(settings, three, tools).splitlines())
    assert env["METAX_NODES"] == '"vm vm-2 vm-3"'
    assert env["METAX_SIM_PRESET"] == "8xC500"
    assert env["PATH"] == "/k/bin:/h/bin:/c/bin:${PATH}"
    assert env["METAX_CONTAINERD_ADDRESS"] == settings.run_dir + "/nodes/vm/containerd.sock"
