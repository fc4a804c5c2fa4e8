"""metax.gpu.driver run in-process against simulated nodes with simulated dpkg/rpm/modprobe.

The package tools are the executables sim.pkgtool puts inside the simulated
root (found there exactly as /usr/bin/dpkg on a real node); nothing is
installed on this machine.
"""
from __future__ import annotations

import os

import pytest

from ansible_collections.metax.gpu.plugins.modules import driver
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator, pkgtool

from module_runner import run_module, tree

CACHE = "var/cache/metax-driver"


@pytest.fixture
def node(make_node):
    def _make(kind="deb", preset="1xC500", packages=(("deb", "2.40.1"),)):
        host = make_node(preset)
        pkgtool.install_tools(host.path, kind)
        for pkg_kind, version, *broken in packages:
            pkgtool.make_package(host.join(CACHE), pkg_kind, version, broken=bool(broken))
        return host
    return _make


def _loaded(host):
    return host.read_attribute("sys/module/metax/version", default="") or None


def test_upgrade_check_mode_predicts_and_changes_nothing_then_idempotent(node):
    host = node()
    old = _loaded(host)
    args = {"host_root": host.path, "version": "2.40.1", "src": "/" + CACHE}
    before = tree(host.path)
    failed, predicted = run_module(driver, args, check_mode=True, diff=True)
    assert not failed and predicted["changed"] is True
    assert predicted["plan"]["steps"] == ["unload", "install", "load"]
    assert (predicted["plan"]["from_version"], predicted["plan"]["to_version"]) == (old, "2.40.1")
    assert tree(host.path) == before
    failed, result = run_module(driver, args, diff=True)
    assert not failed, result
    assert result["changed"] is True and result["diff"] == predicted["diff"]
    assert _loaded(host) == "2.40.1" and result["after"]["package_version"] == "2.40.1"
    assert result["verify"]["mxcd"] and result["verify"]["mx_smi"]
    assert generator.load_state(host)["driver_version"] == "2.40.1"
    failed, again = run_module(driver, args)
    assert not failed and again["changed"] is False


def test_rpm_node_installs_the_rpm_and_ignores_the_deb(node):
    host = node(kind="rpm", packages=(("deb", "2.40.1"), ("rpm", "2.40.1"), ("rpm", "2.39.0")))
    failed, result = run_module(driver, {"host_root": host.path, "state": "latest", "src": "/" + CACHE})
    assert not failed, result
    assert result["plan"]["package"]["kind"] == "rpm" and _loaded(host) == "2.40.1"


def test_deb_named_explicitly_on_an_rpm_node_is_refused_unchanged(node):
    host = node(kind="rpm")
    before = tree(host.path)
    failed, result = run_module(driver, {"host_root": host.path, "version": "2.40.1",
                                         "src": "/%s/metax-driver_2.40.1_amd64.deb" % CACHE})
    assert failed and result["changed"] is False and "rpm" in result["msg"]
    assert tree(host.path) == before


def test_vendor_run_install_then_absent(node):
    host = node(packages=(("run", "2.41.0"),))
    args = {"host_root": host.path, "version": "2.41.0", "src": "/" + CACHE}
    failed, result = run_module(driver, args)
    assert not failed, result
    # the deb install the node had is removed first: one driver, one owner
    assert result["plan"]["steps"] == ["unload", "remove", "install", "load"]
    assert result["after"]["package_kind"] == "run" and _loaded(host) == "2.41.0"
    assert run_module(driver, args)[1]["changed"] is False
    failed, gone = run_module(driver, {"host_root": host.path, "state": "absent"})
    assert not failed and gone["changed"] and gone["after"]["version"] is None
    assert not host.exists("dev/mxcd") and not host.exists("var/lib/metax-gpu/driver-run.json")
    assert run_module(driver, {"host_root": host.path, "state": "absent"})[1]["changed"] is False


def test_refuses_while_a_process_holds_a_gpu_open_unless_forced(node):
    host = node()
    fd_dir = host.join("proc/4242/fd")
    os.makedirs(fd_dir)
    os.symlink("/dev/dri/card0", os.path.join(fd_dir, "7"))
    with open(host.join("proc/4242/comm"), "w") as handle:
        handle.write("train.py\n")
    args = {"host_root": host.path, "version": "2.40.1", "src": "/" + CACHE}
    before = tree(host.path)
    failed, result = run_module(driver, args)
    assert failed and "4242 (train.py): /dev/dri/card0" in result["msg"] and result["changed"] is False
    assert tree(host.path) == before
    failed, result = run_module(driver, dict(args, force=True))
    assert not failed and _loaded(host) == "2.40.1"


def test_broken_driver_fails_verification_and_says_why(node):
    host = node(packages=(("deb", "2.40.1", "broken"),))
    failed, result = run_module(driver, {"host_root": host.path, "version": "2.40.1", "src": "/" + CACHE})
    assert failed and result["changed"] is True
    assert "/dev/mxcd missing" in result["msg"] and result["verify"]["mxcd"] is False


def test_the_load_command_is_a_seam(node, tmp_path):
    """A load command given as a path runs as is: here the simulator's CLI loads the driver."""
    host = node()
    log = tmp_path / "loaded"
    script = tmp_path / "load.sh"
    script.write_text("#!/bin/sh\necho \"$@\" > %s\nexec \"$METAX_HOST_ROOT/usr/sbin/modprobe\" metax\n" % log)
    script.chmod(0o755)
    failed, result = run_module(driver, {"host_root": host.path, "version": "2.40.1", "src": "/" + CACHE,
                                         "load_command": [str(script), "metax", "extra=1"]})
    assert not failed, result
    assert log.read_text().strip() == "metax extra=1" and _loaded(host) == "2.40.1"


def test_never_policy_verifies_only(node):
    host = node()
    current = _loaded(host)
    before = tree(host.path)
    failed, result = run_module(driver, {"host_root": host.path, "version": current, "deploy_policy": "Never"})
    assert not failed and result["changed"] is False and result["verify"]["version_ok"]
    assert tree(host.path) == before
    failed, result = run_module(driver, {"host_root": host.path, "version": "9.9", "deploy_policy": "Never"})
    assert failed and "Never" in result["msg"]


def test_always_reinstalls_every_run(node):
    host = node()
    args = {"host_root": host.path, "version": "2.40.1", "src": "/" + CACHE, "deploy_policy": "Always"}
    assert run_module(driver, args)[1]["changed"] is True
    _failed, again = run_module(driver, args)
    assert again["changed"] is True and again["plan"]["reason"].startswith("reinstall")


def test_bad_input_changes_nothing(node):
    host = node()
    before = tree(host.path)
    for args, words in (({"state": "latest", "version": "1.0", "src": "/" + CACHE}, "latest"),
                        ({"version": "2.40.1", "src": "/nowhere"}, "no such file"),
                        ({"version": "7.0", "src": "/" + CACHE}, "no version 7.0")):
        failed, result = run_module(driver, dict(args, host_root=host.path))
        assert failed and words in result["msg"], result
    assert tree(host.path) == before


def test_no_package_tools_and_no_src(make_node):
    host = make_node("1xC500")
    failed, result = run_module(driver, {"host_root": host.path, "version": "9.0"})
    assert failed and "no src" in result["msg"]


def test_simulator_tools_leave_nothing_behind(make_node):
    host = make_node("1xC500")
    before = tree(host.path)
    pkgtool.install_tools(host.path, "rpm")
    pkgtool.remove_tools(host.path)
    after = tree(host.path)
    state_file = host.join(".metax-sim/state.json")
    assert {k for k in after if k != state_file} == {k for k in before if k != state_file}
