# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""One mode per node on the local cluster (issue 41): a node switched between the device plugin and DRA is
never served by both, a switch waits for the node's GPUs to be free unless it evicts, and a device's health
reaches the pods holding it (KEP-4680).

gpu-device and gpu-dra both run on the 8xC500 node as DaemonSets of the agent image, each with the chart's
own node affinity (rendered from the Extensions chart): gpu-device where ``metax-tech.com/gpu.device-mode``
is not ``dra``, gpu-dra where it is, neither while ``agents.paused`` is set. The switch is
metax.gpu.gpu_device_mode's (dra/switch_run.switch against the real API server). A sampler reads what serves
the node several times a second for the whole module: the device plugin's allocatable ``metax-tech.com/gpu``
and the devices of the node's ResourceSlice pool; no sample may have both.

The fixtures and helpers are test_dra_cluster.py's (imported, not copied).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import pytest

pytestmark = pytest.mark.cluster

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import node_policy  # noqa: E402
from test_dra_cluster import (AGENT, HEALTHY_INTERVAL, PLUGIN_DIR, DraAgents, allocated, attr,  # noqa: E402
                              claim_pod, claim_template, delete_pod, dra_rbac, node_8xc500, running,
                              simulated_root_with_maca)
from test_gpu_device_cluster import ANNOTATIONS, DEVICE_ARGS, NS, SIM_MOUNT, wait_for  # noqa: E402

from ansible_collections.metax.gpu.plugins.module_utils import maintenance, names  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.cdi.spec import claim_device_name, qualified_name  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.dra import switch as S  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.dra import switch_run as R  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.kube.client import core_v1  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator  # noqa: E402

DEVICE = "gpu-device"
SAMPLE_SECONDS = 0.2
CHART_DAEMONSETS = {DEVICE: ("templates/gpu-device.yaml", names.DAEMONSET_GPU_DEVICE),
                    AGENT: ("templates/gpu-dra.yaml", names.DAEMONSET_GPU_DRA)}


class Sampler:
    """What serves the node, read every SAMPLE_SECONDS in a thread: (monotonic time, Serving)."""

    def __init__(self, agents):
        self.agents = agents
        self.samples = []
        self.errors = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, name="sampler", daemon=True)

    def now(self):
        # the Node first, then the pool: reading them in this order cannot make a switch back to the device
        # plugin look like both (its pool is gone before its allocatable comes)
        node = self.agents.api.api_client.sanitize_for_serialization(self.agents.node_obj())
        return S.serving(node, self.agents.slices())

    def run(self):
        while not self.stop.is_set():
            try:
                self.samples.append((time.monotonic(), self.now()))
            except Exception as exc:  # pylint: disable=broad-except  # an API hiccup is not a verdict
                self.errors.append(repr(exc))
            self.stop.wait(SAMPLE_SECONDS)

    def since(self, start):
        return [s for t, s in self.samples if t >= start]

    def both(self):
        return [(round(t, 1), s) for t, s in self.samples if s.both]


