# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Node annotations: values from the allocator, refresh from the pod-resources API, retries."""

from __future__ import annotations

import json
import threading
import time
import urllib.request

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.deviceplugin import constants as C
from ansible_collections.metax.gpu.plugins.module_utils.names import RESOURCE_NAME
from ansible_collections.metax.gpu.plugins.module_utils.deviceplugin.annotations import (
    AnnotationPublisher, merge_patch, node_annotations,
)
from ansible_collections.metax.gpu.plugins.module_utils.deviceplugin.devices import DeviceState
from ansible_collections.metax.gpu.plugins.module_utils.deviceplugin.metrics import DevicePluginMetrics
from ansible_collections.metax.gpu.plugins.module_utils.kubelet.metrics import MetricsServer
from ansible_collections.metax.gpu.plugins.module_utils.kubelet.podresources import (
    PodResourcesClient, PodResourcesError,
)
from ansible_collections.metax.gpu.plugins.module_utils.gpu.allocator import MAX_LOSS, bounded_loss, per_count_tables
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator

BDFS = ["0000:03:00.0", "0000:04:00.0", "0000:05:00.0", "0000:06:00.0",
        "0000:43:00.0", "0000:44:00.0", "0000:45:00.0", "0000:46:00.0"]


def test_tables_and_devices(make_node):
    host = make_node("8xC500")
    state = DeviceState(host)
    state.refresh()
    snap = state.snapshot()
    out = node_annotations(snap, frozenset(BDFS[:2]))
    scores, losses = per_count_tables(snap.inventory.topology, range(2, 8))
    published_scores = json.loads(out[C.ANNOTATION_SCORES])
    published_losses = json.loads(out[C.ANNOTATION_LOSSES])
    assert sorted(published_scores, key=int) == [str(n) for n in range(1, 9)]
    assert {n: published_scores[str(n)] for n in scores} == scores
    assert {n: published_losses[str(n)] for n in losses} == {n: bounded_loss(v) for n, v in losses.items()}
    assert [published_scores[k] for k in ("7", "8")] == [0, 0]
    assert [published_losses[k] for k in ("7", "8")] == [MAX_LOSS, MAX_LOSS]
    devices = json.loads(out[C.ANNOTATION_DEVICES])
    assert [d["id"] for d in devices] == BDFS
    assert devices[0] == {"id": BDFS[0], "index": 0, "bdf": BDFS[0], "uuid": devices[0]["uuid"], "gpu": 0,
                          "vf": False, "numa": 0, "link_group": 0, "link_kind": "metaxlink",
                          "health": "Healthy", "allocated": True}
    assert devices[0]["uuid"].startswith("GPU-")
    assert [d["link_group"] for d in devices] == [0] * 4 + [1] * 4
    assert [d["allocated"] for d in devices] == [True, True] + [False] * 6
    # a failed GPU: unhealthy, not free, listed last without an index
    generator.fail_gpu(host, 7, "bus")
    state.refresh()
    out = node_annotations(state.snapshot(), frozenset())
    devices = json.loads(out[C.ANNOTATION_DEVICES])
    assert devices[-1]["id"] == BDFS[7] and devices[-1]["index"] is None and devices[-1]["health"] == "Unhealthy"
    # capacity counts the failed GPU; size 8 cannot be served and is worst
    assert sorted(json.loads(out[C.ANNOTATION_SCORES]), key=int)[-1] == "8"
    assert json.loads(out[C.ANNOTATION_LOSSES])["8"] == MAX_LOSS


def test_full_node_publishes_worst_values_not_empty_tables(make_node):
    state = DeviceState(make_node("1xC500"))
    state.refresh()
    out = node_annotations(state.snapshot(), frozenset(["0000:03:00.0"]))
    assert json.loads(out[C.ANNOTATION_SCORES]) == {"1": 0}
    assert json.loads(out[C.ANNOTATION_LOSSES]) == {"1": MAX_LOSS}


def test_merge_patch_shape():
    assert merge_patch({"a": "1"}) == {"metadata": {"annotations": {"a": "1"}}}


def test_publisher_retries_and_writes_only_changes():
    stop = threading.Event()
    desired = {"k": "1"}
    writes = []
    failures = [2]

    def patch(annotations):
        if failures[0]:
            failures[0] -= 1
            raise ConnectionError("apiserver away")
        writes.append(dict(annotations))

    results = []
    pub = AnnotationPublisher(lambda: dict(desired), patch, stop, on_result=results.append)
    pub._sleep = lambda delay: stop.wait(0.01)      # no real backoff in the test
    pub.start()
    try:
        deadline = time.monotonic() + 30
        while not writes and time.monotonic() < deadline:
            time.sleep(0.01)
        assert writes == [{"k": "1"}] and results == [False, False, True]
        pub.trigger()                              # nothing changed: no write
        time.sleep(0.1)
        assert len(writes) == 1
        desired["k"] = "2"
        pub.trigger()
        deadline = time.monotonic() + 30
        while len(writes) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert writes[-1] == {"k": "2"}
    finally:
        stop.set()
        pub.join()


