# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The scale profile at N = 200 (issue 29's CI smoke test; the full sizes run from `make bench-scale`).

On the running local cluster: kwok (built by scripts/deps.sh) keeps 200 fake
GPU nodes Ready beside the three real ones; they carry the labels,
annotations and capacity our discovery and allocator compute for the three
presets; the real kube-scheduler with gpu-aware in cache mode binds GPU pods
to them only (the taint keeps everything else away); the agents' writer
writes nothing at steady state; everything is deleted at the end.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

pytestmark = pytest.mark.cluster

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TESTS = os.path.join(REPO, "tests")
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

from ansible_collections.metax.gpu.plugins.module_utils.extender.nodeinfo import gpu_state, node_fields  # noqa: E402
from localcluster import fakenodes  # noqa: E402
from localcluster.settings import from_env  # noqa: E402
from scale import scheduling  # noqa: E402
from scale.profile import ScaleProfile  # noqa: E402

N = 200
PODS = 100


@pytest.fixture(scope="module")
def profile(cluster):
    settings = from_env(os.environ)
    prof = ScaleProfile(settings)
    try:
        prof.grow(N, ready_timeout=60)
        yield prof
    finally:
        try:
            scheduling.delete_namespace(prof.client)
        finally:
            prof.down()


def test_fake_nodes_carry_our_agents_output(profile):
    nodes = list(profile.client.list_pages("/api/v1/nodes", fakenodes.SELECTOR))
    assert len(nodes) == N
    presets = {}
    for node in nodes:
        meta, status = node["metadata"], node["status"]
        assert {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"} in node["spec"]["taints"]
        preset = meta["labels"][fakenodes.PRESET_LABEL]
        capacity = int(status["capacity"][fakenodes.RESOURCE])
        assert meta["labels"]["metax-tech.com/gpu.count"] == str(capacity)
        state = gpu_state(node_fields(node))
        assert state.problems == () and state.total == capacity and 0 < state.free <= capacity
        assert len(json.loads(meta["annotations"]["metax-tech.com/gpu.topology.scores"])) == capacity
        presets.setdefault(preset, set()).add(state.free)
    # the three presets, each with idle and partly allocated nodes
    assert {p: len(f) > 1 for p, f in presets.items()} == {"8xC500": True, "4xN100": True, "2xC550-sriov": True}
    assert profile.writer is not None and profile.writer.sync() == 0   # steady state: nothing to write


def test_scheduler_with_gpu_aware_binds_gpu_pods_to_fake_nodes(profile):
    settings = profile.settings
    extender = scheduling.GpuAware(settings)
    try:
        extender.wait_cache(N, timeout=60)
        before = extender.metrics()
        result = scheduling.schedule_pods(profile.client, settings, scheduling.k8s_bin_dir(settings), PODS, extender.port,
                                          timeout=60)
        text = scheduling.diff_text(extender.metrics(), before)
    finally:
        extender.stop()
    assert result.bound == PODS
    filt = scheduling.histogram(text, "gpu_aware_request_duration_seconds", "filter")
    prio = scheduling.histogram(text, "gpu_aware_request_duration_seconds", "prioritize")
    assert filt.count >= PODS and prio.count >= 1    # the scheduler asked gpu-aware for every pod
    pods = profile.client.request("GET", "/api/v1/namespaces/%s/pods" % scheduling.NAMESPACE)["items"]
    assert len(pods) == PODS
    fake = set(fakenodes.names(profile.client))
    assert all(p["spec"]["nodeName"] in fake for p in pods)
    print("N=%d: %d pods bound in %.1f s (%.0f/s); filter mean %.2f ms, prioritize mean %.2f ms" % (
        N, result.bound, result.seconds, result.pods_per_s, filt.mean_ms, prio.mean_ms))
    scheduling.delete_pods(profile.client, timeout=60)


def test_down_deletes_every_fake_node(profile):
    profile.down()
    assert fakenodes.names(profile.client) == [] and profile.kwok.pid() is None
