"""metax.gpu.scheduler_extender run in-process over a temporary node root (wait=false: no scheduler here)."""
from __future__ import annotations

import os
import sys

import pytest
import yaml

from ansible_collections.metax.gpu.plugins.modules import scheduler_extender

from module_runner import run_module

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scheduler"))
from scheduler_support import EXISTING_CONFIG, EXISTING_CONFIG_PATH, URL, manifest  # noqa: E402

MANIFEST = "/etc/kubernetes/manifests/kube-scheduler.yaml"
CONFIG = "/etc/metax/extender.yaml"


def _tree(root, backups=False):
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        if not backups and "metax-backup" in dirpath:
            continue
        for name in files:
            path = os.path.join(dirpath, name)
            with open(path, encoding="utf-8") as handle:
                out[os.path.relpath(path, root)] = handle.read()
    return out


@pytest.fixture
def node(tmp_path):
    def make(name="1.28"):
        os.makedirs(str(tmp_path / "etc/kubernetes/manifests"))
        (tmp_path / MANIFEST.lstrip("/")).write_text(manifest(name))
        return str(tmp_path)
    return make


def _args(root, **extra):
    args = {"host_root": root, "url": URL, "wait": False}
    args.update(extra)
    return args


def _manifests(root):
    return sorted(os.listdir(os.path.join(root, "etc/kubernetes/manifests")))


@pytest.mark.parametrize("version", ["1.23", "1.25", "1.28", "1.32"])
def test_enable_check_then_real_then_idempotent_then_disable(node, version):
    root = node(version)
    original = _tree(root)
    failed, checked = run_module(scheduler_extender, _args(root), check_mode=True, diff=True)
    assert not failed, checked
    assert checked["changed"] is True and _tree(root) == original     # check mode writes nothing
    failed, real = run_module(scheduler_extender, _args(root), diff=True)
    assert not failed, real
    assert real["changed"] is True and real["diff"] == checked["diff"]
    assert real["api_version"].endswith("v1beta3" if version == "1.23" else "/v1")
    assert _manifests(root) == ["kube-scheduler.yaml"]                 # no temp, no backup beside it
    backup = real["backup"]
    assert backup.startswith(os.path.join(root, "etc/kubernetes/metax-backup/"))
    assert sorted(os.listdir(backup)) == ["extender.yaml.absent", "kube-scheduler.yaml"]
    with open(os.path.join(backup, "kube-scheduler.yaml")) as handle:
        assert handle.read() == original["etc/kubernetes/manifests/kube-scheduler.yaml"]
    config = yaml.safe_load(_tree(root)["etc/metax/extender.yaml"])
    assert config["extenders"][0]["urlPrefix"] == URL and config["extenders"][0]["weight"] == 500
    assert "--config=" + CONFIG in _tree(root)["etc/kubernetes/manifests/kube-scheduler.yaml"]
    failed, again = run_module(scheduler_extender, _args(root))
    assert not failed and again["changed"] is False and "backup" not in again

    failed, off_check = run_module(scheduler_extender, {"host_root": root, "state": "absent", "wait": False},
                                   check_mode=True, diff=True)
    assert not failed and off_check["changed"] is True
    failed, off = run_module(scheduler_extender, {"host_root": root, "state": "absent", "wait": False}, diff=True)
    assert not failed and off["changed"] is True and off["diff"] == off_check["diff"]
    after = _tree(root)
    assert after["etc/kubernetes/manifests/kube-scheduler.yaml"] == original["etc/kubernetes/manifests/kube-scheduler.yaml"]
    assert "etc/metax/extender.yaml" not in after
    failed, off_again = run_module(scheduler_extender, {"host_root": root, "state": "absent", "wait": False})
    assert not failed and off_again["changed"] is False