def test_pod_resources_client(pod_resources):
    pod_resources.assignments = [
        ("default", "job", "main", RESOURCE_NAME, [BDFS[0], BDFS[1]]),
        ("default", "job", "side", "example.com/other", ["x"]),
        ("ml", "train", "c", RESOURCE_NAME, [BDFS[5]]),
    ]
    client = PodResourcesClient(pod_resources.socket)
    try:
        assert client.list_allocated() == {BDFS[0]: ("default", "job", "main"), BDFS[1]: ("default", "job", "main"),
                                           BDFS[5]: ("ml", "train", "c")}
        assert client.allocatable() is None        # UNIMPLEMENTED in the peer
        pod_resources.stop()
        with pytest.raises(PodResourcesError):
            client.list_allocated()
    finally:
        client.close()


def test_agent_refreshes_annotations_from_pod_resources(make_node, kubelet, pod_resources, run_agent):
    """Allocations seen by the kubelet reach the annotations within the poll interval (<= 5 s)."""
    patches = []
    seen = threading.Condition()

    def patch(annotations):
        with seen:
            patches.append((time.monotonic(), dict(annotations)))
            seen.notify_all()

    def allocated_in_last():
        devices = json.loads(patches[-1][1][C.ANNOTATION_DEVICES])
        return sorted(d["id"] for d in devices if d["allocated"])

    host = make_node("8xC500")
    with run_agent(host, pod_resources_socket=pod_resources.socket, pod_resources_interval=0.5, patch=patch) as agent:
        with seen:
            assert seen.wait_for(lambda: patches, 60)
        assert allocated_in_last() == []
        assert len(json.loads(patches[-1][1][C.ANNOTATION_SCORES])) == 8
        pod_resources.assignments = [("default", "job", "main", RESOURCE_NAME, BDFS[2:4])]
        t0 = time.monotonic()
        with seen:
            assert seen.wait_for(lambda: allocated_in_last() == BDFS[2:4], 60)
        # written after the assignment changed, from the pod-resources poll (no latency bound: a
        # unit test asserts no timing, and a loaded CI machine would not meet one)
        assert patches[-1][0] >= t0
        assert sum(1 for v in json.loads(patches[-1][1][C.ANNOTATION_SCORES]).values() if v) == 6
        assert agent.allocated == frozenset(BDFS[2:4])
        # a GPU failure changes the annotations too
        generator.fail_gpu(host, 0, "smi")
        with seen:
            assert seen.wait_for(lambda: sum(1 for v in json.loads(patches[-1][1][C.ANNOTATION_SCORES]).values() if v) == 5, 60)
        count = len(patches)
        time.sleep(1.2)
        assert len(patches) == count                # no change, no write


def test_metrics_endpoint(make_node, kubelet, run_agent):
    metrics = DevicePluginMetrics()
    host = make_node("8xC500")
    with run_agent(host, metrics=metrics) as agent:
        server = MetricsServer(metrics, "127.0.0.1", 0, agent.health)
        server.start()
        try:
            kubelet.wait_for_devices(lambda ds: len(ds) == 8)
            generator.fail_gpu(host, 1, "smi")
            kubelet.wait_for_devices(lambda ds: sum(1 for d in ds if d[1] == "Healthy") == 7)
            from kubelet_peer import pb
            kubelet.stub.Allocate(pb.AllocateRequest(container_requests=[
                pb.ContainerAllocateRequest(devices_ids=[BDFS[0]])]), timeout=60)
            base = "http://127.0.0.1:%d" % server.port

            def scrape():
                return urllib.request.urlopen(base + "/metrics", timeout=60).read().decode()
            # the gauges follow the stream the kubelet read: on a loaded machine a scrape can come between the two
            deadline = time.monotonic() + 30
            text = scrape()
            while "metax_gpu_devices_healthy 7.0" not in text and time.monotonic() < deadline:
                time.sleep(0.1)
                text = scrape()
            deadline = time.monotonic() + 30
            while agent.health()[0] is False and time.monotonic() < deadline:
                time.sleep(0.05)
            health = urllib.request.urlopen(base + "/healthz", timeout=60)
            assert health.status == 200 and health.read() == b"ok\n"
        finally:
            server.stop()
    assert "metax_gpu_devices 8.0" in text
    assert "metax_gpu_devices_healthy 7.0" in text
    assert 'metax_gpu_device_healthy{device="0000:04:00.0"} 0.0' in text
    assert 'metax_gpu_allocation_duration_seconds_count{rpc="Allocate"} 1.0' in text
    assert "metax_gpu_registrations_total 1.0" in text


