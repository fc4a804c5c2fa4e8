# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""A pod's creation to Running through DRA and through the device plugin with gpu-aware (issue 41, Measure).

An opt-in benchmark, not a test of behaviour: it runs only with
``METAX_BENCH_POD_START=1`` (benchmarks/dra_pod_start.py sets it and prints
the table; ``METAX_BENCH_POD_START_PODS``, default 10, pods per path and
size), and is skipped otherwise, so that the suite's time does not grow.
What it measures, and how, is benchmarks/dra_pod_start.py's docstring; the
figures go to tests/output/dra-pod-start.json.

Everything on the cluster is the other modules' (imported, not copied): the
8xC500 node with gpu-device and gpu-dra placed by the chart's affinity and
switched with dra/switch_run.switch (test_dra_switch_cluster.py's
``switching``), gpu-aware with a second kube-scheduler using it as its
extender (test_gpu_aware_scheduler.py's ``Env`` and ``Running``), the claim
templates and the claim's allocation (test_dra_cluster.py). The tests run in
order, one leg each: the device plugin's first half, DRA, the device
plugin's second half, then the figures.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid

import pytest

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(1800)]

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(os.path.dirname(os.path.dirname(HERE)), "benchmarks")
sys.path.insert(0, HERE)
if BENCH not in sys.path:
    sys.path.append(BENCH)     # after tests/: the benchmarks' module names must shadow nothing

import dra_pod_start as B  # noqa: E402
from test_dra_cluster import AGENT, allocated, attr, claim_template, delete_pod  # noqa: E402
from test_dra_switch_cluster import switching  # noqa: E402,F401  pylint: disable=unused-import
from test_gpu_aware_scheduler import Env, Running  # noqa: E402
from test_gpu_device_cluster import GPU, NS, devices_annotation, wait_for  # noqa: E402

from ansible_collections.metax.gpu.plugins.module_utils import names  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.extender.nodeinfo import (  # noqa: E402
    ANNOTATION_SCORES, gpu_state, node_fields)

if not B.enabled():
    pytest.skip("an opt-in benchmark: set %s=1 to run it (benchmarks/dra_pod_start.py does)" % B.OPT_IN,
                allow_module_level=True)

LABEL = {"metax.gpu/bench": "pod-start"}
TEMPLATES = {1: "pod-start-1", 4: "pod-start-4"}     # 1 GPU plain, 4 with the MetaXLink constraint (docs/dra.md)
START_TIMEOUT = 180
# a container that will not start by itself: fail at once instead of waiting for the timeout
STUCK = ("CreateContainerError", "CreateContainerConfigError", "RunContainerError", "ErrImagePull",
         "ImagePullBackOff", "InvalidImageName")
PASSED = 'gpu_aware_filter_nodes_total{result="passed"}'
FILTER_SECONDS = ('gpu_aware_request_duration_seconds_count{verb="filter"}',
                  'gpu_aware_request_duration_seconds_sum{verb="filter"}')


