"""driver-manager's pure decisions: deployPolicy, the node's OS family, module parameters, node-vfnums."""
from __future__ import annotations

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.driver import policy
from ansible_collections.metax.gpu.plugins.module_utils.driver.policy import NodeDriver, decide
from ansible_collections.metax.gpu.plugins.module_utils.vfnum import config
from ansible_collections.metax.gpu.plugins.module_utils.vfnum.plan import VfnumError

NONE = NodeDriver(None, None, ours=False)
ADMIN = NodeDriver("2.1", "2.1", ours=False)
ADMIN_BUSY = NodeDriver("2.1", "2.1", ours=False, in_use=True)
OURS = NodeDriver("2.2", "2.2", ours=True)
OURS_UNLOADED = NodeDriver(None, "2.2", ours=True)


@pytest.mark.parametrize("pol, node, action, mode, target", [
    # IfNotPresent: install where there is none, the administrator's is left alone, ours kept (loaded)
    ("IfNotPresent", NONE, "converge", "cloud", "2.2"),
    ("IfNotPresent", ADMIN, "none", "native", None),
    ("IfNotPresent", OURS, "keep", "cloud", "2.2"),
    ("IfNotPresent", OURS_UNLOADED, "keep", "cloud", "2.2"),
    # Always: the payload's version everywhere, whoever installed what was there
    ("Always", NONE, "converge", "cloud", "2.2"),
    ("Always", ADMIN, "converge", "cloud", "2.2"),
    ("Always", ADMIN_BUSY, "converge", "cloud", "2.2"),       # the backend refuses it in use
    ("Always", OURS, "keep", "cloud", "2.2"),                 # no reinstall loop of the same version
    # Never: nothing touched, the label still says whose it is
    ("Never", NONE, "none", None, None),
    ("Never", ADMIN, "none", "native", None),
    ("Never", OURS, "none", "cloud", None),
    # PreferCloud: the payload, but an administrator's busy driver stays (a preference, retried)
    ("PreferCloud", NONE, "converge", "cloud", "2.2"),
    ("PreferCloud", ADMIN, "converge", "cloud", "2.2"),
    ("PreferCloud", ADMIN_BUSY, "none", "native", None),
    ("PreferCloud", OURS, "keep", "cloud", "2.2"),
])
def test_deploy_policy(pol, node, action, mode, target):
    decision = decide(pol, node, "2.2")
    assert (decision.action, decision.mode, decision.target) == (action, mode, target)
    assert decision.retry == (pol == "PreferCloud" and node is ADMIN_BUSY)


def test_an_older_payload_is_a_downgrade_for_always_but_ours_stays_for_if_not_present():
    assert decide("Always", OURS, "2.1").action == "converge"
    assert decide("IfNotPresent", OURS, "2.1").action == "keep"


def test_a_policy_needing_the_payload_without_a_version_is_refused_and_never_needs_none():
    with pytest.raises(policy.PolicyError, match="payload.version"):
        decide("IfNotPresent", NONE, None)
    assert decide("Never", ADMIN, None).action == "none"
    with pytest.raises(policy.PolicyError, match="Sometimes"):
        decide("Sometimes", ADMIN, "2.2")


@pytest.mark.parametrize("text, tool, family", [
    ('ID=ubuntu\nID_LIKE=debian\nVERSION_ID="22.04"\n', None, "deb"),
    ('NAME="openEuler"\nID="openEuler"\n', None, "rpm"),
    ('ID="rocky"\nID_LIKE="rhel centos fedora"\n', None, "rpm"),
    ('ID=kylin\n', None, "deb"),
    ('ID=someos\n', None, None),
    ('ID=someos\n', "rpm", "rpm"),          # the tool that installs wins
    ('ID=ubuntu\n', "rpm", "rpm"),
])
def test_os_family_from_os_release(text, tool, family):
    assert policy.os_family(policy.parse_os_release(text), tool) == family
    assert policy.payload_kinds(family) == ((family, "run") if family else ("run",))


def test_module_params_global_then_the_nodes_own():
    cfg = {"module-params": "a=1 b=2", "node-module-params": {"vm-3": "b=3 c=4"}}
    assert policy.module_params(cfg, "vm-3") == ["a=1", "b=3", "c=4"]
    assert policy.module_params(cfg, "vm") == ["a=1", "b=2"]
    assert policy.module_params({}, "vm") == []
    assert policy.load_command(["a=1"]) == ("modprobe", "metax", "a=1")
    with pytest.raises(policy.PolicyError, match="'b' is not key=value"):
        policy.module_params({"module-params": "a=1 b"}, "vm")


def test_node_vfnums_entries():
    doc = {"nodes": {"vm-3": {"vfnum": 4}, "ghost": {"vfnum": 2}}}
    assert config.node_entry(doc, "vm-3") == 4
    assert config.node_entry(doc, "vm") is None
    assert config.node_entry(None, "vm") is None
    assert config.unknown_nodes(doc, ["vm", "vm-2", "vm-3"]) == ["ghost"]
    for bad in ({"nodes": {"vm": {"vfnum": 3}}}, {"nodes": {"vm": {"vfnum": True}}}, {"nodes": {"vm": 4}},
                {"nodes": ["vm"]}, ["vm"]):
        with pytest.raises(VfnumError):
            config.node_entry(bad, "vm")
