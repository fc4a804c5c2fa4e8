"""driver-config's module parameters never reach modprobe as options, and name parameters the module has
(issue 39, finding 2). The names come from ``modinfo -p metax`` on the node: here the simulator's modinfo,
run through the node's root exactly as driver-manager runs it."""
from __future__ import annotations

import os
import sys

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.agents import driver_manager as dm
from ansible_collections.metax.gpu.plugins.module_utils.driver import backend, policy
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator, pkgtool
from ansible_collections.metax.gpu.plugins.module_utils.sim.spec import preset

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "agents"))


@pytest.mark.parametrize("text", ["--config=/etc/shadow", "-d=/tmp/evil", "-C=/x", "--dirname=/x", "-v",
                                  "a=1 --config=/etc/x"])
def test_an_option_is_refused(text):
    with pytest.raises(policy.PolicyError, match="modprobe option"):
        policy.module_params({"module-params": text}, "n1")


@pytest.mark.parametrize("text,needle", [("a", "not key=value"), ("=1", "not key=value"), ("a=", "not key=value"),
                                         ("1a=2", "parameter name"), ("a.b=1", "parameter name"),
                                         ("a/b=1", "parameter name"), ("a=\x01", "printable"),
                                         ("a=" + "x" * 1025, "printable"), ("x" * 65 + "=1", "parameter name")])
def test_a_word_that_is_not_a_parameter_is_refused(text, needle):
    with pytest.raises(policy.PolicyError, match=needle):
        policy.module_params({"module-params": text}, "n1")


def test_a_nodes_own_parameters_are_checked_too():
    with pytest.raises(policy.PolicyError, match="node-module-params.n1"):
        policy.module_params({"module-params": "a=1", "node-module-params": {"n1": "--config=/x"}}, "n1")


def test_valid_parameters_pass():
    assert policy.module_params({"module-params": "vf_mode=1 dbg=-1 x-y=a,b"}, "n1") == ["vf_mode=1", "dbg=-1",
                                                                                         "x-y=a,b"]


@pytest.mark.parametrize("params", [["--config=/x"], ["-d=/tmp"], ["a"], ["a=b c"]])
def test_load_command_refuses_what_did_not_come_through_module_params(params):
    with pytest.raises(policy.PolicyError):
        policy.load_command(params)


def test_modinfo_output_parsed():
    text = "vf_mode:SR-IOV mode (int)\ndbg:Debug level (int)\nfw-path:firmware (charp)\nnot a line\n"
    assert policy.parse_modinfo_params(text) == frozenset({"vf_mode", "dbg", "fw_path"})


def test_unknown_names_are_refused_and_known_ones_pass():
    known = frozenset({"vf_mode", "dbg"})
    assert policy.check_known(["vf_mode=1", "dbg=2"], known) == ["vf_mode=1", "dbg=2"]
    with pytest.raises(policy.PolicyError, match="no parameter nosuch.*vf_mode"):
        policy.check_known(["vf_mode=1", "nosuch=2"], known)
    assert policy.check_known(["nosuch=2"], None) == ["nosuch=2"]      # no module on disk: nothing to ask


def _node(tmp_path):
    host = generator.create(str(tmp_path / "root"), preset("1xC500"))
    pkgtool.install_tools(host.path, "deb")
    os.makedirs(host.join("etc"), exist_ok=True)
    with open(host.join("etc/os-release"), "w") as handle:
        handle.write("ID=debian\n")
    return host


def test_the_simulators_modinfo_lists_the_modules_parameters_through_the_node_root(tmp_path):
    host = _node(tmp_path)
    cmds = backend.NodeCommands(host)
    rc, out, _err = cmds.run(["modinfo", "-p", "metax"])
    assert rc == 0
    assert policy.parse_modinfo_params(out) == frozenset(name for name, _desc in pkgtool.MODULE_PARAMS)
    rc, _out, err = cmds.run(["modinfo", "-p", "nvidia"])
    assert rc == 1 and "not found" in err


def test_driver_manager_refuses_a_parameter_the_module_does_not_have(tmp_path):
    from test_driver_manager import manager     # the recorded Kube surface of the driver-manager tests

    host = _node(tmp_path)
    mgr, kube = manager(tmp_path, host, data={"module-params": "nosuch=1"})
    assert mgr.round() is False
    reported = " ".join(str(e) for e in kube.events) + " ".join(str(p) for p in kube.patches)
    assert "no parameter nosuch" in reported
    assert not host.exists("sys/module/metax/parameters/nosuch")


def test_driver_manager_reports_an_option_in_driver_config():
    config = dm.parse_config({"module-params": "--config=/etc/shadow"}, "n1")
    assert config.params == [] and "modprobe option" in (config.error or "")
