"""metax.gpu.driver_upgrade on the three-node local cluster (issue 16).

The GPU nodes' roots are simulated: each gets the simulator's package tools
(dpkg on vm and vm-2, rpm on vm-3: a mixed fleet) and driver packages in
/var/cache/metax-driver; everything else is real (API server, kubelet,
scheduler, the chart's agents relabelling the nodes, the eviction API).

Order matters (module-scoped state): --check first, then serial 1 with a
node cordoned beforehand and a GPU pod to evict, then a broken driver on one
node (rollback, state failed, the play stops), then serial 2 back to the
original driver, which also restores the nodes.
"""

from __future__ import annotations

import json
import os
import re
import sys

import pytest

from ansible_collections.metax.gpu.plugins.module_utils import names as N

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import driver_fleet  # noqa: E402
from driver_fleet import KINDS, ROOT  # noqa: E402
from polling import wait_until  # noqa: E402

pytestmark = pytest.mark.cluster

NEW, NEWER = "2.40.1", "2.41.0"
DAY_TWO = driver_fleet.DAY_TWO_LABELS + driver_fleet.DAY_TWO_ANNOTATIONS
TIMINGS = {}
_loaded = driver_fleet.loaded


def _ansible(cluster, name, *extra, check=True):
    proc, secs = driver_fleet.ansible(cluster, name, *extra)
    if check:
        assert proc.returncode == 0, "%s failed:\n%s\n%s" % (name, proc.stdout[-8000:], proc.stderr[-3000:])
    return proc, secs


def _upgrade(cluster, version, *extra, check=True):
    return _ansible(cluster, "driver_upgrade", "-e", "driver_upgrade_version=" + version,
                    "-e", "driver_upgrade_poll_delay=1", *extra, check=check)


def _nodes(cluster):
    return {n["metadata"]["name"]: n for n in cluster.read_nodes() if n["metadata"]["name"] in KINDS}


def _marks(node):
    meta = node["metadata"]
    return {k: v for part in ("labels", "annotations") for k, v in (meta.get(part) or {}).items() if k in DAY_TWO}


def _settled(cluster):
    return driver_fleet.settled(cluster)


@pytest.fixture(scope="module")
def fleet(cluster):
    try:
        prepared = driver_fleet.prepare(cluster, (NEW, NEWER), broken=[("vm-2", NEWER)])
    except driver_fleet.FleetError as exc:
        if "needs the three-node cluster" in str(exc):
            pytest.skip(str(exc))
        raise
    wait_until(lambda: _settled(cluster), 180, "the GPU nodes to be labelled")
    try:
        yield {"original": prepared.original}
    finally:
        cluster.kubectl("delete", "deployment", "upgrade-gpu-job", "-n", "default", "--ignore-not-found",
                        "--wait=true")
        driver_fleet.restore(cluster, prepared)


def _gpu_deployment(cluster, tmp_dir):
    image = cluster.base_image.replace("localhost/", cluster.registry + "/")
    dep = {"apiVersion": "apps/v1", "kind": "Deployment",
           "metadata": {"name": "upgrade-gpu-job", "namespace": "default"},
           "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "upgrade-gpu-job"}},
                    "template": {"metadata": {"labels": {"app": "upgrade-gpu-job"}},
                                 "spec": {"terminationGracePeriodSeconds": 1,
                                          "containers": [{"name": "c", "image": image, "command": ["sleep", "3600"],
                                                          "resources": {"limits": {N.RESOURCE_NAME: "1"}}}]}}}}
    path = os.path.join(str(tmp_dir), "gpu-job.json")
    with open(path, "w") as handle:
        json.dump(dep, handle)
    cluster.kubectl("apply", "-f", path, check=True)


def _gpu_pod(cluster):
    out = cluster.kubectl("get", "pods", "-n", "default", "-l", "app=upgrade-gpu-job", "-o", "json").stdout
    running = [p for p in json.loads(out or '{"items": []}')["items"]
               if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]
    return (running[0]["metadata"]["uid"], running[0]["spec"]["nodeName"]) if len(running) == 1 else None


def test_check_mode_prints_the_plan_and_changes_nothing(cluster, fleet):
    before = {name: (n["metadata"], n["spec"].get("unschedulable")) for name, n in _nodes(cluster).items()}
    loaded = {name: _loaded(name) for name in KINDS}
    proc, _secs = _upgrade(cluster, NEW, "--check")
    assert re.search(r"""["']from["']: ["']%s["']""" % re.escape(fleet["original"]["vm"]), proc.stdout), proc.stdout
    assert re.search(r"""["']to["']: ["']%s["']""" % re.escape(NEW), proc.stdout)
    assert "vm-3" in proc.stdout and ": Cordon]" not in proc.stdout
    after = {name: (n["metadata"], n["spec"].get("unschedulable")) for name, n in _nodes(cluster).items()}
    for name in KINDS:
        assert after[name][1] == before[name][1]
        assert after[name][0].get("labels") == before[name][0].get("labels")
        assert _marks(_nodes(cluster)[name]) == {}
    assert {name: _loaded(name) for name in KINDS} == loaded


