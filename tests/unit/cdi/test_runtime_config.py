# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Enabling CDI in a node's runtime, and taking it back byte-identically (cdi/runtime_config.py, runtime_state.py).

The containerd config is a real node's after MetaX's own operator rewrote it
(default_runtime_name = "metax"); the TOML is read back with the standard
library's tomllib to check the drop-in changes only the two CDI keys.
"""

from __future__ import annotations

import json
import os
import shutil
import stat

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.cdi import runtime_config as rc
from ansible_collections.metax.gpu.plugins.module_utils.cdi import runtime_state as rs
from ansible_collections.metax.gpu.plugins.module_utils.host import HostRoot

tomllib = pytest.importorskip("tomllib")   # Python 3.11+, the venv's

VENDOR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures",
                      "containerd-config-after-vendor-runtime.toml")
CRI = "io.containerd.grpc.v1.cri"


def vendor_text():
    with open(VENDOR, encoding="utf-8") as handle:
        lines = handle.read().split("\n")
    # the capture's first line is the shell prompt it was taken with, not TOML
    return "\n".join(lines[1:]) if lines[0].startswith("root@") else "\n".join(lines)


def node_with(tmp_path, files):
    root = tmp_path / "node"
    (root / "var" / "lib").mkdir(parents=True)          # every node has it; the state goes below
    for path, (content, mode) in files.items():
        local = root / path.lstrip("/")
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_bytes(content)
        os.chmod(local, mode)
    return HostRoot(str(root))


def snapshot(root):
    """Every file and directory under ``root``: path -> (bytes or 'dir', mode)."""
    out = {}
    for base, dirs, names in os.walk(root):
        for name in dirs:
            path = os.path.join(base, name)
            out[os.path.relpath(path, root)] = ("dir", stat.S_IMODE(os.stat(path).st_mode))
        for name in names:
            path = os.path.join(base, name)
            with open(path, "rb") as handle:
                out[os.path.relpath(path, root)] = (handle.read(), stat.S_IMODE(os.stat(path).st_mode))
    return out


def test_containerd_1_7_gets_a_dropin_with_the_vendor_config_copied_and_cdi_added():
    text = vendor_text()
    plan = rc.plan("containerd://1.7.24", {rc.CONTAINERD_CONFIG: text})
    assert plan.paths == (rc.CONTAINERD_CONFIG, rc.CONTAINERD_DROPIN)
    assert plan.restart == "containerd" and plan.restart_safe
    config, dropin = (tomllib.loads(e.content.decode()) for e in plan.edits)
    original = tomllib.loads(text)
    # the main config: only the import added
    assert config.pop("imports") == [rc.CONTAINERD_DROPIN] and config == original
    # the drop-in: the whole CRI section (containerd 1.x replaces it), plus the two CDI keys
    cri = dropin["plugins"][CRI]
    assert cri.pop("enable_cdi") is True and cri.pop("cdi_spec_dirs") == ["/etc/cdi", "/var/run/cdi"]
    assert cri == original["plugins"][CRI]
    # the vendor's default runtime is copied, never set by us
    assert cri["containerd"]["default_runtime_name"] == "metax"
    assert "default_runtime_name" not in plan.edits[1].content.decode().replace(
        'default_runtime_name = "metax"', "")


@pytest.mark.parametrize("imports, edits_config", [
    ('imports = ["/etc/containerd/conf.d/*.toml"]', False),        # already covered by a glob
    ('imports = ["/etc/containerd/other.toml"]  # site', True),
])
def test_existing_imports_are_kept(imports, edits_config):
    text = "version = 2\n%s\n\n[plugins.\"%s\"]\n  sandbox_image = \"pause:3.9\"\n" % (imports, CRI)
    plan = rc.plan("containerd://1.7.0", {rc.CONTAINERD_CONFIG: text})
    assert (rc.CONTAINERD_CONFIG in plan.paths) is edits_config
    if edits_config:
        config = tomllib.loads(plan.edits[0].content.decode())
        assert config["imports"] == ["/etc/containerd/other.toml", rc.CONTAINERD_DROPIN]
        assert plan.edits[0].content.decode().split("\n")[1].endswith("]  # site")


@pytest.mark.parametrize("version, config, why", [
    ("containerd://2.4.2", None, "by default"),
    ("containerd://2.1.0", "[plugins.'io.containerd.cri.v1.runtime']\n  enable_cdi = false\n", "administrator"),
    ("containerd://1.6.20~ds1", None, "cannot read CDI"),
    ("containerd://1.7.2", "version = 2\n[plugins.\"%s\"]\n  enable_cdi = true\n" % CRI, "already"),
    ("containerd://1.7.2", "[plugins.cri]\n", "version 1"),
    ("cri-o://1.30.0", None, "by default"),
    ("docker://20.10.24", None, "cannot read CDI"),
])
def test_nothing_to_change(version, config, why):
    plan = rc.plan(version, {rc.CONTAINERD_CONFIG: config})
    assert plan.edits == () and plan.restart is None and why in plan.reason


def test_containerd_1_7_without_a_config_gets_one_that_only_imports():
    plan = rc.plan("containerd://1.7.24", {})
    config = tomllib.loads(plan.edits[0].content.decode())
    assert config == {"version": 2, "imports": [rc.CONTAINERD_DROPIN]}
    assert tomllib.loads(plan.edits[1].content.decode())["plugins"][CRI] == {
        "enable_cdi": True, "cdi_spec_dirs": ["/etc/cdi", "/var/run/cdi"]}


@pytest.mark.parametrize("daemon, safe", [
    ('{\n    "log-driver": "journald",\n    "features": {"buildkit": true}\n}\n', False),
    ('{"live-restore": true}', True),
    (None, False),
])
def test_docker_25_gets_features_cdi_restart_safe_only_with_live_restore(daemon, safe):
    plan = rc.plan("docker://26.1.3", {rc.DOCKER_DAEMON_JSON: daemon})
    (edit,) = plan.edits
    data = json.loads(edit.content)
    assert data["features"]["cdi"] is True
    assert {k: v for k, v in data.items() if k != "features"} == {
        k: v for k, v in json.loads(daemon or "{}").items() if k != "features"}
    assert plan.restart == "docker" and plan.restart_safe is safe


def test_docker_odd_files_are_left_alone():
    for text in ("not json", "[1]", '{"features": "x"}', '{"features": {"cdi": true}}'):
        assert rc.plan("docker://27.0.1", {rc.DOCKER_DAEMON_JSON: text}).edits == ()


def test_install_then_uninstall_is_byte_identical_vendor_config_and_daemon_json(tmp_path):
    vendor = vendor_text().encode()
    daemon = b'{\n    "log-driver": "journald",\n    "live-restore": true\n}\n'
    host = node_with(tmp_path, {rc.CONTAINERD_CONFIG: (vendor, 0o600), rc.DOCKER_DAEMON_JSON: (daemon, 0o640)})
    before = snapshot(host.path)
    for version, path in (("containerd://1.7.24", rc.CONTAINERD_CONFIG), ("docker://26.1.3", rc.DOCKER_DAEMON_JSON)):
        texts = {path: open(host.join(path), encoding="utf-8").read()}
        plan = rc.plan(version, texts)
        first = rs.apply(host, plan)
        assert first.changed == list(plan.paths)
        assert rs.apply(host, plan).changed == [] and rs.pending(host, plan) == []     # idempotent
    assert b"enable_cdi = true" in open(host.join(rc.CONTAINERD_DROPIN), "rb").read()
    assert json.load(open(host.join(rc.DOCKER_DAEMON_JSON)))["features"] == {"cdi": True}
    # the modes stay the originals' (a 0600 config does not become world-readable)
    assert stat.S_IMODE(os.stat(host.join(rc.CONTAINERD_CONFIG)).st_mode) == 0o600
    outcome = rs.revert(host)
    assert sorted(outcome.changed) == sorted([rc.CONTAINERD_CONFIG, rc.CONTAINERD_DROPIN, rc.DOCKER_DAEMON_JSON])
    assert outcome.kept == []
    # bytes, modes, and no file or directory left behind (conf.d, the state directory)
    assert snapshot(host.path) == before


def test_a_file_changed_since_is_kept_and_the_rest_reverted(tmp_path):
    host = node_with(tmp_path, {rc.CONTAINERD_CONFIG: (vendor_text().encode(), 0o644)})
    plan = rc.plan("containerd://1.7.24", {rc.CONTAINERD_CONFIG: vendor_text()})
    rs.apply(host, plan)
    edited = open(host.join(rc.CONTAINERD_CONFIG), "rb").read() + b"# the administrator's\n"
    with open(host.join(rc.CONTAINERD_CONFIG), "wb") as handle:
        handle.write(edited)
    outcome = rs.revert(host)
    assert outcome.kept == [rc.CONTAINERD_CONFIG] and outcome.changed == [rc.CONTAINERD_DROPIN]
    assert open(host.join(rc.CONTAINERD_CONFIG), "rb").read() == edited
    assert not os.path.exists(host.join(rc.CONTAINERD_DROPIN))


def test_revert_without_anything_applied_changes_nothing(tmp_path):
    host = node_with(tmp_path, {rc.DOCKER_DAEMON_JSON: (b"{}\n", 0o644)})
    before = snapshot(host.path)
    assert rs.revert(host).changed == [] and snapshot(host.path) == before
    shutil.rmtree(host.path)


@pytest.mark.parametrize("name, output, expected", [
    ("containerd", "containerd github.com/containerd/containerd/v2 v2.4.2 5b6ba6b\n", "containerd://2.4.2"),
    ("containerd", "containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+b1\n",
     "containerd://1.6.20~ds1"),
    ("docker", "20.10.24+dfsg1\n", "docker://20.10.24+dfsg1"),
    ("docker", "Cannot connect to the Docker daemon\n", None),
    ("containerd", "", None),
])
def test_runtime_version_from_the_tools_output(name, output, expected):
    assert rc.runtime_version_of(name, output) == expected