class Bench:
    """The run's samples, legs and switches, written to tests/output/dra-pod-start.json after each leg."""

    def __init__(self, agents, run, kubernetes):
        self.agents = agents
        self.run = run
        self.pods = B.pods_per_size()
        self.halves = B.halves(self.pods)
        self.samples = []
        self.legs = []
        self.switches = []
        self.kubernetes = kubernetes
        self.machine = B.D.machine()

    def result(self):
        return {"machine": self.machine, "kubernetes": self.kubernetes, "node": self.agents.node,
                "preset": self.agents.preset, "pods": self.pods, "plugin_halves": list(self.halves),
                "poll_seconds": B.POLL_SECONDS, "scheduler": self.run.scheduler_name, "extender_node_cache": True,
                "legs": self.legs, "switches": self.switches, "samples": self.samples}

    def write(self, summary=None):
        out = self.result()
        if summary is not None:
            out["summary"] = summary
        os.makedirs(os.path.dirname(B.OUTPUT), exist_ok=True)
        with open(B.OUTPUT, "w", encoding="utf-8") as handle:
            json.dump(out, handle, indent=1)
        return out

    # -- the node's mode -------------------------------------------------------------------------------
    def switch(self, mode):
        self.clear()
        started = time.monotonic()
        self.agents.switch(mode)
        self.agents.served_by(mode, self.agents.gpus())
        if mode == names.DEVICE_MODE_DRA:
            self.agents.wait_ready(AGENT)
        self.switches.append({"to": mode, "seconds": round(time.monotonic() - started, 1)})

    def plugin_idle(self):
        """gpu-device serves every GPU, all free in its annotation, and gpu-aware's node cache has synced."""
        gpus = self.agents.gpus()

        def idle():
            node = raw(self.agents.api.read_node(self.agents.node, _preload_content=False))
            state = gpu_state(node_fields(node))
            allocatable = ((node.get("status") or {}).get("allocatable") or {}).get(GPU)
            return (allocatable == str(gpus) and state.source == "devices" and state.free == gpus
                    and ANNOTATION_SCORES in (node["metadata"].get("annotations") or {})
                    # the sample, not a substring: the metric's HELP line reads "gpu_aware_node_cache_synced 1 once ..."
                    and B.sample_value(self.run.metrics(), "gpu_aware_node_cache_synced") == 1)
        wait_for(idle, 120, "node %s: %d free GPUs in gpu-device's annotation, gpu-aware synced"
                 % (self.agents.node, gpus), interval=0.5)

    def dra_idle(self):
        """gpu-dra publishes every GPU, none tainted, and no ResourceClaim is left in the namespace."""
        gpus = self.agents.gpus()

        def idle():
            devices = self.agents.devices()
            return (len(devices) == gpus and not any(d.get("taints") for d in devices)
                    and not self.claims())
        wait_for(idle, 120, "node %s: %d untainted devices in its pool, no claim left" % (self.agents.node, gpus),
                 interval=0.5)

    def claims(self):
        return self.agents.custom.list_namespaced_custom_object("resource.k8s.io", "v1", NS, "resourceclaims")["items"]

    def clear(self):
        """Pods of an earlier leg that failed half-way: gone, or the switch would find them holding GPUs."""
        self.agents.cluster.kubectl("-n", NS, "delete", "pods", "-l", "%s=%s" % next(iter(LABEL.items())),
                                    "--ignore-not-found", "--wait=true", timeout=180)

    # -- pods --------------------------------------------------------------------------------------------
    def body(self, name, path, gpus):
        """The same pod on both paths but for what it asks: the agent image (on the node already) sleeping."""
        container = {"name": "main", "image": self.agents.images["gpu-device"], "command": ["sleep", "3600"]}
        spec = {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                "nodeSelector": {"kubernetes.io/hostname": self.agents.node}, "tolerations": [{"operator": "Exists"}],
                "containers": [container]}
        if path == B.DRA:
            spec["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": TEMPLATES[gpus]}]
            container["resources"] = {"claims": [{"name": "gpus"}]}
        else:
            spec["schedulerName"] = self.run.scheduler_name
            container["resources"] = {"limits": {GPU: str(gpus)}}
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS, "labels": dict(LABEL)},
                "spec": spec}

    def pod(self, name):
        return raw(self.agents.api.read_namespaced_pod(name, NS, _preload_content=False))

    def diagnose(self, name):
        events = self.agents.api.list_namespaced_event(NS, field_selector="involvedObject.name=" + name).items
        out = ["events of %s: %s" % (name, ["%s: %s" % (e.reason, e.message) for e in events])]
        if name.startswith("dp-"):
            out.append(self.run.log_tail())
        return "\n".join(out)

    def start(self, path, gpus, warmup=False):
        """One pod from creation to Running, timed on both clocks; checked for what its path gave it, deleted,
        and its GPUs free again before the next."""
        name = "%s-%d-%s" % ("dra" if path == B.DRA else "dp", gpus, uuid.uuid4().hex[:6])
        body = self.body(name, path, gpus)
        asked = time.monotonic()
        self.agents.api.create_namespaced_pod(NS, body)
        created = time.monotonic()
        bound = running = None
        while running is None:
            polled = time.monotonic()
            pod = self.pod(name)
            now = time.monotonic()
            status = pod.get("status") or {}
            if bound is None and (pod.get("spec") or {}).get("nodeName"):
                bound = now
            if status.get("phase") == "Running":
                running = now
                break
            waiting = [(c.get("state") or {}).get("waiting") or {} for c in status.get("containerStatuses") or []]
            stuck = [w for w in waiting if w.get("reason") in STUCK]
            assert status.get("phase") not in ("Failed", "Succeeded") and not stuck, (status, self.diagnose(name))
            assert now - created < START_TIMEOUT, "pod %s not Running after %ss\n%s" % (name, START_TIMEOUT,
                                                                                        self.diagnose(name))
            # one GET every POLL_SECONDS from the start of the last (a slow GET is not followed by a burst)
            time.sleep(max(0.0, polled + B.POLL_SECONDS - time.monotonic()))
        pod = self.ready(name)
        sample = {"path": path, "gpus": gpus, "name": name, "warmup": warmup,
                  "create_call_s": round(created - asked, 4), "bound_s": round(bound - created, 3),
                  "running_s": round(running - created, 3), "created": pod["metadata"]["creationTimestamp"]}
        sample.update(B.server_times(pod))
        assert pod["spec"]["nodeName"] == self.agents.node, pod["spec"]
        sample["devices"] = self.dra_devices(name, gpus) if path == B.DRA else self.plugin_devices(gpus)
        delete_pod(self.agents, name)
        if path == B.DRA:
            wait_for(lambda: not self.claims(), 60, "pod %s's ResourceClaim gone" % name, interval=0.2)
        else:
            wait_for(lambda: not any(d["allocated"] for d in devices_annotation(self.agents) or []), 60,
                     "pod %s's GPUs free in gpu-device's annotation" % name, interval=0.2)
        return sample

    def ready(self, name):
        """The pod once its Ready condition is True: it comes with the Running status update or the next one
        (recorded, not part of the figures)."""
        def read():
            pod = self.pod(name)
            return pod if B.server_times(pod)["ready_s"] is not None else None
        return wait_for(read, 30, "pod %s Ready" % name, interval=0.5)

    def dra_devices(self, name, gpus):
        """The devices of the pod's claim: as many as asked, a 4-GPU claim inside one MetaXLink group."""
        got = allocated(self.agents.claim_of(name))
        assert len(got) == gpus, got
        if gpus == 4:
            devices = {d["name"]: d for d in self.agents.devices()}
            assert len({attr(devices[d], "metaxLinkGroup") for d in got}) == 1, got
        return sorted(got)

    def plugin_devices(self, gpus):
        """gpu-device saw the pod take as many GPUs as it asked (pod-resources, then its annotation)."""
        taken = wait_for(lambda: [d["id"] for d in devices_annotation(self.agents) or [] if d["allocated"]] or None,
                         30, "the pod's GPUs allocated in gpu-device's annotation", interval=0.2)
        assert len(taken) == gpus, taken
        return sorted(taken)

    def leg(self, path, pods):
        """A warm-up pod (not counted), then ``pods`` of each size, 1 and 4 GPUs alternating."""
        self.clear()
        if path == B.DRA:
            self.dra_idle()
        else:
            self.plugin_idle()
        started, load, before = time.monotonic(), os.getloadavg()[0], filter_time(self.run)
        self.samples.append(self.start(path, 1, warmup=True))
        for gpus in B.sequence(pods):
            self.samples.append(self.start(path, gpus))
        leg = {"path": path, "pods": pods, "seconds": round(time.monotonic() - started, 1), "load_start": load,
               "load_end": os.getloadavg()[0]}
        if path == B.PLUGIN:
            # the extender's own share of the device plugin's figures (the warm-up's request included)
            after = filter_time(self.run)
            leg.update(filter_requests=int(after[0] - before[0]), filter_seconds=after[1] - before[1])
        self.legs.append(leg)
        self.write()


