# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""End to end on the local three-node cluster, the administrator's way (issue 15).

ansible-playbook metax.gpu.site with docs/examples/local-cluster-inventory.yml
(images built and pushed, chart installed, gpu-aware enabled, verify), run as
the Molecule scenario ``default`` action by action (molecule_scenario.py), then:
every node shows its preset's capacity, allocatable and labels; a 2-GPU pod is
placed through the extender and sees its devices; a simulated GPU fault drops
allocatable by one; metax.gpu.uninstall leaves the nodes as they were. The
agents do all this under the chart's node-agent admission policy (issue 30).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from molecule_scenario import molecule
from playbook_output import recap
from playbook_runs import run_concurrently
from polling import wait_until

from ansible_collections.metax.gpu.plugins.filter.gpu_extensions import gpu_node_problems
from ansible_collections.metax.gpu.plugins.module_utils import names as N
from ansible_collections.metax.gpu.plugins.module_utils.host import HostRoot
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
INVENTORY = os.path.join(ROOT, "docs", "examples", "local-cluster-inventory.yml")
SIM_PARENT = "/var/lib/metax-sim"
NAMESPACE = "metax-gpu"           # gpu_extensions_namespace's default, which the example inventory keeps
PRESET_GPUS = {"8xC500": 8, "4xN100": 4}
pytestmark = pytest.mark.cluster


def _playbook_cmd(cluster, name, *extra):
    return [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", INVENTORY,
            "-e", "metax_gpu_kubeconfig=" + cluster.kubeconfig, "metax.gpu." + name] + list(extra)


def _read_only_playbooks(cluster, *runs):
    """(stdout, seconds) of metax.gpu.NAME for each (NAME, *extra) in ``runs``, each asserted to succeed, all
    run at the same time: only for runs that change nothing (check mode), which cannot get in each other's way
    (playbook_runs)."""
    results = run_concurrently([_playbook_cmd(cluster, *run) for run in runs], cluster.env, 1800)
    for run, (proc, _secs) in zip(runs, results):
        assert proc.returncode == 0, "%s failed:\n%s\n%s" % (run[0], proc.stdout[-6000:], proc.stderr[-3000:])
    return [(proc.stdout, secs) for proc, secs in results]


def _nodes(cluster):
    return {n["metadata"]["name"]: n for n in cluster.read_nodes()}


def _ours(node):
    meta = node["metadata"]
    return {k: v for part in ("labels", "annotations") for k, v in (meta.get(part) or {}).items()
            if k.startswith(N.PREFIX)}


@pytest.fixture(scope="module")
def site(cluster):
    before = {name: _ours(node) for name, node in _nodes(cluster).items()}
    out, secs = molecule(cluster, "default", "converge")       # metax.gpu.site
    state = {"before": before, "stdout": out, "seconds": secs, "uninstalled": False}
    yield state
    if state["uninstalled"]:
        return
    # uninstall is a test of its own below; this only makes sure nothing stays when it did not run or failed
    subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", INVENTORY,
                    "-e", "metax_gpu_kubeconfig=" + cluster.kubeconfig, "metax.gpu.uninstall"],
                   capture_output=True, env=cluster.env, timeout=900, check=False)


def test_every_node_shows_its_preset(cluster, site):
    nodes = _nodes(cluster)
    assert len(nodes) >= 3
    for name, node in nodes.items():
        assert gpu_node_problems(node) == [], (name, gpu_node_problems(node))
        labels = node["metadata"]["labels"]
        capacity = int(node["status"]["capacity"][N.RESOURCE_NAME])
        count = int(labels[N.LABEL_GPU_COUNT])
        vfnum = int(labels[N.LABEL_GPU_VFNUM])
        assert capacity == (count * vfnum if vfnum else count)
        preset = (cluster.info.get("METAX_SIM_PRESET_" + name.upper().replace("-", "_")) or "")
        if preset in PRESET_GPUS:
            assert count == PRESET_GPUS[preset]


