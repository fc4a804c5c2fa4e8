"""gpu_facts through the real `ansible` CLI (module packaging, argument spec, facts)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.sim import generator

ANSIBLE = os.path.join(os.path.dirname(sys.executable), "ansible")
COLLECTIONS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))), ".build", "collections")


def run_module(args, check=False):
    cmd = [ANSIBLE, "localhost", "-m", "metax.gpu.gpu_facts", "-a", args]
    if check:
        cmd.append("--check")
    env = dict(os.environ, ANSIBLE_PYTHON_INTERPRETER=sys.executable, ANSIBLE_COLLECTIONS_PATH=COLLECTIONS,
               ANSIBLE_LOAD_CALLBACK_PLUGINS="true", ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
               ANSIBLE_LOCALHOST_WARNING="false", ANSIBLE_INVENTORY_UNPARSED_WARNING="false")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    try:
        output = json.loads(proc.stdout)
    except ValueError:
        raise AssertionError("ansible printed no JSON: %s %s" % (proc.stdout, proc.stderr))
    result = output["plays"][0]["tasks"][0]["hosts"]["localhost"]
    status = "FAILED" if result.get("failed") else "SUCCESS"
    return proc.returncode, status, result


@pytest.fixture(scope="module")
def node8(tmp_path_factory):
    from ansible_collections.metax.gpu.plugins.module_utils.sim.spec import preset
    return generator.create(str(tmp_path_factory.mktemp("n8")), preset("8xC500"))


def test_reports_8_gpus_two_groups_and_driver(node8):
    rc, status, result = run_module("host_root=%s" % node8.path)
    assert rc == 0 and "SUCCESS" in status
    facts = result["ansible_facts"]["metax_gpu"]
    assert facts["gpu_count"] == 8 and result["changed"] is False
    assert facts["topology"]["link_groups"] == [{"kind": "metaxlink", "gpus": [0, 1, 2, 3]},
                                                {"kind": "metaxlink", "gpus": [4, 5, 6, 7]}]
    assert facts["driver"] == {"loaded": True, "version": "2.14.6", "major": 2, "minor": 14, "patch": 6}


def test_check_mode_and_a_failed_gpu(node8):
    generator.fail_gpu(node8, 2)
    try:
        rc, _status, result = run_module("host_root=%s" % node8.path, check=True)
        assert rc == 0 and result["ansible_facts"]["metax_gpu"]["gpu_count"] == 7
    finally:
        generator.recover_gpu(node8, 2)


def test_missing_root_fails_with_a_clear_message(tmp_path):
    rc, status, result = run_module("host_root=%s" % (tmp_path / "absent"))
    assert rc != 0 and "FAILED" in status
    assert result["msg"] == "host root %s does not exist or is not a directory" % (tmp_path / "absent")
    assert "Traceback" not in json.dumps(result)


def test_unknown_option_is_rejected():
    rc, _status, result = run_module("host_rot=/")
    assert rc != 0 and "Unsupported parameters" in result["msg"]