def raw(response):
    """A ``_preload_content=False`` answer as the API server's JSON: no client model drops a newer field."""
    return json.loads(response.data)


def filter_passes(run):
    """gpu-aware's ``gpu_aware_filter_nodes_total{result="passed"}``: the nodes its filter let through."""
    return B.sample_value(run.metrics(), PASSED)


def filter_time(run):
    """gpu-aware's filter requests and the seconds it spent answering them, so far."""
    text = run.metrics()
    return tuple(B.sample_value(text, series) for series in FILTER_SECONDS)


@pytest.fixture(scope="module")
def extender(cluster, switching, tmp_path_factory):  # noqa: F811  pylint: disable=redefined-outer-name
    """gpu-aware and a second kube-scheduler using it (nodeCacheCapable true), the chart's weights."""
    env = Env(cluster)
    run = None
    try:
        env.core.create_namespace({"metadata": {"name": env.namespace}})
        env.set_weights(1, 1)
        run = Running(env, cluster, str(tmp_path_factory.mktemp("gpu-aware")), node_cache=True)
        yield run
    finally:
        if run is not None:
            run.stop()
        env.cleanup()


@pytest.fixture(scope="module")
def bench(cluster, switching, extender):  # noqa: F811  pylint: disable=redefined-outer-name
    from kubernetes import client
    # the switch tests' sampler reads the Node and the pool 5 times a second: not during the measurement
    switching.sampler.stop.set()
    switching.sampler.thread.join(5)
    switching.apply(claim_template(TEMPLATES[1], 1, constraint=False), claim_template(TEMPLATES[4], 4))
    version = client.VersionApi(switching.api.api_client).get_code().git_version
    yield Bench(switching, extender, version)
    # the pods, templates and claims go with the switching fixture's teardown (everything in NS)


def test_device_plugin_with_gpu_aware_first_half(bench):
    before = filter_passes(bench.run)
    bench.leg(B.PLUGIN, bench.halves[0])
    # every pod went through gpu-aware's filter (one node each: the pod is pinned to it)
    assert filter_passes(bench.run) - before >= 1 + 2 * bench.halves[0], bench.run.metrics()


def test_dra(bench):
    bench.switch(names.DEVICE_MODE_DRA)
    bench.leg(B.DRA, bench.pods)


def test_device_plugin_with_gpu_aware_second_half(bench):
    bench.switch(names.DEVICE_MODE_PLUGIN)
    before = filter_passes(bench.run)
    bench.leg(B.PLUGIN, bench.halves[1])
    assert filter_passes(bench.run) - before >= 1 + 2 * bench.halves[1], bench.run.metrics()


def test_the_figures(bench):
    counted = [s for s in bench.samples if not s["warmup"]]
    for path in B.PATHS:
        for size in B.SIZES:
            mine = [s for s in counted if s["path"] == path and s["gpus"] == size]
            assert len(mine) == bench.pods, (path, size, len(mine), "an earlier leg failed")
            assert all(s["started_s"] is not None and s["scheduled_s"] is not None for s in mine), mine
    summary = B.summarise(bench.samples)
    result = bench.write(summary)
    sys.stdout.write("\n" + "\n".join(B.report(result)) + "\n")
    for size in B.SIZES:
        assert summary["ratios"][str(size)]["running_s_p50"] > 0, summary["ratios"]