def test_the_agents_work_under_the_node_agent_policy(cluster, site):
    """The chart installed its admission policy (a 1.30+ cluster), and the agents' writes above passed it."""
    name = NAMESPACE + "-node-agents"
    policy = json.loads(cluster.kubectl("get", "validatingadmissionpolicy", name, "-o", "json", check=True).stdout)
    binding = json.loads(cluster.kubectl("get", "validatingadmissionpolicybinding", name, "-o", "json",
                                         check=True).stdout)
    assert binding["spec"]["policyName"] == name and binding["spec"]["validationActions"] == ["Deny"]
    assert not (policy.get("status", {}).get("typeChecking") or {}).get("expressionWarnings"), policy.get("status")
    # the service accounts keep the agents' names; the pods carry their DaemonSets' (metax-gpu-device, ...)
    for agent, workload in (("gpu-device", N.DAEMONSET_GPU_DEVICE), ("gpu-label", N.DAEMONSET_GPU_LABEL)):
        assert "system:serviceaccount:%s:%s" % (NAMESPACE, agent) in policy["spec"]["matchConditions"][0]["expression"]
        logs = cluster.kubectl("-n", NAMESPACE, "logs", "-l", "app.kubernetes.io/name=" + workload, "--tail=-1",
                               "--prefix", check=True).stdout
        assert "ValidatingAdmissionPolicy" not in logs, logs[-3000:]


def test_second_site_run_changes_nothing_and_verify_passes(cluster, site):
    molecule(cluster, "default", "idempotence")   # molecule fails it on any changed task
    molecule(cluster, "default", "verify")                     # metax.gpu.verify


def _release_state(cluster):
    """What a real (not check-mode) run would change: helm's release revisions and the workloads' generations."""
    revisions = cluster.kubectl("-n", NAMESPACE, "get", "secrets", "-l", "owner=helm", "-o", "name", check=True).stdout
    workloads = json.loads(cluster.kubectl("-n", NAMESPACE, "get", "daemonsets,deployments", "-o", "json",
                                           check=True).stdout)["items"]
    return sorted(revisions.split()), {w["metadata"]["name"]: w["metadata"]["generation"] for w in workloads}


def test_check_diff_on_the_installed_cluster(cluster, site):
    """The administrator's dry run before a change: nothing to do, then exactly the change asked for, shown."""
    before = _release_state(cluster)
    # both dry runs at once (check mode writes nothing: agent_images builds, bundles and push_artifacts pushes
    # nothing, the rest is reads and server-side dry runs); they cost about the longer one instead of both
    (unchanged, _secs), (changed, _secs) = _read_only_playbooks(
        cluster, ("site", "--check", "--diff"),
        ("site", "--check", "--diff", "-e", "gpu_extensions_gpu_device_healthy_interval=7"))
    counts = recap(unchanged)
    assert counts and all(c["changed"] == 0 for c in counts.values()), counts

    counts = recap(changed)
    assert counts["localhost"]["changed"] == 1 and all(c["changed"] == 0 for host, c in counts.items()
                                                       if host != "localhost"), counts
    diff = [(line.lstrip()[0], re.search(r"--healthy-interval=\S+", line).group()) for line in changed.splitlines()
            if line.lstrip().startswith(("+", "-")) and "--healthy-interval=" in line]
    assert diff == [("-", "--healthy-interval=5"), ("+", "--healthy-interval=7")], diff   # the chart's default
    assert _release_state(cluster) == before