class SwitchAgents(DraAgents):
    """gpu-device and gpu-dra on one node, each placed by the chart's affinity."""

    def chart_affinity(self, name):
        template, chart_name = CHART_DAEMONSETS[name]
        rendered = node_policy.render(self.cluster, NS, show_only=template, sets=["dra.enabled=true"])
        (ds,) = [o for o in rendered if o["kind"] == "DaemonSet" and o["metadata"]["name"] == chart_name]
        return ds["spec"]["template"]["spec"]["affinity"]

    def placed(self, name, args, volumes):
        ds = self.daemonset(name, args, volumes)
        pod = ds["spec"]["template"]
        # the chart's pod label too: the switch waits for the pods names.DEVICE_MODE_AGENT_POD_SELECTOR finds
        pod["metadata"]["labels"]["app.kubernetes.io/name"] = CHART_DAEMONSETS[name][1]
        pod["spec"]["affinity"] = self.chart_affinity(name)
        for volume in pod["spec"]["volumes"]:
            volume["hostPath"]["type"] = "DirectoryOrCreate"
        return ds

    def start_both(self):
        self.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}, *dra_rbac(), *self.rbac(DEVICE))
        chart = node_policy.render(self.cluster, NS, sets=["dra.enabled=true"])
        classes = node_policy.render(self.cluster, NS, show_only="templates/gpu-dra.yaml", sets=["dra.enabled=true"])
        node_policy.apply(self.cluster, chart + [o for o in classes if o["kind"] == "DeviceClass"])
        device_volumes = {"device-plugins": ("/var/lib/kubelet/device-plugins", "/var/lib/kubelet/device-plugins"),
                          "pod-resources": ("/var/lib/kubelet/pod-resources", "/var/lib/kubelet/pod-resources"),
                          "sim": (self.sim_parent, SIM_MOUNT)}
        dra_volumes = {"plugin-dir": (PLUGIN_DIR, PLUGIN_DIR),
                       "plugins-registry": ("/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins_registry"),
                       "cdi": (names.CDI_SPEC_DIR, names.CDI_SPEC_DIR), "sim": (self.sim_parent, SIM_MOUNT)}
        dra_args = ["--host-root", SIM_MOUNT + "/root", "--host-prefix", self.sim_root,
                    "--healthy-interval", str(HEALTHY_INTERVAL), "--resync-interval", "5",
                    "--cdi-spec-dir", names.CDI_SPEC_DIR, "--log-format", "json"]
        self.apply(self.placed(DEVICE, DEVICE_ARGS + ["--host-prefix", self.sim_root], device_volumes),
                   self.placed(AGENT, dra_args, dra_volumes))

    def switch_api(self):
        return R.KubeSwitchApi(self.api.api_client, core_v1(self.api.api_client), NS)

    def switch(self, mode, evict=None):
        return R.switch(self.switch_api(), self.node, mode, evict=evict, timeout=300, poll=1)

    def serving(self):
        return S.serving(self.api.api_client.sanitize_for_serialization(self.node_obj()), self.slices())

    def served_by(self, mode, count):
        """Wait until ``mode`` alone serves the node with ``count`` devices: the capacity after a switch."""
        def settled():
            now = self.serving()
            alone = now.dra == 0 if mode == names.DEVICE_MODE_PLUGIN else now.plugin == 0
            have = now.plugin if mode == names.DEVICE_MODE_PLUGIN else now.dra
            return now if alone and have == count else None
        return wait_for(settled, 300, "node %s served by %s with %d devices" % (self.node, mode, count), interval=1)

    def meta(self):
        node = self.node_obj()
        return (dict(node.metadata.labels or {}), dict(node.metadata.annotations or {}),
                bool(node.spec.unschedulable))


@pytest.fixture(scope="module")
def switching(cluster, agent_images):  # noqa: F811
    agents = SwitchAgents(cluster, agent_images, node_8xc500(cluster))
    with simulated_root_with_maca(agents):
        generator.reinstall_mx_smi(agents.sim())
        yield from _both_agents_sampled(agents)


def _both_agents_sampled(agents):
    """Both DaemonSets on the node (the device plugin serving), the sampler running; taken down after."""
    sampler = Sampler(agents)
    try:
        # the device plugin's mode, then both DaemonSets: only gpu-device runs
        agents.api.patch_node(agents.node, {"metadata": {"labels": {names.LABEL_DEVICE_MODE: None}}})
        agents.start_both()
        agents.wait_ready(DEVICE)
        agents.served_by(names.DEVICE_MODE_PLUGIN, agents.gpus())
        agents.apply(claim_template("two", 2))
        sampler.thread.start()
        agents.sampler = sampler
        yield agents
    finally:
        sampler.stop.set()
        sampler.thread.join(5)
        agents.cluster.kubectl("-n", NS, "delete", "pods,resourceclaimtemplates,resourceclaims", "--all",
                               "--ignore-not-found", "--wait=true", timeout=180)
        # a switch that failed half-way leaves the node held by device-mode: release it (ours only)
        try:
            maintenance.resume(agents.switch_api(), agents.node, R.OWNER)
        except maintenance.MaintenanceError:
            pass
        agents.delete(DEVICE)
        agents.remove_annotations(ANNOTATIONS)
        agents.stop_dra()


