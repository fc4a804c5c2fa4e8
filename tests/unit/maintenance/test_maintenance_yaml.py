"""The roles and playbooks call the node-maintenance protocol (metax.gpu.node_maintenance): they spell none of
its keys, nor the node agents' selector, and the roles that take nodes out of service go through the module.

Before issue 40 ten Node merge-patch tasks spelt these keys, and two role files copied them from names.py
(a test pinned each copy); the copies are gone, so is the pinning: this test keeps them from coming back.
"""
from __future__ import annotations

import glob
import os

import pytest
import yaml

from ansible_collections.metax.gpu.plugins.module_utils import names as N
from ansible_collections.metax.gpu.plugins.module_utils.maintenance import KubeMaintenanceApi
from ansible_collections.metax.gpu.plugins.module_utils.maintenance.plan import STATE_KEYS

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..")


def _yaml_files():
    files = glob.glob(os.path.join(ROOT, "roles", "**", "*.yml"), recursive=True)
    files += glob.glob(os.path.join(ROOT, "roles", "**", "*.yaml"), recursive=True)
    files += glob.glob(os.path.join(ROOT, "playbooks", "**", "*.yml"), recursive=True)
    for path in sorted(files):
        rel = os.path.relpath(path, ROOT)
        # meta/argument_specs.yml is documentation (ansible-doc shows it to the administrator)
        if rel.endswith(os.path.join("meta", "argument_specs.yml")):
            continue
        yield rel, path


FILES = list(_yaml_files())


def test_the_scan_sees_the_roles_that_take_nodes_out_of_service():
    rels = {rel for rel, _path in FILES}
    for role_file in (os.path.join("roles", "set_vfnum", "tasks", "main.yml"),
                      os.path.join("roles", "driver_upgrade", "tasks", "batch.yml"),
                      os.path.join("roles", "driver_upgrade", "tasks", "finish.yml"),
                      os.path.join("roles", "driver_upgrade", "tasks", "rollback.yml")):
        assert role_file in rels


def test_the_maintenance_keys_are_every_key_the_protocol_writes():
    written = {N.LABEL_AGENTS_PAUSED, N.ANNOTATION_MAINTENANCE_OWNER, N.ANNOTATION_MAINTENANCE_CORDON,
               N.ANNOTATION_PRE_CORDONED}
    written |= {key for pair in STATE_KEYS.values() for key in pair if key}
    assert set(N.MAINTENANCE_KEYS) == written
    assert all(key.startswith(N.PREFIX) for key in N.MAINTENANCE_KEYS)


@pytest.mark.parametrize("rel, path", FILES, ids=[rel for rel, _path in FILES])
def test_no_role_or_playbook_spells_a_maintenance_key(rel, path):
    with open(path) as handle:
        text = handle.read()
    spelt = [key for key in N.MAINTENANCE_KEYS if key in text]
    assert spelt == [], "%s spells %s: call metax.gpu.node_maintenance instead (docs/maintenance.md)" % (rel, spelt)
    # the agents' pods the pause waits for: the module's selector (names.NODE_AGENT_POD_SELECTOR)
    assert N.NODE_AGENT_POD_SELECTOR.split(" in ")[1] not in text, rel


def _tasks(node):
    if isinstance(node, list):
        for item in node:
            yield from _tasks(item)
    elif isinstance(node, dict):
        if "name" in node:
            yield node
        for key in ("block", "rescue", "always"):
            yield from _tasks(node.get(key))


@pytest.mark.parametrize("role", ["set_vfnum", "driver_upgrade"])
def test_the_roles_patch_no_node_and_cordon_only_through_the_module(role):
    modules = []
    for path in glob.glob(os.path.join(ROOT, "roles", role, "tasks", "*.yml")):
        with open(path) as handle:
            for task in _tasks(yaml.safe_load(handle)):
                modules.extend(key for key in task if "." in key)
                definition = (task.get("kubernetes.core.k8s") or {}).get("definition") or {}
                assert definition.get("kind") != "Node", (path, task["name"])
                assert "kubernetes.core.k8s_drain" not in task, (path, task["name"])
    assert "metax.gpu.node_maintenance" in modules


def test_the_module_waits_for_the_agents_names_py_selects():
    assert KubeMaintenanceApi(object()).agent_selector == N.NODE_AGENT_POD_SELECTOR


def test_the_driver_upgrade_batch_pauses_every_node_then_waits_then_removes_the_agents_labels():
    """batch.yml: one run per node holds, cordons and pauses (no wait, so that every node of the batch is
    paused before the agents are waited for), then a run waits for them, then a run removes gpu-label's
    labels. The removal is not folded into the waiting run: node_maintenance patches before it waits, and
    gpu-label, not gone yet, would put the labels back."""
    with open(os.path.join(ROOT, "roles", "driver_upgrade", "tasks", "batch.yml")) as handle:
        calls = [(task["name"], task["metax.gpu.node_maintenance"]) for task in _tasks(yaml.safe_load(handle))
                 if "metax.gpu.node_maintenance" in task]
    hold, wait, remove = calls[:3]
    assert hold[0] == "Cordon"                 # the name tests/integration/test_driver_upgrade_cluster.py counts
    assert hold[1].get("cordon", True) and hold[1].get("pause_agents", True) and hold[1]["wait_agents"] is False
    assert hold[1]["procedure_state"] == "paused" and not hold[1].get("remove_agent_labels", False)
    for args in (wait[1], remove[1]):
        assert args.get("pause_agents", True) and args.get("wait_agents", True) and args["procedure_state"] == "paused"
    assert not wait[1].get("remove_agent_labels", False) and remove[1]["remove_agent_labels"] is True
    assert all(args["owner"] == N.MAINTENANCE_OWNER_DRIVER_UPGRADE for _name, args in calls)
