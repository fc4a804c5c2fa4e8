# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Process specs: command lines, and the restart hash cluster.sh's `start` records (phase 2 adopts by it)."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from localcluster import apiserver, controller_manager, etcd, kube_proxy, node, registries
from localcluster.component import ProcessSpec, start_hash


def _bash_start_hash(spec: ProcessSpec, tmp_path) -> str:
    """The hash block of the bash version's `start` (fixtures/bash/process-functions.sh), run by bash."""
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "bash", "process-functions.sh"),
              encoding="utf-8") as fh:
        block = re.search(r"^  hash=\$\(\{\n.*?\n  \} \| sha256sum \| cut -d' ' -f1\)\n", fh.read(), re.M | re.S)
    assert block, "cluster.sh's start no longer computes its hash this way"
    script = tmp_path / "hash.sh"
    script.write_text('bin=$1\nshift\n%secho "${hash}"\n' % block.group(0))
    env = {"PATH": os.environ["PATH"], "START_WRAP": " ".join(spec.wrap),
           "START_CONFIG": " ".join(spec.config_files)}
    return subprocess.run(["bash", str(script), *spec.argv], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.mark.parametrize("with_config", [False, True])
def test_restart_hash_is_cluster_sh_s(tmp_path, settings, three, with_config):
    conf = tmp_path / "c.yaml"
    conf.write_text("a: 1\n")
    htpasswd = tmp_path / "htpasswd"
    htpasswd.write_text("metax:$2y$...\n")
    spec = kube_proxy.process(settings, three[1], "/k/kube-proxy", 4242)
    if with_config:
        spec = ProcessSpec(spec.name, spec.argv, spec.wrap, (str(conf), str(htpasswd)))
    else:
        spec = ProcessSpec("etcd", etcd.process(settings).argv)
    contents = [open(f, "rb").read() for f in spec.config_files]
    assert start_hash(spec, contents) == _bash_start_hash(spec, tmp_path)
    # a changed config restarts the process
    if with_config:
        assert start_hash(spec, [b"a: 2\n", contents[1]]) != start_hash(spec, contents)


def test_namespace_holder(three):
    spec = node.holder_process(three[2])
    assert spec.argv == ("/usr/bin/sleep", "infinity")
    assert spec.wrap[:2] == ("nsenter", "--net=/run/netns/metax-gpu-vm-3") and "--propagation" in spec.wrap


def test_control_plane_command_lines(settings):
    api = apiserver.process(settings, "/k/kube-apiserver").argv
    assert "--advertise-address=10.250.0.1" in api and "--secure-port=6443" in api
    assert "--authorization-mode=Node,RBAC" in api and "--endpoint-reconciler-type=lease" in api
    assert "--etcd-servers=http://127.0.0.1:2379" in api
    kcm = controller_manager.process(settings, "/k/kcm").argv
    assert "--cluster-signing-key-file=%s/ca.key" % settings.pki in kcm and "--leader-elect=false" in kcm
    e = etcd.process(settings).argv
    assert e[e.index("--data-dir") + 1] == settings.state_dir + "/etcd"
    assert e[e.index("--initial-cluster") + 1] == "metax=http://127.0.0.1:2380"


def test_registry_processes(settings):
    plain = registries.process(registries.plain(settings, "s"))
    auth = registries.process(registries.auth(settings, "s"))
    assert (plain.name, auth.name) == ("registry", "registry-auth")
    assert plain.argv == ("/usr/bin/docker-registry", "serve", settings.state_dir + "/registry/config.yml")
    assert plain.config_files == (settings.state_dir + "/registry/config.yml",)
