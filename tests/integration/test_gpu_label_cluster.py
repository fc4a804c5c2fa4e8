# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""gpu-label as a DaemonSet pod on the local cluster, against the real apiserver.

The 11 labels of the manual's Table 2.7 (plus ``gpu.count``) appear on the
node over the 8xC500 simulated root; a wrong value is corrected; labels of
other components -- ``metax-tech.com/`` ones included -- are left alone;
unloading the driver flips ``driver.ready`` and removes the version labels,
loading it brings them back; nothing is written while nothing changes; the
service account can get and patch nodes and nothing more. The agent runs under
the chart's node-agent admission policy, as installed (Agents.start), so every
label write above passes it.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time

import pytest

pytestmark = pytest.mark.cluster

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from test_gpu_device_cluster import NS, SIM_MOUNT, Agents, wait_for  # noqa: E402

from ansible_collections.metax.gpu.plugins.module_utils.gpu.labels import OWNED_LABEL_KEYS  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator  # noqa: E402

P = "metax-tech.com/"
TABLE_2_7 = ["gpu.installed", "driver.ready", "gpu.driver.major", "gpu.driver.minor", "gpu.driver.mode",
             "gpu.driver.patch", "gpu.family", "gpu.memory", "gpu.product", "gpu.sriov", "gpu.vfnum"]
INTERVAL = 2
FOREIGN = {P + "gpu.driver.channel": "beta", "example.com/team": "ml"}


@pytest.fixture(scope="module")
def label_agent(cluster, agent_images):  # noqa: F811
    agents = Agents(cluster, agent_images)
    state = generator.load_state(agents.sim())
    if len(state["gpus"]) != 8 or not state["driver_loaded"] or any(g["failed"] for g in state["gpus"]):
        agents.recreate_sim("8xC500")
    before = dict(agents.node_obj().metadata.labels or {})
    # another component's labels, and one of ours with a wrong value, before the agent starts
    agents.api.patch_node(agents.node, {"metadata": {"labels": dict(FOREIGN, **{P + "gpu.product": "WRONG"})}},
                          _content_type="application/merge-patch+json")
    volumes = {"sim": (agents.sim_parent, SIM_MOUNT)}
    try:
        agents.start("gpu-label", ["--host-root", SIM_MOUNT + "/root", "--interval", str(INTERVAL),
                                   "--log-format", "json"], volumes)
        yield agents
    finally:
        agents.delete("gpu-label")
        restore = {k: before.get(k) for k in list(OWNED_LABEL_KEYS) + list(FOREIGN)}
        agents.api.patch_node(agents.node, {"metadata": {"labels": restore}},
                              _content_type="application/merge-patch+json")
        if not generator.load_state(agents.sim())["driver_loaded"]:
            generator.load_driver(agents.sim())


def labels(agents):
    return dict(agents.node_obj().metadata.labels or {})


def ours(agents):
    return {k[len(P):]: v for k, v in labels(agents).items() if k in OWNED_LABEL_KEYS}


def updates_in_log(agents):
    count = 0
    for line in agents.logs("gpu-label").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("msg", "").startswith("labels updated"):
            count += 1
    return count


def test_labels_appear_and_foreign_labels_stay(label_agent):
    agents = label_agent
    got = wait_for(lambda: ours(agents) if ours(agents).get("gpu.product") == "MXC500" else None, 60,
                   "the Table 2.7 labels")
    assert sorted(k for k in got if k in TABLE_2_7) == sorted(TABLE_2_7)
    assert got == {"gpu.installed": "true", "driver.ready": "true", "gpu.driver.major": "2",
                   "gpu.driver.minor": "14", "gpu.driver.patch": "6", "gpu.driver.mode": "native",
                   "gpu.family": "MXC", "gpu.memory": "64GB", "gpu.product": "MXC500", "gpu.sriov": "forbidden",
                   "gpu.vfnum": "0", "gpu.count": "8"}
    current = labels(agents)
    for key, value in FOREIGN.items():
        assert current[key] == value


def test_nothing_written_when_nothing_changes(label_agent):
    agents = label_agent
    wait_for(lambda: ours(agents).get("gpu.product") == "MXC500", 60, "labels in place")
    first = updates_in_log(agents)
    time.sleep(3 * INTERVAL + 1)
    assert updates_in_log(agents) == first
    assert re.search(r'"labels up to date"|computed', agents.logs("gpu-label"))


def test_driver_unload_and_load(label_agent):
    agents = label_agent
    wait_for(lambda: ours(agents).get("driver.ready") == "true", 60, "driver.ready=true")
    try:
        generator.unload_driver(agents.sim())
        got = wait_for(lambda: ours(agents) if ours(agents).get("driver.ready") == "false" else None,
                       INTERVAL * 3 + 5, "driver.ready=false")
        assert "gpu.driver.major" not in got and "gpu.driver.minor" not in got and "gpu.driver.patch" not in got
        assert got["gpu.installed"] == "true"
    finally:
        generator.load_driver(agents.sim())
    got = wait_for(lambda: ours(agents) if ours(agents).get("driver.ready") == "true" else None,
                   INTERVAL * 3 + 5, "driver.ready=true again")
    assert got["gpu.driver.major"] == "2"
    assert labels(agents)[P + "gpu.driver.channel"] == "beta"


def test_runs_under_the_node_agent_policy(label_agent):
    """The policy names this agent's service account, and none of its writes was refused."""
    agents = label_agent
    policy = [o for o in agents.policy if o["kind"] == "ValidatingAdmissionPolicy"][0]
    assert "system:serviceaccount:%s:gpu-label" % NS in policy["spec"]["matchConditions"][0]["expression"]
    wait_for(lambda: ours(agents).get("gpu.product") == "MXC500", 60, "labels in place")
    log = agents.logs("gpu-label")
    assert "labels updated" in log and "ValidatingAdmissionPolicy" not in log and "HTTP 403" not in log


def test_minimal_rbac(label_agent, cluster):
    sa = "system:serviceaccount:%s:gpu-label" % NS

    def can(*args):
        res = cluster.kubectl("auth", "can-i", *args, "--as", sa)
        return res.stdout.strip() == "yes"
    assert can("get", "nodes/" + label_agent.node) and can("patch", "nodes/" + label_agent.node)
    assert not can("list", "nodes") and not can("delete", "nodes/" + label_agent.node)
    assert not can("update", "nodes/" + label_agent.node) and not can("get", "pods")