def test_a_node_another_procedure_holds_is_refused_before_anything_changes(cluster, fleet):
    """The maintenance protocol (docs/maintenance.md): the plan names the held node and the play stops."""
    cluster.kubectl("annotate", "node", "vm-3", N.ANNOTATION_MAINTENANCE_OWNER + "=" + N.MAINTENANCE_OWNER_HEALTH,
                    check=True)
    try:
        before = {name: (n["metadata"], n["spec"].get("unschedulable")) for name, n in _nodes(cluster).items()}
        proc, _secs = _upgrade(cluster, NEW, check=False)
        assert proc.returncode != 0
        assert "Held for maintenance by another procedure: vm-3 (health)" in proc.stdout, proc.stdout[-4000:]
        assert ": Cordon]" not in proc.stdout
        after = {name: (n["metadata"], n["spec"].get("unschedulable")) for name, n in _nodes(cluster).items()}
        for name in KINDS:
            assert after[name][1] == before[name][1]
            assert after[name][0].get("labels") == before[name][0].get("labels")
    finally:
        cluster.kubectl("annotate", "node", "vm-3", N.ANNOTATION_MAINTENANCE_OWNER + "-", check=True)


def test_serial_1_keeps_the_admins_cordon_and_reschedules_the_gpu_pod(cluster, fleet, tmp_path):
    _gpu_deployment(cluster, tmp_path)
    wait_until(lambda: _gpu_pod(cluster) is not None, 180, "the GPU pod to run")
    uid, _node = _gpu_pod(cluster)
    cluster.kubectl("cordon", "vm-2", check=True)
    proc, secs = _upgrade(cluster, NEW, "-e", "driver_upgrade_serial=1", "-e", "driver_upgrade_max_unavailable=2")
    TIMINGS["serial 1, 3 nodes"] = secs
    nodes = _nodes(cluster)
    assert {name: _loaded(name) for name in KINDS} == {name: NEW for name in KINDS}
    for name, node in nodes.items():
        labels = node["metadata"]["labels"]
        assert [labels[N.LABEL_DRIVER_MAJOR], labels[N.LABEL_DRIVER_MINOR], labels[N.LABEL_DRIVER_PATCH]] \
            == NEW.split("."), name
        assert _marks(node) == {}, name
    assert nodes["vm-2"]["spec"].get("unschedulable") is True          # the admin's cordon stays
    assert not nodes["vm"]["spec"].get("unschedulable") and not nodes["vm-3"]["spec"].get("unschedulable")
    assert proc.stdout.count(": Cordon]") == 3
    wait_until(lambda: _gpu_pod(cluster) is not None and _gpu_pod(cluster)[0] != uid, 180,
               "the evicted GPU pod to be rescheduled")
    cluster.kubectl("uncordon", "vm-2", check=True)


def test_failed_validation_rolls_back_leaves_failed_and_stops(cluster, fleet):
    pod = _gpu_pod(cluster)
    assert pod is not None
    proc, _secs = _upgrade(cluster, NEWER, "-e", "driver_upgrade_serial=1", "-e", "driver_upgrade_max_unavailable=1",
                           "-e", "driver_upgrade_validation_timeout=40", check=False)
    assert proc.returncode != 0
    assert "vm-2" in proc.stdout and "left cordoned in state failed" in proc.stdout
    nodes = _nodes(cluster)
    assert _loaded("vm") == NEWER
    assert _loaded("vm-2") == NEW                                    # rolled back
    assert nodes["vm-2"]["spec"].get("unschedulable") is True
    assert nodes["vm-2"]["metadata"]["labels"][N.LABEL_DRIVER_UPGRADE_STATE] == "failed"
    message = nodes["vm-2"]["metadata"]["annotations"][N.PREFIX + "driver.upgrade.message"]
    assert "rolled back to " + NEW in message
    # released, its agents back, the cordon kept and recorded as the upgrade's (a re-run lifts it)
    annotations = nodes["vm-2"]["metadata"]["annotations"]
    assert N.ANNOTATION_MAINTENANCE_OWNER not in annotations
    assert annotations[N.ANNOTATION_MAINTENANCE_CORDON] == N.MAINTENANCE_CORDON_OURS
    assert N.LABEL_AGENTS_PAUSED not in nodes["vm-2"]["metadata"]["labels"]
    assert _loaded("vm-3") == NEW and not nodes["vm-3"]["spec"].get("unschedulable")   # untouched
    assert _marks(nodes["vm-3"]) == {}
    if pod[1] == "vm-3":
        assert _gpu_pod(cluster) == pod                              # untouched nodes keep their pods
    events = cluster.kubectl("get", "events", "-n", "default", "--field-selector",
                             "involvedObject.name=vm-2,reason=DriverUpgradeFailed", "-o", "name").stdout
    assert events.strip()
    # the administrator fixes the node: clear the state, uncordon
    cluster.kubectl("label", "node", "vm-2", N.LABEL_DRIVER_UPGRADE_STATE + "-", check=True)
    cluster.kubectl("annotate", "node", "vm-2", N.PREFIX + "driver.upgrade.message-", check=True)
    cluster.kubectl("uncordon", "vm-2", check=True)
    wait_until(lambda: _settled(cluster), 120, "vm-2 to validate again on its old driver")


def test_serial_2_back_to_the_original_driver(cluster, fleet):
    original = fleet["original"]
    versions = set(original.values())
    assert len(versions) == 1, original
    proc, secs = _upgrade(cluster, versions.pop(), "-e", "driver_upgrade_serial=2",
                          "-e", "driver_upgrade_max_unavailable=2")
    TIMINGS["serial 2, 3 nodes"] = secs
    assert {name: _loaded(name) for name in KINDS} == original
    nodes = _nodes(cluster)
    assert all(not n["spec"].get("unschedulable") and _marks(n) == {} for n in nodes.values())
    assert proc.stdout.count(": Cordon]") == 2
    # per-run wall time of the whole playbook (3 nodes, simulated package installs take well under 1 s)
    os.makedirs(os.path.join(ROOT, "tests", "output"), exist_ok=True)
    with open(os.path.join(ROOT, "tests", "output", "driver-upgrade-timings.json"), "w") as handle:
        json.dump(TIMINGS, handle, indent=1)
