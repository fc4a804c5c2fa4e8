# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The payload bounds an administrator sets: module maca, role maca_host, maca-manager (issue 39)."""

from __future__ import annotations

import os
import sys

import pytest
import yaml

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "modules"))
from module_runner import run_module  # noqa: E402

from ansible_collections.metax.gpu.plugins.module_utils import archive as A  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.agents import maca_manager  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.host import HostRoot  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.maca import install as mi  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.maca import layout  # noqa: E402
from ansible_collections.metax.gpu.plugins.modules import maca  # noqa: E402

from .test_maca_install import maca_layers, payload, payload_tree  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..")
IMAGE = "cr.metax-tech.com/library/maca-c500:2.23.0.4-ubuntu18.04-amd64"


def test_the_module_role_and_agent_defaults_are_the_librarys():
    spec = maca.ARGUMENT_SPEC
    documented = yaml.safe_load(maca.DOCUMENTATION)["options"]
    limits = A.limits_from(spec["max_members"]["default"], spec["max_member_size"]["default"],
                           spec["max_total_size"]["default"])
    assert limits == A.DEFAULT_LIMITS
    for option in ("max_members", "max_member_size", "max_total_size"):
        assert documented[option]["default"] == spec[option]["default"]
        assert documented[option]["type"] == spec[option]["type"]
    with open(os.path.join(ROOT, "roles", "maca_host", "defaults", "main.yml")) as handle:
        defaults = yaml.safe_load(handle)
    with open(os.path.join(ROOT, "roles", "maca_host", "meta", "argument_specs.yml")) as handle:
        role_spec = yaml.safe_load(handle)["argument_specs"]["main"]["options"]
    for option in ("max_members", "max_member_size", "max_total_size"):
        assert defaults["maca_host_" + option] == spec[option]["default"] == role_spec["maca_host_" + option]["default"]
    args = maca_manager.build_parser().parse_args(["--payload-dir", "/p", "--image", IMAGE])
    assert maca_manager.limits_of(args) == A.DEFAULT_LIMITS


def test_the_module_refuses_a_payload_above_its_bounds_and_installs_nothing(tmp_path):
    host = HostRoot(str(tmp_path / "node"))
    os.makedirs(host.join("opt"))
    archive = payload(tmp_path / "maca.xz", "2.23.0.4", maca_layers("2.23.0.4"))
    args = {"src": archive, "image": IMAGE, "host_root": host.path}
    failed, result = run_module(maca, dict(args, max_members=10))
    assert failed and "more than 10 members (max_members)" in result["msg"] and archive in result["msg"]
    assert os.listdir(host.join("opt")) == []
    failed, result = run_module(maca, dict(args, max_total_size="1k"))
    assert failed and "max_total_size (1024 bytes)" in result["msg"]
    failed, result = run_module(maca, dict(args, max_member_size="12 parsecs"))
    assert failed and "'12 parsecs' is not a size" in result["msg"]
    failed, result = run_module(maca, dict(args, max_members=0), check_mode=True)
    assert failed and "max_members must be at least 1" in result["msg"]
    assert os.listdir(host.join("opt")) == []
    failed, result = run_module(maca, dict(args, max_members=100, max_total_size="1MiB"))
    assert not failed and result["installed"]
    assert os.readlink(host.join("opt/maca")) == "maca-2.23.0.4"


def test_maca_manager_takes_the_bounds_as_flags(tmp_path):
    args = maca_manager.build_parser().parse_args(["--payload-dir", "/p", "--image", IMAGE, "--max-members", "5",
                                                   "--max-member-size", "1MiB", "--max-total-size", "2G"])
    assert maca_manager.limits_of(args) == A.Limits(max_members=5, max_member_size=1 << 20, max_total_size=2 << 30)
    for flag, value in (("--max-members", "0"), ("--max-member-size", "big"), ("--max-total-size", "-1")):
        with pytest.raises(SystemExit):
            maca_manager.build_parser().parse_args(["--payload-dir", "/p", "--image", IMAGE, flag, value])


def test_a_payload_tree_above_the_bounds_is_refused_and_nothing_is_left(tmp_path):
    host = HostRoot(str(tmp_path / "node"))
    os.makedirs(host.join("/opt"))
    tree = payload_tree(tmp_path, "2.18.0.3")
    with pytest.raises(layout.MacaLayoutError, match="was refused: .*more than 3 members"):
        mi.install(host, None, "2.18.0.3", tree=tree, limits=A.Limits(max_members=3))
    assert os.listdir(host.join("/opt")) == []
    with pytest.raises(layout.MacaLayoutError, match="above max_member_size"):
        mi.install(host, None, "2.18.0.3", tree=tree, limits=A.Limits(max_member_size=4))
    assert os.listdir(host.join("/opt")) == []


def test_a_payload_tree_with_a_symlink_out_and_a_fifo_is_copied_safely(tmp_path):
    host = HostRoot(str(tmp_path / "node"))
    os.makedirs(host.join("/opt"))
    tree = payload_tree(tmp_path, "2.18.0.3")
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "secret").write_bytes(b"host secret")
    os.symlink(str(victim), os.path.join(tree, "escape"))
    os.mkfifo(os.path.join(tree, "pipe"))   # copy2 would block on it forever
    mi.install(host, None, "2.18.0.3", tree=tree)
    installed = host.join("/opt/maca-2.18.0.3")
    assert os.readlink(os.path.join(installed, "escape")) == str(victim)
    assert not os.path.lexists(os.path.join(installed, "pipe"))
    assert os.listdir(str(victim)) == ["secret"]
