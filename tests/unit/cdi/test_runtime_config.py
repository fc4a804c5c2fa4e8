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
    ("containerd://1.7.2", "version = 2\n[plugins.\"%s\"]\n  enable_cdi = true\n"
     "[plugins.\"%s\".containerd.runtimes.metax]\n  runtime_type = \"x\"\n" % (CRI, CRI), "already"),
    ("containerd://2.4.2", None, "no runtime handler metax"),
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
    # CDI, and the handler metax with it: a copy of the built-in runc, which the drop-in's CRI
    # section (replacing the built-in one in containerd 1.x) must then carry too
    runc = {"runtime_type": "io.containerd.runc.v2"}
    assert tomllib.loads(plan.edits[1].content.decode())["plugins"][CRI] == {
        "enable_cdi": True, "cdi_spec_dirs": ["/etc/cdi", "/var/run/cdi"],
        "containerd": {"runtimes": {"runc": runc, "metax": runc}}}


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


# --- the runtime handler metax of the RuntimeClass metax (issue 38) ---

RUNTIME_V3 = "io.containerd.cri.v1.runtime"
# containerd 2.x, config version 3 (the layout of the local cluster's nodes and of `containerd config default`)
V3 = '''version = 3
root = "/var/lib/containerd"

[plugins]
  [plugins."io.containerd.cri.v1.images"]
    snapshotter = "overlayfs"

  [plugins."io.containerd.cri.v1.runtime"]
    enable_cdi = true

    [plugins."io.containerd.cri.v1.runtime".containerd]
      default_runtime_name = "runc"

      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes]

        [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
          runtime_type = "io.containerd.runc.v2"
          sandboxer = "podsandbox"

          [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
            BinaryName = "/usr/local/sbin/runc"
            SystemdCgroup = true

  [plugins."io.containerd.grpc.v1.cri"]
    stream_server_address = "127.0.0.1"
'''
# config version 2 as kubeadm guides write it (containerd 1.6/1.7, read by 2.x too), runc the default
V2 = '''version = 2

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "registry.k8s.io/pause:3.9"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = true
'''


def merged_2x(main, dropin):
    """containerd 2.x's merge of an imported file: tables key by key (containerd PR 9982)."""
    out = dict(main)
    for key, value in dropin.items():
        out[key] = merged_2x(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) \
            else value
    return out


def runtimes_of(config, plugin):
    return config["plugins"][plugin]["containerd"]["runtimes"]


@pytest.mark.parametrize("version, text, plugin", [
    ("containerd://2.4.2", V3, RUNTIME_V3),
    ("containerd://2.1.0", V2, CRI),          # a version 2 config on containerd 2.x: its own layout
])
def test_containerd_2_gets_the_handler_alone_in_a_dropin_beside_the_others(version, text, plugin):
    plan = rc.plan(version, {rc.CONTAINERD_CONFIG: text})
    assert plan.paths == (rc.CONTAINERD_CONFIG, rc.CONTAINERD_DROPIN)
    assert plan.restart == "containerd" and plan.restart_safe and plan.restart_for_cdi is False
    assert "runtime handler metax added, a copy of the default runtime runc" in plan.reason
    config, dropin = (tomllib.loads(e.content.decode()) for e in plan.edits)
    original = tomllib.loads(text)
    assert config.pop("imports") == [rc.CONTAINERD_DROPIN] and config == original
    # the drop-in: its version is the main config's (containerd refuses a higher one), only the handler
    assert dropin.pop("version") == original["version"]
    assert dropin == {"plugins": {plugin: {"containerd": {"runtimes": {"metax": runtimes_of(original, plugin)["runc"]}}}}}
    merged = merged_2x(original, dropin)
    runtimes = runtimes_of(merged, plugin)
    assert runtimes["metax"] == runtimes["runc"] and runtimes["runc"] == runtimes_of(original, plugin)["runc"]
    # never the default
    assert merged["plugins"][plugin]["containerd"]["default_runtime_name"] == "runc"
    assert "default_runtime_name" not in plan.edits[1].content.decode()