def test_device_plugin_to_dra_and_back_with_never_both(switching):
    agents, gpus = switching, switching.gpus()
    start = time.monotonic()
    out = agents.switch(names.DEVICE_MODE_DRA)
    assert out.changed and (out.plan.before, out.plan.after) == (names.DEVICE_MODE_PLUGIN, names.DEVICE_MODE_DRA)
    now = agents.served_by(names.DEVICE_MODE_DRA, gpus)
    assert now.dra == gpus and now.plugin == 0
    assert agents.pod_of(DEVICE) is None and agents.wait_ready(AGENT)
    labels, annotations, cordoned = agents.meta()
    assert labels.get(names.LABEL_DEVICE_MODE) == names.DEVICE_MODE_DRA and not cordoned
    assert names.LABEL_AGENTS_PAUSED not in labels and names.ANNOTATION_MAINTENANCE_OWNER not in annotations
    # every device of the pool is a GPU of the node, in its MetaXLink group
    assert sorted(attr(d, "metaxLinkGroup") for d in agents.devices()) == [0, 0, 0, 0, 4, 4, 4, 4]

    back = agents.switch(names.DEVICE_MODE_PLUGIN)
    assert back.changed and back.slices_deleted, back.as_dict()
    now = agents.served_by(names.DEVICE_MODE_PLUGIN, gpus)
    assert now.plugin == gpus and now.dra == 0 and agents.slices() == []
    assert agents.wait_ready(DEVICE) and agents.pod_of(AGENT) is None

    seen = agents.sampler.since(start)
    times = [t for t, _s in agents.sampler.samples if t >= start]
    # sampled all along (a gap would hide a moment: the gaps bound it, not a count, as a quick switch
    # takes fewer samples), and every mode was seen, never both
    assert len(seen) >= 10 and max(b - a for a, b in zip(times, times[1:])) < 3.0, len(seen)
    assert {s.by for s in seen} >= {names.DEVICE_MODE_PLUGIN, names.DEVICE_MODE_DRA}
    assert agents.sampler.both() == [], agents.sampler.both()[:5]


def test_a_switch_is_refused_while_a_pod_holds_a_gpu_and_evict_goes_through(switching):
    agents, gpus = switching, switching.gpus()
    mode_before = agents.meta()[0].get(names.LABEL_DEVICE_MODE)     # unset, or device-plugin after a switch back
    held = claim_pod(agents, extended=1)              # the device plugin's: metax-tech.com/gpu: 1
    claimer = None
    try:
        running(agents, held)
        with pytest.raises(S.SwitchRefused) as refused:
            agents.switch(names.DEVICE_MODE_DRA)
        assert refused.value.holders == ["%s/%s" % (NS, held)] and "evict=true" in str(refused.value)
        labels, annotations, cordoned = agents.meta()
        assert labels.get(names.LABEL_DEVICE_MODE) == mode_before and not cordoned          # nothing changed
        assert names.ANNOTATION_MAINTENANCE_OWNER not in annotations
        assert agents.api.read_namespaced_pod(held, NS).status.phase == "Running"

        out = agents.switch(names.DEVICE_MODE_DRA, evict=maintenance.Eviction(timeout=120))
        assert out.evicted["evicted"] == ["%s/%s" % (NS, held)], out.as_dict()
        wait_for(lambda: not [p for p in agents.api.list_namespaced_pod(NS).items if p.metadata.name == held],
                 120, "the evicted pod gone")
        agents.served_by(names.DEVICE_MODE_DRA, gpus)

        # and a pod holding a DRA claim keeps the node in DRA mode the same way
        claimer = claim_pod(agents, "two")
        running(agents, claimer)
        assert len(allocated(agents.claim_of(claimer))) == 2
        with pytest.raises(S.SwitchRefused) as refused:
            agents.switch(names.DEVICE_MODE_PLUGIN)
        assert refused.value.holders == ["%s/%s" % (NS, claimer)]
        assert agents.meta()[0].get(names.LABEL_DEVICE_MODE) == names.DEVICE_MODE_DRA
        out = agents.switch(names.DEVICE_MODE_PLUGIN, evict=maintenance.Eviction(timeout=120))
        # evicted while gpu-dra still served: the kubelet could unprepare the claim and let the pod go
        assert out.evicted["evicted"] == ["%s/%s" % (NS, claimer)], out.as_dict()
        agents.served_by(names.DEVICE_MODE_PLUGIN, gpus)
        assert agents.sampler.both() == [], agents.sampler.both()[:5]
    finally:
        # a pod left behind would refuse the next test's switch
        for pod in (held, claimer):
            if pod is not None:
                delete_pod(agents, pod)


