"""gpu_facts run in-process (ansible-test unit style) against simulated nodes."""
from __future__ import annotations

import json

import pytest

from ansible_collections.metax.gpu.plugins.modules import gpu_facts
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator

from module_runner import run_module, tree


@pytest.fixture(scope="module")
def node8(tmp_path_factory):
    from ansible_collections.metax.gpu.plugins.module_utils.sim.spec import preset
    return generator.create(str(tmp_path_factory.mktemp("n8")), preset("8xC500"))


def test_reports_8_gpus_two_groups_and_driver(node8):
    failed, result = run_module(gpu_facts, {"host_root": node8.path})
    assert not failed and result["changed"] is False
    facts = result["ansible_facts"]["metax_gpu"]
    assert facts["gpu_count"] == 8
    assert facts["topology"]["link_groups"] == [{"kind": "metaxlink", "gpus": [0, 1, 2, 3]},
                                                {"kind": "metaxlink", "gpus": [4, 5, 6, 7]}]
    assert facts["driver"] == {"loaded": True, "version": "2.14.6", "major": 2, "minor": 14, "patch": 6}


def test_check_mode_result_equals_the_normal_run_and_changes_nothing(node8):
    generator.fail_gpu(node8, 2)
    try:
        before = tree(node8.path)
        failed_check, checked = run_module(gpu_facts, {"host_root": node8.path}, check_mode=True, diff=True)
        assert tree(node8.path) == before
        failed_real, real = run_module(gpu_facts, {"host_root": node8.path}, diff=True)
    finally:
        generator.recover_gpu(node8, 2)
    assert not failed_check and not failed_real
    assert checked["changed"] is False and real["changed"] is False
    assert checked == real
    assert checked["ansible_facts"]["metax_gpu"]["gpu_count"] == 7


def test_without_topology_links_come_from_pci_alone(node8):
    failed, result = run_module(gpu_facts, {"host_root": node8.path, "topology": False})
    assert not failed and result["changed"] is False
    assert result["ansible_facts"]["metax_gpu"]["topology"]["metaxlink_known"] is False


def test_missing_root_fails_with_a_clear_message(tmp_path):
    failed, result = run_module(gpu_facts, {"host_root": str(tmp_path / "absent")})
    assert failed
    assert result["msg"] == "host root %s does not exist or is not a directory" % (tmp_path / "absent")
    assert "Traceback" not in json.dumps(result)


def test_unknown_option_is_rejected():
    failed, result = run_module(gpu_facts, {"host_rot": "/"})
    assert failed and "Unsupported parameters" in result["msg"]


def test_mx_smi_output_not_understood_is_a_warning_not_a_failure(tmp_path):
    from ansible_collections.metax.gpu.plugins.module_utils.sim.spec import preset
    host = generator.create(str(tmp_path / "n"), preset("8xC500"))
    with open(host.join("usr/bin/mx-smi"), "w") as handle:
        handle.write("#!/bin/sh\necho '| GPU | Bus-id |'\necho '| 0   | 0000:03:00.0 |'\necho '| 1 | nonsense |'\n")
    failed, result = run_module(gpu_facts, {"host_root": host.path})
    assert not failed, result
    facts = result["ansible_facts"]["metax_gpu"]
    assert facts["gpu_count"] == 8 and all(g["healthy"] for g in facts["gpus"])
    assert not facts["topology"]["metaxlink_known"]
    unparsed = [w for w in facts["warnings"] if "output not understood" in w]
    assert any("(line 3: '| 1 | nonsense |')" in w for w in unparsed), facts["warnings"]
