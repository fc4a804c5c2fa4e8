# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""gpu-dra's device health for the kubelet (dra/health.py, KEP-4680): the entries from the pool's taints, and the
DRAResourceHealth stream over a real unix-socket gRPC channel, as the kubelet of 1.36 opens it."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time

import pytest

grpc = pytest.importorskip("grpc")

from ansible_collections.metax.gpu.plugins.module_utils.deviceplugin.api import (  # noqa: E402
    dra_health_v1alpha1_pb2 as hpb, dra_health_v1alpha1_pb2_grpc as hgrpc)
from ansible_collections.metax.gpu.plugins.module_utils.dra import health as H  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.dra import slices as S  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.kubelet.pluginwatcher import UnixServer  # noqa: E402


def devices(*tainted, gone=()):
    out = []
    for name in ("gpu-a", "gpu-b", "gpu-c"):
        dev = {"name": name, "attributes": {}}
        if name in tainted:
            dev["taints"] = [S.unhealthy_taint()]
        if name in gone:
            dev["taints"] = [S.unhealthy_taint(S.REASON_GONE)]
        out.append(dev)
    return out


def test_a_device_is_unhealthy_exactly_while_it_carries_the_taint():
    got = H.device_health("node-a", devices("gpu-b", gone=("gpu-c",)))
    assert [(h.pool, h.device, h.health) for h in got] == [
        ("node-a", "gpu-a", H.HEALTHY), ("node-a", "gpu-b", H.UNHEALTHY), ("node-a", "gpu-c", H.UNHEALTHY)]
    assert got[0].message == "" and "Unhealthy" in got[1].message and "PCI bus" in got[2].message
    # another driver's taint key is not ours to report
    other = [{"name": "gpu-a", "taints": [{"key": "example.com/x", "effect": "NoSchedule"}]}]
    assert H.device_health("node-a", other)[0].health == H.HEALTHY


def test_the_feed_versions_only_real_changes():
    feed = H.HealthFeed("node-a")
    assert not feed.known and feed.update(devices()) and feed.known
    version = feed.version
    assert not feed.update(devices()) and feed.version == version
    assert feed.update(devices("gpu-a")) and feed.version == version + 1


def test_the_response_carries_every_device_with_its_time_and_timeout():
    msg = H.response(H.device_health("node-a", devices("gpu-c")), now=1700000000.7, timeout_seconds=30)
    assert H.health_map(msg) == {"gpu-a": (hpb.HEALTHY, ""), "gpu-b": (hpb.HEALTHY, ""),
                                 "gpu-c": (hpb.UNHEALTHY, H.device_health("node-a", devices("gpu-c"))[2].message)}
    assert {(d.last_updated_time, d.health_check_timeout_seconds) for d in msg.devices} == {(1700000000, 30)}
    # the bytes a Go peer reads (field numbers of dra-health/v1alpha1's api.proto)
    one = hpb.NodeWatchResourcesResponse.FromString(msg.SerializeToString())
    assert one == msg


@pytest.fixture
def served():
    path = tempfile.mkdtemp(prefix="mxhealth-", dir="/tmp")
    feed = H.HealthFeed("node-a")
    service = H.HealthService(feed, resend=0.5)
    server = UnixServer(os.path.join(path, "dra.sock"),
                        lambda s: hgrpc.add_DRAResourceHealthServicer_to_server(service, s), name="health")
    server.start()
    yield feed, service, server.socket_path
    service.stop()
    server.stop()
    shutil.rmtree(path, ignore_errors=True)


def test_a_stream_waits_for_the_first_publication_then_sends_changes_and_resends(served):
    feed, service, socket = served
    with grpc.insecure_channel("unix://" + socket) as channel:
        stream = hgrpc.DRAResourceHealthStub(channel).NodeWatchResources(hpb.NodeWatchResourcesRequest(), timeout=120)
        threading.Timer(0.3, feed.update, args=(devices(),)).start()
        started = time.monotonic()
        first = next(stream)
        assert time.monotonic() - started >= 0.25          # nothing before the pool was known
        assert H.health_map(first)["gpu-b"] == (hpb.HEALTHY, "")
        # the kubelet's timeout is three resends: the list comes again with nothing changed
        assert service.timeout_seconds == 2 and first.devices[0].health_check_timeout_seconds == 2
        again = next(stream)
        assert H.health_map(again) == H.health_map(first)
        feed.update(devices("gpu-b"))
        for message in stream:
            if H.health_map(message)["gpu-b"][0] == hpb.UNHEALTHY:
                break
        stream.cancel()
    deadline = time.monotonic() + 30
    while service.streams and time.monotonic() < deadline:
        time.sleep(0.05)
    assert service.streams == 0 and service.sent >= 3


def test_stopping_ends_open_streams(served):
    feed, service, socket = served
    feed.update(devices())
    with grpc.insecure_channel("unix://" + socket) as channel:
        stream = hgrpc.DRAResourceHealthStub(channel).NodeWatchResources(hpb.NodeWatchResourcesRequest(), timeout=120)
        next(stream)
        service.stop()
        with pytest.raises(StopIteration):
            while True:
                next(stream)
    assert service.streams == 0


def test_the_stated_time_is_the_last_run_of_the_checks_so_stalled_checks_lapse():
    feed = H.HealthFeed("node-a", check_interval=20)
    service = H.HealthService(feed, resend=10, clock=lambda: 5000.0)
    # slower checks than resends: the kubelet's timeout covers three check periods
    assert service.timeout_seconds == 60
    feed.update(devices())
    assert {d.last_updated_time for d in service.message(feed.snapshot()[1]).devices} == {5000}  # no checks yet
    feed.checked(4321.9)
    # however often it is resent, the health is as of the checks' last run
    assert {d.last_updated_time for d in service.message(feed.snapshot()[1]).devices} == {4321}
