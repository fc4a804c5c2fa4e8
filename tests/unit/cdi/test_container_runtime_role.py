# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The role metax.gpu.container_runtime (module cdi_runtime) with the real ansible-playbook over a node root.

The node root holds a copy of a real node's containerd config after MetaX's
operator rewrote it, and a daemon.json: enabling CDI and reverting it leaves
both byte-identical. The runtime's version is given (no containerd 1.7 or
Docker 25 runs here), and the restart is turned off (no service manager).
"""

from __future__ import annotations

import json
import role_runner

from .test_runtime_config import CRI, node_with, snapshot, tomllib, vendor_text

from ansible_collections.metax.gpu.plugins.module_utils.cdi import runtime_config as rc


def run_role(tmp_path, check=False, **extra):
    return role_runner.run_role(tmp_path, "container_runtime", *(("--check", "--diff") if check else ()), **extra)


def test_containerd_1_7_then_absent_is_byte_identical(tmp_path):
    host = node_with(tmp_path, {rc.CONTAINERD_CONFIG: (vendor_text().encode(), 0o644),
                                rc.DOCKER_DAEMON_JSON: (b'{"log-driver": "journald"}\n', 0o644)})
    before = snapshot(host.path)
    common = {"container_runtime_host_root": host.path, "container_runtime_version": "containerd://1.7.24",
              "container_runtime_restart": False}
    changed, out = run_role(tmp_path, check=True, **common)
    assert changed == 1 and "enable_cdi = true" in out and snapshot(host.path) == before   # check mode: nothing
    changed, _out = run_role(tmp_path, **common)
    assert changed == 1
    dropin = tomllib.loads(open(host.join(rc.CONTAINERD_DROPIN), encoding="utf-8").read())
    assert dropin["plugins"][CRI]["enable_cdi"] is True
    assert dropin["plugins"][CRI]["containerd"]["default_runtime_name"] == "metax"      # copied, not set
    assert run_role(tmp_path, **common)[0] == 0                                         # idempotent
    changed, _out = run_role(tmp_path, container_runtime_state="absent", **common)
    assert changed == 1 and snapshot(host.path) == before
    assert run_role(tmp_path, container_runtime_state="absent", **common)[0] == 0


def test_docker_25_daemon_json_then_absent_is_byte_identical(tmp_path):
    daemon = b'{\n  "log-driver": "journald",\n  "data-root": "/srv/docker"\n}\n'
    host = node_with(tmp_path, {rc.DOCKER_DAEMON_JSON: (daemon, 0o600)})
    before = snapshot(host.path)
    common = {"container_runtime_host_root": host.path, "container_runtime_runtime": "docker",
              "container_runtime_version": "docker://26.1.3"}
    # without live-restore a restart would stop the containers: reported, not done (no handler runs)
    changed, out = run_role(tmp_path, **common)
    assert changed == 1 and "maintenance window" in out
    assert "skipping: [localhost]" in out.split("RUNNING HANDLER")[1]
    assert json.loads(open(host.join(rc.DOCKER_DAEMON_JSON)).read())["features"] == {"cdi": True}
    assert run_role(tmp_path, container_runtime_state="absent", container_runtime_restart=False, **common)[0] == 1
    assert snapshot(host.path) == before


def test_containerd_2_gets_only_the_metax_handler_then_absent_is_byte_identical(tmp_path):
    """containerd 2.x reads CDI by default: only the runtime handler metax of the RuntimeClass metax is added
    (a copy of the built-in runc here, the config defining none); the vendor's config, which has its own
    metax, changes nothing at all."""
    host = node_with(tmp_path, {rc.CONTAINERD_CONFIG: (b"version = 3\n", 0o644)})
    before = snapshot(host.path)
    common = {"container_runtime_host_root": host.path, "container_runtime_version": "containerd://2.4.2",
              "container_runtime_restart": False}
    assert run_role(tmp_path, **common)[0] == 1
    dropin = tomllib.loads(open(host.join(rc.CONTAINERD_DROPIN), encoding="utf-8").read())
    assert dropin == {"version": 3, "plugins": {"io.containerd.cri.v1.runtime": {"containerd": {"runtimes": {
        "metax": {"runtime_type": "io.containerd.runc.v2"}}}}}}
    assert run_role(tmp_path, **common)[0] == 0                                         # idempotent
    assert run_role(tmp_path, container_runtime_state="absent", **common)[0] == 1
    assert snapshot(host.path) == before
    vendor = node_with(tmp_path / "vendor", {rc.CONTAINERD_CONFIG: (vendor_text().encode(), 0o644)})
    untouched = snapshot(vendor.path)
    on_vendor = dict(common)
    on_vendor["container_runtime_host_root"] = vendor.path
    assert run_role(tmp_path, **on_vendor)[0] == 0
    assert snapshot(vendor.path) == untouched