def _resource_health(agents, pod_name):
    """allocatedResourcesStatus of the pod's container, as the API server has it (the raw JSON: a Python
    client older than the cluster drops fields it does not know)."""
    res = agents.cluster.kubectl("-n", NS, "get", "pod", pod_name, "-o", "json")
    assert res.returncode == 0, res.stderr
    statuses = json.loads(res.stdout)["status"].get("containerStatuses") or []
    return {r["resourceID"]: (r.get("health"), r.get("message", ""))
            for s in statuses for entry in s.get("allocatedResourcesStatus") or []
            if entry.get("name") == "claim:gpus" for r in entry.get("resources") or []}


def test_a_failed_gpus_health_reaches_the_pod_holding_it(switching):
    """KEP-4680 (ResourceHealthStatus, beta and on by default in 1.36; the local cluster passes no feature
    gates): gpu-dra's health stream -> the kubelet -> the pod's status, and back when the GPU recovers."""
    agents = switching
    agents.switch(names.DEVICE_MODE_DRA)
    agents.served_by(names.DEVICE_MODE_DRA, agents.gpus())
    name = claim_pod(agents, "two")
    running(agents, name)
    claim = agents.claim_of(name)
    uid, pair = claim["metadata"]["uid"], allocated(claim)
    ids = {device: qualified_name(claim_device_name(uid, device)) for device in pair}

    def both_healthy():
        now = _resource_health(agents, name)
        return now if set(now) == set(ids.values()) and all(v[0] == "Healthy" for v in now.values()) else None
    healthy = wait_for(both_healthy, 90, "the pod's allocatedResourcesStatus: both devices Healthy", interval=1)
    assert len(healthy) == 2
    victim = pair[0]
    index = attr(next(d for d in agents.devices() if d["name"] == victim), "index")
    generator.fail_gpu(agents.sim(), index, "smi")
    try:
        def unhealthy():
            now = _resource_health(agents, name)
            return now if now.get(ids[victim], ("",))[0] == "Unhealthy" else None
        now = wait_for(unhealthy, HEALTHY_INTERVAL + 60, "the failed GPU Unhealthy in the pod's status", interval=1)
        assert now[ids[pair[1]]][0] == "Healthy", now
        # the message (ResourceHealthStatusMessage, beta in 1.36) is gpu-dra's taint reason
        assert "Unhealthy" in now[ids[victim]][1], now
    finally:
        generator.recover_gpu(agents.sim(), index)
    wait_for(lambda: _resource_health(agents, name).get(ids[victim], ("",))[0] == "Healthy" or None,
             HEALTHY_INTERVAL + 60, "the recovered GPU Healthy again in the pod's status", interval=1)
    delete_pod(agents, name)
    agents.switch(names.DEVICE_MODE_PLUGIN)
    agents.served_by(names.DEVICE_MODE_PLUGIN, agents.gpus())
    assert agents.sampler.both() == [], agents.sampler.both()[:5]
