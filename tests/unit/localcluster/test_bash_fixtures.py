# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The package writes and runs exactly what the bash cluster.sh did, against fixtures captured from it.

fixtures/bash/cluster.json: every configuration file and command line of a
three-node cluster (8xC500, 4xN100, 2xC550-sriov; default settings) that the
bash version started, captured before the bash went (issue 23). Secrets, the
Go-versioned Kubernetes bin dir and the checkout are placeholders
(``@REGISTRY_PASSWORD@``, ``@KUBE_BIN@``, ``@SOURCE@``), passed here as the
inputs they are. fixtures/bash/cluster-json.out: `cluster.sh json` of the
same cluster.
"""

from __future__ import annotations

import json
import os

import pytest

from localcluster import (apiserver, cluster, commands, containerd, controller_manager, envfile, etcd, kube_proxy,
                          kubelet, node, nodes as nodes_mod, registries)
from localcluster.component import Inputs
from localcluster.settings import from_env

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "bash")
PRESETS = ["8xC500", "4xN100", "2xC550-sriov"]


@pytest.fixture(scope="module")
def captured():
    with open(os.path.join(HERE, "cluster.json"), encoding="utf-8") as fh:
        return json.load(fh)


@pytest.fixture(scope="module")
def default():
    settings = from_env({"HOME": "/root"})
    nodes = nodes_mod.plan(PRESETS, "vm")
    tools = envfile.Tools(kube_bin="@KUBE_BIN@", containerd_bin="/root/.cache/metax-gpu/containerd/v2.4.2/bin",
                          helm_bin="/root/.cache/metax-gpu/helm/v3.22.0/bin",
                          helm_plugins="/root/.cache/metax-gpu/helm-diff/v3.9.14/plugins",
                          containers_conf="@SOURCE@/scripts/cluster/containers/containers.conf",
                          containers_registries_conf="@SOURCE@/scripts/cluster/containers/registries.conf")
    return settings, nodes, tools


def _inputs(nodes):
    from localcluster import pki
    certs = {c.name: (b"", b"") for c in pki.plan(nodes)}
    return Inputs(ca_crt=b"", certs=certs, registry_secret="@REGISTRY_SECRET@",
                  registry_auth_secret="@REGISTRY_AUTH_SECRET@", registry_password="@REGISTRY_PASSWORD@",
                  runc="/usr/sbin/runc")


def test_every_captured_file_is_generated_byte_for_byte(captured, default):
    settings, nodes, tools = default
    generated = {f.path: f.content for f in cluster.generated_files(settings, nodes, _inputs(nodes))}
    generated[settings.state_dir + "/cluster.env"] = envfile.cluster_env(settings, nodes, tools)
    generated[settings.state_dir + "/nodes.json"] = envfile.nodes_json(settings, nodes)
    files = captured["files"]
    assert len(files) == 28
    for path, content in sorted(files.items()):
        assert path in generated, "the package no longer writes %s" % path
        assert generated[path] == content, path


def test_containerd_component_writes_the_captured_config(captured, default):
    settings, nodes, tools = default
    for n in nodes:
        comp = containerd.ContainerdComponent(settings, n, "/usr/sbin/runc", "@REGISTRY_PASSWORD@",
                                              tools.containerd_bin, 3)
        (spec,) = comp.files()
        assert spec.content == captured["files"][spec.path]
        assert spec.mode == 0o600


def test_every_captured_command_line(captured, default):
    settings, nodes, tools = default
    specs = [etcd.process(settings), apiserver.process(settings, tools.kube_bin + "/kube-apiserver"),
             controller_manager.process(settings, tools.kube_bin + "/kube-controller-manager"),
             registries.process(registries.plain(settings, "")), registries.process(registries.auth(settings, ""))]
    for n in nodes:
        specs += [node.holder_process(n), containerd.process(settings, n, tools.containerd_bin + "/containerd", 1),
                  kubelet.process(settings, n, tools.kube_bin + "/kubelet", 1),
                  kube_proxy.process(settings, n, tools.kube_bin + "/kube-proxy", 1)]
    argv = captured["argv"]
    assert sorted(s.name for s in specs) == sorted(argv)
    for spec in specs:
        # the wrapper (nsenter, unshare) execs the binary: /proc/PID/cmdline is the binary's own
        assert list(spec.argv) == argv[spec.name], spec.name


def test_json_command_is_the_bash_output(captured, default):
    settings, nodes = default[:2]
    with open(os.path.join(HERE, "cluster-json.out"), encoding="utf-8") as fh:
        want = fh.read()
    env_text = captured["files"][settings.state_dir + "/cluster.env"]
    records = json.loads(captured["files"][settings.state_dir + "/nodes.json"])
    assert commands.render_json(env_text, records) == want
    assert json.loads(want)["nodes"] == json.loads(envfile.nodes_json(settings, nodes))