def _mx_smi_prints(host, text):
    """Replace the node's mx-smi with one printing ``text`` for every subcommand."""
    import os
    path = host.join("usr/bin/mx-smi")
    with open(path, "w") as handle:
        handle.write("#!/bin/sh\ncat <<'EOF'\n%s\nEOF\n" % text)
    os.chmod(path, 0o755)


def test_garbage_mx_smi_keeps_devices_served_from_pci(make_node, kubelet, run_agent, caplog):
    # A driver update that changes mx-smi's layout must not take the device
    # plugin off the node: devices come from PCI, Healthy, and the problem is
    # a warning in the log and in the metrics.
    metrics = DevicePluginMetrics()
    host = make_node("8xC500")
    _mx_smi_prints(host, "Segmentation fault\n| 0 | C500 | ??? |")
    caplog.set_level("WARNING", logger="gpu-device")
    with run_agent(host, metrics=metrics, healthy_interval=1) as agent:
        server = MetricsServer(metrics, "127.0.0.1", 0, agent.health)
        server.start()
        try:
            _seen, devices = kubelet.wait_for_devices(lambda ds: len(ds) == 8)
            assert sorted(d[0] for d in devices) == BDFS and all(d[1] == "Healthy" for d in devices)
            time.sleep(1.5)                      # a health round: still all Healthy
            assert agent.state.snapshot().healthy_ids == BDFS
            text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % server.port, timeout=60).read().decode()
        finally:
            server.stop()
    assert "metax_gpu_mx_smi_unparsed 1.0" in text and "metax_gpu_devices_healthy 8.0" in text
    logged = [r.getMessage() for r in caplog.records if "not understood" in r.getMessage()
              or "cannot parse" in r.getMessage()]
    assert len(logged) == 1, logged              # once, not on every health round
    assert "mx-smi" in logged[0] and "(line 1: 'Segmentation fault')" in logged[0]


def _published(pub, count, timeout=60.0):
    deadline = time.monotonic() + timeout
    while pub.writes < count and time.monotonic() < deadline:
        time.sleep(0.01)
    return pub.writes


def test_publisher_resync_reads_and_writes_only_when_the_node_changed():
    """Steady state costs no write (docs/scale.md): the resync reads, and writes only after an outside edit."""
    stop = threading.Event()
    node = {"k": "1", "other": "x"}
    pub = AnnotationPublisher(lambda: {"k": "1"}, node.update, stop, resync=0.02,
                              read=lambda: dict(node))
    pub.start()
    try:
        assert _published(pub, 1) == 1
        deadline = time.monotonic() + 30
        while pub.resync_reads < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pub.resync_reads >= 5 and pub.writes == 1      # five resyncs, no write
        node["k"] = "edited by hand"
        assert _published(pub, 2) == 2 and node["k"] == "1"   # repaired
    finally:
        stop.set()
        pub.join()


def test_publisher_resync_writes_when_it_cannot_read():
    """An older ClusterRole without get: the resync writes, as before."""
    stop = threading.Event()

    def forbidden():
        raise PermissionError("403")

    pub = AnnotationPublisher(lambda: {"k": "1"}, lambda ann: None, stop, resync=0.02, read=forbidden)
    pub.start()
    try:
        assert _published(pub, 3) >= 3
    finally:
        stop.set()
        pub.join()


def test_the_publishers_read_and_patch_are_our_node_through_kube_node(monkeypatch):
    """kube_node_annotations / kube_node_patcher: the Node read as JSON, only our annotations merge-patched."""
    from ansible_collections.metax.gpu.plugins.module_utils.deviceplugin import annotations as mod

    class Raw:
        def __init__(self, body):
            self.data = body
            self.released = False

        def release_conn(self):
            self.released = True

    class Core:
        def __init__(self):
            self.patches = []

        def read_node(self, name, **kwargs):
            assert name == "n1" and kwargs["_preload_content"] is False
            return Raw(json.dumps({"metadata": {"annotations": {C.ANNOTATION_SCORES: "{}"}}}).encode())

        def patch_node(self, name, body, **kwargs):
            assert kwargs["_content_type"] == "application/merge-patch+json"
            self.patches.append((name, body))
            return Raw(b"{}")
    core = Core()
    monkeypatch.setattr(mod, "core_v1", lambda api: core)
    assert mod.kube_node_annotations(object(), "n1")() == {C.ANNOTATION_SCORES: "{}"}
    mod.kube_node_patcher(object(), "n1")({C.ANNOTATION_LOSSES: "{}"})
    assert core.patches == [("n1", {"metadata": {"annotations": {C.ANNOTATION_LOSSES: "{}"}}})]