def test_two_gpu_pod_goes_through_the_extender(cluster, site):
    def metric_total():
        raw = cluster.kubectl("get", "--raw",
                              "/api/v1/namespaces/%s/services/gpu-aware:8080/proxy/metrics" % N.NAMESPACE)
        assert raw.returncode == 0, raw.stderr
        return sum(float(line.rsplit(" ", 1)[1]) for line in raw.stdout.splitlines()
                   if line.startswith("gpu_aware_filter_nodes_total"))

    before = metric_total()
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "e2e-two-gpus", "namespace": "default"},
           "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "c", "image": cluster.base_image.replace("localhost/", cluster.registry + "/"),
                                    "command": ["sleep", "600"],
                                    "resources": {"limits": {N.RESOURCE_NAME: "2"}}}]}}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(pod), check=True)
    try:
        wait_until(lambda: cluster.kubectl("get", "pod", "e2e-two-gpus", "-o", "jsonpath={.status.phase}").stdout
                   == "Running", 180, "the 2-GPU pod to run")
        assert metric_total() > before
        node_name = cluster.kubectl("get", "pod", "e2e-two-gpus", "-o", "jsonpath={.spec.nodeName}").stdout
        node = _nodes(cluster)[node_name]
        devices = json.loads(node["metadata"]["annotations"][N.ANNOTATION_DEVICES])

        def allocated():
            annotations = _nodes(cluster)[node_name]["metadata"]["annotations"]
            return sum(1 for d in json.loads(annotations[N.ANNOTATION_DEVICES]) if d["allocated"])

        wait_until(lambda: allocated() == 2, 60, "gpu-device to report the allocation")
        listing = cluster.kubectl("exec", "e2e-two-gpus", "--", "sh", "-c", "ls /dev/dri | grep -c renderD").stdout
        assert listing.strip() == "2", (listing, devices)
    finally:
        cluster.kubectl("delete", "pod", "e2e-two-gpus", "--wait=true", "--ignore-not-found")


def test_gpu_fault_drops_allocatable_by_one(cluster, site):
    nodes = _nodes(cluster)
    name = sorted(nodes)[0]
    host = HostRoot(os.path.join(SIM_PARENT, name))
    before = int(nodes[name]["status"]["allocatable"][N.RESOURCE_NAME])
    generator.fail_gpu(host, 0, "smi")
    try:
        wait_until(lambda: int(_nodes(cluster)[name]["status"]["allocatable"][N.RESOURCE_NAME]) == before - 1,
                   120, "allocatable of %s to drop to %d" % (name, before - 1))
    finally:
        generator.recover_gpu(host, 0)
    wait_until(lambda: int(_nodes(cluster)[name]["status"]["allocatable"][N.RESOURCE_NAME]) == before,
               120, "allocatable of %s to come back" % name)


def test_the_operator_scheme_is_refused_here(cluster, site):
    """Installing the operator where this scheme is installed is refused, naming the way out, with nothing
    changed: checked on this module's install (a second Extensions install only for it cost a minute of CI)."""
    crd = N.OPERATOR_PLURAL + "." + N.OPERATOR_GROUP
    # what is there before, not what an earlier module may have left (the ClusterOperator CRD outlives
    # the operator modules' installs): the refusal changes none of it
    before = (_release_state(cluster), cluster.kubectl("get", "namespace", N.OPERATOR_NAMESPACE).returncode,
              cluster.kubectl("get", "crd", crd).returncode)
    # both at once: each is refused by metax.gpu.scheme_check (helm list and reads only) before any change, in
    # install's first role and in site's first play, whose failure ends the playbook
    names = ("install", "site")
    cmds = [[os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", INVENTORY,
             "-e", "metax_gpu_kubeconfig=" + cluster.kubeconfig, "-e", "metax_gpu_scheme=operator",
             "metax.gpu." + name] for name in names]
    for proc, _secs in run_concurrently(cmds, cluster.env, 900):
        assert proc.returncode != 0, proc.stdout[-3000:]
        assert "Refusing to install the GPU Operator scheme: the GPU Extensions scheme is installed" in proc.stdout
        assert "metax.gpu.uninstall" in proc.stdout
        assert all(c["changed"] == 0 for c in recap(proc.stdout).values()), recap(proc.stdout)
    assert (_release_state(cluster), cluster.kubectl("get", "namespace", N.OPERATOR_NAMESPACE).returncode,
            cluster.kubectl("get", "crd", crd).returncode) == before


def test_uninstall_leaves_the_nodes_as_before(cluster, site):
    molecule(cluster, "default", "cleanup")                    # metax.gpu.uninstall + nothing of ours left
    site["uninstalled"] = True
    after = {name: _ours(node) for name, node in _nodes(cluster).items()}
    assert after == site["before"]
    assert cluster.kubectl("get", "namespace", N.NAMESPACE).returncode != 0