def test_weight_change_rewrites_the_configuration_only(node):
    root = node()
    run_module(scheduler_extender, _args(root))
    before = _tree(root)
    failed, result = run_module(scheduler_extender, _args(root, weight=7), diff=True)
    assert not failed and result["changed"] is True
    after = _tree(root)
    assert after["etc/kubernetes/manifests/kube-scheduler.yaml"] == before["etc/kubernetes/manifests/kube-scheduler.yaml"]
    assert yaml.safe_load(after["etc/metax/extender.yaml"])["extenders"][0]["weight"] == 7


def test_drift_after_kubeadm_upgrade_is_reported_and_repaired(node):
    root = node()
    run_module(scheduler_extender, _args(root))
    patched = _tree(root)["etc/kubernetes/manifests/kube-scheduler.yaml"]
    # kubeadm upgrade writes a fresh manifest: our --config and mounts are gone
    with open(os.path.join(root, MANIFEST.lstrip("/")), "w") as handle:
        handle.write(manifest("1.28"))
    failed, checked = run_module(scheduler_extender, _args(root), check_mode=True)
    assert not failed and checked["changed"] is True and checked["drift"] is True
    assert "kubeadm upgrade" in checked["msg"] and "puts the patch back" in checked["msg"]
    failed, fixed = run_module(scheduler_extender, _args(root))
    assert not failed and fixed["changed"] is True
    assert _tree(root)["etc/kubernetes/manifests/kube-scheduler.yaml"] == patched
    failed, quiet = run_module(scheduler_extender, _args(root), check_mode=True)
    assert not failed and quiet["changed"] is False and quiet["drift"] is False


def test_existing_config_is_merged_and_put_back(node):
    root = node("1.28-config")
    os.makedirs(os.path.join(root, "etc/kubernetes"), exist_ok=True)
    with open(os.path.join(root, EXISTING_CONFIG_PATH.lstrip("/")), "w") as handle:
        handle.write(EXISTING_CONFIG)
    original = _tree(root)
    failed, on = run_module(scheduler_extender, _args(root))
    assert not failed, on
    assert "--config=" + EXISTING_CONFIG_PATH in on["previous_config"]
    merged = yaml.safe_load(_tree(root)["etc/metax/extender.yaml"])
    assert [e["urlPrefix"] for e in merged["extenders"]] == ["http://storage-extender.kube-system:8888", URL]
    assert merged["profiles"] == yaml.safe_load(EXISTING_CONFIG)["profiles"]
    failed, off = run_module(scheduler_extender, {"host_root": root, "state": "absent", "wait": False})
    assert not failed and off["changed"] is True
    assert _tree(root) == original


@pytest.mark.parametrize("args,message", [
    ({"kubernetes_version": "1.22"}, "needs 1.23 or later"),
    ({"weight": 0}, "weight must be greater than 0"),
    ({"managed_resources": ["gpu"]}, "not an extended resource name"),
    ({"backup_dir": "/etc/kubernetes/manifests/backup"}, "inside the static pod directory"),
    ({"config_path": "/etc/kubernetes/manifests/extender.yaml"}, "must not be in the static pod directory"),
    ({"http_timeout": "five"}, "not a duration"),
])
def test_bad_input_fails_with_nothing_written(node, args, message):
    root = node()
    original = _tree(root)
    failed, result = run_module(scheduler_extender, _args(root, **args))
    assert failed and message in result["msg"], result
    assert _tree(root) == original


def test_malformed_manifest_fails_with_nothing_written(node):
    root = node()
    path = os.path.join(root, MANIFEST.lstrip("/"))
    with open(path, "w") as handle:
        handle.write("apiVersion: v1\nkind: Pod\nspec: [unclosed\n")
    original = _tree(root)
    failed, result = run_module(scheduler_extender, _args(root))
    assert failed and "not valid YAML" in result["msg"]
    assert _tree(root) == original


def test_missing_manifest_and_missing_url(tmp_path):
    failed, result = run_module(scheduler_extender, _args(str(tmp_path)))
    assert failed and "no kube-scheduler manifest" in result["msg"]
    failed, result = run_module(scheduler_extender, {"host_root": str(tmp_path)})
    assert failed and "url" in result["msg"]
