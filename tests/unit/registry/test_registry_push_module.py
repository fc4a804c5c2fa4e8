"""registry_push as Ansible runs it: check mode predicts, second run unchanged, no_log, errors."""
from __future__ import annotations

import os
import sys

from registry_fixtures import make_docker_archive, random_layers, skopeo_inspect

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "modules"))
from module_runner import run_module  # noqa: E402

from ansible_collections.metax.gpu.plugins.modules import registry_push  # noqa: E402


def test_module_push_check_mode_and_idempotence(tmp_path, registry):
    src = str(tmp_path / "img.tar")
    make_docker_archive(src, "x/gpu-aware:0.1.0", random_layers(2, 100_000))
    args = {"src": src, "registry": registry.host, "project": "metax", "insecure": True,
            "cache_dir": str(tmp_path / "cache"), "tag": "v1"}
    failed, plan = run_module(registry_push, args, check_mode=True)
    assert not failed and plan["changed"] is True
    assert plan["pushed"][0]["ref"] == registry.host + "/metax/gpu-aware:v1"
    failed, done = run_module(registry_push, args)
    assert not failed and done["changed"] is True
    assert skopeo_inspect(done["artifacts"][0]["ref"])["digest"] == done["artifacts"][0]["digest"]
    failed, plan2 = run_module(registry_push, args, check_mode=True)
    assert plan2["changed"] is False
    failed, again = run_module(registry_push, args)
    assert again["changed"] is False and again["skipped"][0]["digest"] == done["artifacts"][0]["digest"]


def test_module_bad_password_fails_cleanly_and_hides_it(tmp_path, auth_registry):
    src = str(tmp_path / "img.tar")
    make_docker_archive(src, "x/gpu-aware:0.1.0", random_layers(1, 10_000))
    failed, result = run_module(registry_push, {"src": src, "registry": auth_registry.host + "/metax",
                                                "username": auth_registry.username, "password": "s3cr3t-wrong",
                                                "ca_path": auth_registry.ca, "cache_dir": str(tmp_path / "c")})
    assert failed
    assert auth_registry.host in result["msg"] and "username/password" in result["msg"]
    assert "s3cr3t-wrong" not in str(result)