@pytest.mark.parametrize("version", ["containerd://2.4.2", "containerd://1.6.20", "containerd://1.7.24"])
def test_the_vendors_own_metax_runtime_is_never_touched_nor_duplicated(version):
    """samples/kubernetes: MetaX's runtime defined `metax` and made it the default. It is the node's: the
    RuntimeClass metax runs on it, and no second one is written (1.7 still gets its CDI drop-in)."""
    text = vendor_text()
    plan = rc.plan(version, {rc.CONTAINERD_CONFIG: text})
    assert "its own runtime metax is kept as it is" in plan.reason
    if version != "containerd://1.7.24":
        assert plan.edits == () and plan.restart is None
        return
    dropin_text = plan.edits[1].content.decode()
    dropin = tomllib.loads(dropin_text)
    cri = dropin["plugins"][CRI]
    cri.pop("enable_cdi"), cri.pop("cdi_spec_dirs")
    assert cri == tomllib.loads(text)["plugins"][CRI]      # the vendor's metax copied as it was, once
    assert dropin_text.count('containerd.runtimes.metax]') == 1


@pytest.mark.parametrize("version, cdi", [("containerd://1.7.24", True), ("containerd://1.6.20", False)])
def test_containerd_1_gets_the_handler_in_its_copy_of_the_cri_section(version, cdi):
    plan = rc.plan(version, {rc.CONTAINERD_CONFIG: V2})
    assert plan.paths == (rc.CONTAINERD_CONFIG, rc.CONTAINERD_DROPIN)
    assert plan.restart == "containerd" and plan.restart_for_cdi is cdi
    dropin = tomllib.loads(plan.edits[1].content.decode())
    cri = dropin["plugins"][CRI]
    original = tomllib.loads(V2)["plugins"][CRI]
    assert (cri.pop("enable_cdi", None) is True) is cdi
    cri.pop("cdi_spec_dirs", None)
    runtimes = cri["containerd"]["runtimes"]
    assert runtimes.pop("metax") == original["containerd"]["runtimes"]["runc"]
    assert cri == original        # everything else as it was: the default runtime runc included


def test_a_config_relying_on_the_builtin_runc_gets_it_copied_on_containerd_1_only():
    text = 'version = 2\n\n[plugins."%s"]\n  sandbox_image = "pause:3.9"\n' % CRI
    one = tomllib.loads(rc.plan("containerd://1.6.20", {rc.CONTAINERD_CONFIG: text}).edits[1].content.decode())
    runc = {"runtime_type": "io.containerd.runc.v2"}
    assert one["plugins"][CRI]["containerd"]["runtimes"] == {"runc": runc, "metax": runc}
    assert one["plugins"][CRI]["sandbox_image"] == "pause:3.9"
    two = tomllib.loads(rc.plan("containerd://2.4.2", {rc.CONTAINERD_CONFIG: text}).edits[1].content.decode())
    assert two["plugins"][CRI] == {"containerd": {"runtimes": {"metax": runc}}}


@pytest.mark.parametrize("text, why", [
    ('version = 3\n[plugins."%s".containerd]\n  default_runtime_name = "crun"\n' % RUNTIME_V3, "not defined"),
    ('version = 3\n[plugins."%s".containerd]\n  runtimes.runc.runtime_type = "io.containerd.runc.v2"\n'
     % RUNTIME_V3, "does not copy"),
    ('version = 3\n[plugins."%s".containerd.runtimes]\n  runc = { runtime_type = "io.containerd.runc.v2" }\n'
     % RUNTIME_V3, "does not copy"),
    ('version = 3\n[plugins."%s".containerd.runtimes]\n  metax = { runtime_type = "io.containerd.runc.v2" }\n'
     % RUNTIME_V3, "its own runtime metax"),
    ('[plugins.cri.containerd]\n  default_runtime_name = "runc"\n', "config version 1"),
])
def test_a_handler_that_cannot_be_copied_faithfully_is_reported_not_guessed(text, why):
    plan = rc.plan("containerd://2.4.2", {rc.CONTAINERD_CONFIG: text})
    assert plan.edits == () and why in plan.reason


def test_the_handler_copies_quoted_keys_and_other_default_runtimes():
    text = ('version = 3\n[plugins."%s".containerd]\n  default_runtime_name = "crun"\n'
            '[plugins."%s".containerd.runtimes."crun"]\n  runtime_type = "io.containerd.runc.v2"\n'
            '[plugins."%s".containerd.runtimes."crun".options]\n  BinaryName = "/usr/bin/crun"\n'
            % (RUNTIME_V3, RUNTIME_V3, RUNTIME_V3))
    plan = rc.plan("containerd://2.4.2", {rc.CONTAINERD_CONFIG: text})
    dropin = tomllib.loads(plan.edits[1].content.decode())
    assert runtimes_of(dropin, RUNTIME_V3) == {"metax": runtimes_of(tomllib.loads(text), RUNTIME_V3)["crun"]}


@pytest.mark.parametrize("version, text", [
    ("containerd://2.4.2", V3), ("containerd://2.1.0", V2), ("containerd://1.7.24", V2),
    ("containerd://1.6.20", V2), ("containerd://1.7.24", "vendor"), ("containerd://2.4.2", "vendor"),
])
def test_the_handler_comes_out_byte_identical(tmp_path, version, text):
    content = (vendor_text() if text == "vendor" else text).encode()
    host = node_with(tmp_path, {rc.CONTAINERD_CONFIG: (content, 0o600)})
    before = snapshot(host.path)
    plan = rc.plan(version, {rc.CONTAINERD_CONFIG: content.decode()})
    assert rs.apply(host, plan).changed == list(plan.paths)
    # planned again over what it wrote (a restarted pod, the role run twice): the same files, nothing to do
    again = rc.plan(version, {rc.CONTAINERD_CONFIG: open(host.join(rc.CONTAINERD_CONFIG), encoding="utf-8").read()})
    assert rs.pending(host, again) == [] and rs.apply(host, again).changed == []
    outcome = rs.revert(host)
    assert sorted(outcome.changed) == sorted(plan.paths) and outcome.kept == []
    assert snapshot(host.path) == before


def test_a_metax_runtime_in_an_imported_file_is_the_nodes_too(tmp_path):
    """A drop-in of another tool (conf.d, imported by a glob or by name, relative or absolute) that defines
    metax: ours would merge over it on containerd 2.x, so nothing is written; the files are found by the same
    reading the agent and the module do (runtime_state.config_files)."""
    other = ('[plugins."%s".containerd.runtimes.metax]\n  runtime_type = "io.containerd.runc.v2"\n'
             '[plugins."%s".containerd.runtimes.metax.options]\n  BinaryName = "/opt/vendor/bin/runc"\n'
             % (RUNTIME_V3, RUNTIME_V3))
    for imports in ('imports = ["/etc/containerd/conf.d/*.toml"]', 'imports = ["conf.d/vendor.toml"]'):
        config = V3.replace("version = 3\n", "version = 3\n%s\n" % imports, 1)
        host = node_with(tmp_path / str(len(imports)), {rc.CONTAINERD_CONFIG: (config.encode(), 0o644),
                                                        "/etc/containerd/conf.d/vendor.toml": (other.encode(), 0o644),
                                                        "/etc/containerd/unrelated.toml": (b"x = {", 0o644)})
        files = rs.config_files(host)
        assert files["/etc/containerd/conf.d/vendor.toml"] == other and "/etc/containerd/unrelated.toml" not in files
        plan = rc.plan("containerd://2.4.2", files)
        assert plan.edits == () and "/etc/containerd/conf.d/vendor.toml" in plan.reason, plan.reason
    # without it, the handler is added; our own drop-in is never read as another's
    host = node_with(tmp_path / "ours", {rc.CONTAINERD_CONFIG: (V3.encode(), 0o644)})
    plan = rc.plan("containerd://2.4.2", rs.config_files(host))
    rs.apply(host, plan)
    assert rc.CONTAINERD_DROPIN not in rs.config_files(host)
    assert rs.pending(host, rc.plan("containerd://2.4.2", rs.config_files(host))) == []
    rs.revert(host)
