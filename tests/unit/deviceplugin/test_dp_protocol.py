# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""gpu-device against a kubelet-side gRPC peer: every RPC, restarts, malformed requests."""

from __future__ import annotations

import os
import re
import threading
import time

import grpc
import polling
import pytest

from ansible_collections.metax.gpu.plugins.module_utils.deviceplugin.api import deviceplugin_v1beta1_pb2 as pb
from ansible_collections.metax.gpu.plugins.module_utils.gpu.allocator import allocate
from ansible_collections.metax.gpu.plugins.module_utils.gpu.discovery import discover
from ansible_collections.metax.gpu.plugins.module_utils.host import HostRoot
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator
from ansible_collections.metax.gpu.plugins.module_utils.sim.spec import preset

BDFS_8XC500 = ["0000:03:00.0", "0000:04:00.0", "0000:05:00.0", "0000:06:00.0",
               "0000:43:00.0", "0000:44:00.0", "0000:45:00.0", "0000:46:00.0"]


@pytest.fixture(scope="module")
def shared():
    """One 8xC500 agent and kubelet peer for the tests that do not change the node."""
    import shutil
    import tempfile
    from running_agent import RunningAgent
    from kubelet_peer import KubeletPeer
    from ansible_collections.metax.gpu.plugins.module_utils.agents.gpu_device import GpuDeviceAgent

    base = tempfile.mkdtemp(prefix="mxdp-", dir="/tmp")
    host = generator.create(os.path.join(base, "node"), preset("8xC500"))
    peer = KubeletPeer(os.path.join(base, "dp"))
    peer.start()
    agent = GpuDeviceAgent(host, os.path.join(base, "dp"), healthy_interval=1, pod_resources_socket=None)
    try:
        with RunningAgent(agent):
            peer.wait_for_devices(all_healthy(8))
            yield host, peer, agent
    finally:
        peer.stop()
        shutil.rmtree(base, ignore_errors=True)


def healthy(devices):
    return sorted(d[0] for d in devices if d[1] == "Healthy")


def all_healthy(count):
    return lambda devices: len(devices) == count and len(healthy(devices)) == count


def test_register_options_and_initial_list(shared):
    kubelet = shared[1]
    request = kubelet.wait_for_registration()[1]
    assert request.version == "v1beta1"
    assert request.resource_name == "metax-tech.com/gpu"
    assert re.match(r"^metax-gpu-[0-9a-f]{8}\.sock$", request.endpoint)
    assert request.options.get_preferred_allocation_available
    assert not request.options.pre_start_required
    assert kubelet.options.get_preferred_allocation_available
    devices = kubelet.wait_for_devices(all_healthy(8))[1]
    assert [d[0] for d in devices] == BDFS_8XC500
    assert [d[2] for d in devices] == [[0]] * 4 + [[1]] * 4     # NUMA nodes
    assert kubelet.stub.PreStartContainer(pb.PreStartContainerRequest(devices_ids=BDFS_8XC500[:1]),
                                          timeout=60) == pb.PreStartContainerResponse()


def test_preferred_allocation_is_the_allocators_choice(shared):
    host, kubelet = shared[0], shared[1]
    inv = discover(host)
    # GPUs 0 and 1 taken: a pair must come from 2,3 (keeps the rest of group 4-7 whole)
    available = BDFS_8XC500[2:]
    request = pb.PreferredAllocationRequest(container_requests=[
        pb.ContainerPreferredAllocationRequest(available_deviceIDs=available, allocation_size=2),
        pb.ContainerPreferredAllocationRequest(available_deviceIDs=BDFS_8XC500, allocation_size=4,
                                               must_include_deviceIDs=[BDFS_8XC500[5]]),
    ])
    response = kubelet.stub.GetPreferredAllocation(request, timeout=60)
    got = [list(r.deviceIDs) for r in response.container_responses]
    expect_pair = allocate(inv.topology, range(2, 8), 2).devices
    expect_four = allocate(inv.topology, range(8), 4, [5]).devices
    assert got == [[BDFS_8XC500[i] for i in expect_pair], [BDFS_8XC500[i] for i in expect_four]]
    assert got[0] == BDFS_8XC500[2:4]
    assert got[1] == BDFS_8XC500[4:8]


def test_allocate_device_nodes_and_environment(tmp_path, kubelet, run_agent):
    host = generator.create(str(tmp_path / "node"), preset("8xC500"))
    prefixed = HostRoot(host.path, host_prefix="/var/lib/metax-sim/root")
    with run_agent(prefixed):
        kubelet.wait_for_devices(all_healthy(8))
        request = pb.AllocateRequest(container_requests=[
            pb.ContainerAllocateRequest(devices_ids=[BDFS_8XC500[5], BDFS_8XC500[4]]),
            pb.ContainerAllocateRequest(devices_ids=[BDFS_8XC500[0]]),
        ])
        response = kubelet.stub.Allocate(request, timeout=60)
    first, second = response.container_responses
    assert [(d.container_path, d.host_path, d.permissions) for d in first.devices] == [
        ("/dev/mxcd", "/var/lib/metax-sim/root/dev/mxcd", "rw"),
        ("/dev/dri/card4", "/var/lib/metax-sim/root/dev/dri/card4", "rw"),
        ("/dev/dri/renderD132", "/var/lib/metax-sim/root/dev/dri/renderD132", "rw"),
        ("/dev/dri/card5", "/var/lib/metax-sim/root/dev/dri/card5", "rw"),
        ("/dev/dri/renderD133", "/var/lib/metax-sim/root/dev/dri/renderD133", "rw"),
    ]
    assert dict(first.envs)["METAX_VISIBLE_DEVICES"] == "0000:43:00.0,0000:44:00.0"
    assert dict(first.envs)["METAX_DEVICE_INDICES"] == "4,5"
    assert dict(first.envs)["METAX_DEVICE_UUIDS"].count("GPU-") == 2
    assert [d.container_path for d in second.devices] == ["/dev/mxcd", "/dev/dri/card0", "/dev/dri/renderD128"]
    assert not first.mounts and not first.annotations


@pytest.mark.parametrize("build, message", [
    (pb.AllocateRequest, "no container_requests"),
    (lambda: pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest()]), "no device IDs"),
    (lambda: pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=["nope"])]),
     "unknown device"),
    (lambda: pb.AllocateRequest(container_requests=[
        pb.ContainerAllocateRequest(devices_ids=[BDFS_8XC500[0], BDFS_8XC500[0]])]), "duplicate"),
])
def test_allocate_malformed(shared, build, message):
    kubelet, agent = shared[1], shared[2]
    before = agent.service.allocations
    with pytest.raises(grpc.RpcError) as err:
        kubelet.stub.Allocate(build(), timeout=60)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in err.value.details()
    assert agent.service.allocations == before


@pytest.mark.parametrize("creq, message", [
    (dict(available_deviceIDs=BDFS_8XC500, allocation_size=0), "must be positive"),
    (dict(available_deviceIDs=BDFS_8XC500[:2], allocation_size=3), "exceeds"),
    (dict(available_deviceIDs=BDFS_8XC500[:2], must_include_deviceIDs=[BDFS_8XC500[3]], allocation_size=2),
     "not in available"),
    (dict(available_deviceIDs=["0000:99:00.0"], allocation_size=1), "unknown device"),
    (dict(available_deviceIDs=BDFS_8XC500[:1] * 2, allocation_size=1), "duplicates"),
])
def test_preferred_allocation_malformed(shared, creq, message):
    kubelet = shared[1]
    request = pb.PreferredAllocationRequest(container_requests=[pb.ContainerPreferredAllocationRequest(**creq)])
    with pytest.raises(grpc.RpcError) as err:
        kubelet.stub.GetPreferredAllocation(request, timeout=60)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in err.value.details()


def test_health_changes_stream_and_recover(make_node, kubelet, run_agent):
    host = make_node("8xC500")
    with run_agent(host, healthy_interval=1):
        kubelet.wait_for_devices(all_healthy(8))
        generator.fail_gpu(host, 2, "bus")
        # the health interval is 1 s; how fast the change arrives is not asserted here (no timing in unit
        # tests: a loaded CI machine is no evidence), only that it arrives on the open stream
        _seen, devices = kubelet.wait_for_devices(lambda ds: len(ds) == 8 and len(healthy(ds)) == 7, timeout=30)
        assert [d for d in devices if d[1] == "Unhealthy"][0][0] == BDFS_8XC500[2]
        # an unhealthy device cannot be allocated
        with pytest.raises(grpc.RpcError) as err:
            kubelet.stub.Allocate(pb.AllocateRequest(container_requests=[
                pb.ContainerAllocateRequest(devices_ids=[BDFS_8XC500[2]])]), timeout=60)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "unhealthy" in err.value.details()
        # still allocatable around it, with the right device nodes (indices shifted on the bus)
        response = kubelet.stub.Allocate(pb.AllocateRequest(container_requests=[
            pb.ContainerAllocateRequest(devices_ids=[BDFS_8XC500[3]])]), timeout=60)
        assert [d.container_path for d in response.container_responses[0].devices][1] == "/dev/dri/card3"
        generator.recover_gpu(host, 2)
        kubelet.wait_for_devices(all_healthy(8), timeout=30)
        generator.fail_gpu(host, 6, "smi")
        kubelet.wait_for_devices(lambda ds: healthy(ds) == sorted(set(BDFS_8XC500) - {BDFS_8XC500[6]}), timeout=30)
        generator.unload_driver(host)
        kubelet.wait_for_devices(lambda ds: len(ds) == 8 and not healthy(ds), timeout=30)
        generator.load_driver(host)
        generator.recover_gpu(host, 6)
        kubelet.wait_for_devices(all_healthy(8), timeout=30)


def test_kubelet_restart_reregisters(make_node, kubelet, run_agent):
    # How fast is measured in benchmarks/ and on the cluster (test_gpu_device_cluster.py), not here: these
    # waits are generous so that a loaded machine cannot fail them.
    with run_agent(make_node("8xC500")) as agent:
        kubelet.wait_for_registration(1)
        kubelet.wait_for_devices(all_healthy(8))
        kubelet.restart()                   # removes our socket, recreates kubelet.sock
        kubelet.wait_for_registration(2, timeout=60)
        kubelet.wait_for_devices(all_healthy(8))
        # only our socket removed (kubelet.sock unchanged): register again as well
        os.unlink(agent.server.socket_path)
        kubelet.wait_for_registration(3, timeout=60)
        # the kubelet stops for a while, then comes back
        kubelet.stop()
        polling.wait_until(lambda: agent.health() == (False, "not registered with the kubelet"), 30,
                           "the agent to report that it is not registered", interval=0.05)
        started = time.monotonic()
        kubelet.start()
        kubelet.wait_for_registration(4, timeout=60)
        # Not a count on the agent's side: the stop may cancel the third registration after the kubelet
        # recorded it, and the agent, seeing it fail, counts one fewer. What matters is a registration
        # that succeeded with the kubelet that came back.
        polling.wait_until(lambda: agent.health() == (True, "ok") and (agent.last_registration or 0.0) >= started, 60,
                           "the agent to be registered with the new kubelet and healthy", interval=0.05)
        # old servers are shut down (polled: a loaded machine may take a while): exactly one socket of ours,
        # still there a second later
        polling.wait_until(lambda: [n for n in os.listdir(kubelet.dir) if n.startswith("metax-gpu-")]
                           == [agent.server.endpoint], 60, "the old servers' sockets removed", interval=0.1)
        time.sleep(1)
        assert [n for n in os.listdir(kubelet.dir) if n.startswith("metax-gpu-")] == [agent.server.endpoint]


def test_stale_sockets_are_removed_live_ones_kept(make_node, kubelet, run_agent):
    import socket as socketlib

    stale = os.path.join(kubelet.dir, "metax-gpu-deadbeef.sock")
    dead = socketlib.socket(socketlib.AF_UNIX)
    dead.bind(stale)
    dead.close()                       # the file stays, nobody listens: what a killed agent leaves
    live_path = os.path.join(kubelet.dir, "metax-gpu-0000live.sock")
    live = socketlib.socket(socketlib.AF_UNIX)
    live.bind(live_path)
    live.listen(1)
    try:
        with run_agent(make_node("1xC500")) as agent:
            kubelet.wait_for_registration(1)
            assert not os.path.exists(stale)
            assert os.path.exists(live_path)
            assert os.path.exists(agent.server.socket_path)
    finally:
        live.close()


def test_waits_for_a_missing_kubelet(make_node, sockdir, run_agent, caplog):
    from kubelet_peer import KubeletPeer

    peer = KubeletPeer(os.path.join(sockdir, "device-plugins"))
    with run_agent(make_node("1xC500")) as agent:
        time.sleep(1.2)
        # the first attempt follows discovery (the simulated mx-smi), slow on a loaded machine: polled
        polling.wait_until(lambda: any("waiting for the kubelet" in r.getMessage() for r in list(caplog.records)), 60,
                           "the agent to log that it waits for the kubelet", interval=0.1)
        assert agent.registrations == 0
        assert any("waiting for the kubelet" in r.getMessage() for r in caplog.records)
        peer.start()
        try:
            peer.wait_for_registration(1, timeout=30)
            peer.wait_for_devices(all_healthy(1))
        finally:
            peer.stop()


def test_kubelet_refusing_registration_is_retried(make_node, kubelet, run_agent, caplog):
    with run_agent(make_node("1xC500"), resource_name="not-an-extended-name") as agent:
        # The first attempt follows discovery, which runs the simulated mx-smi; on two busy
        # cores that took most of the old 5 s, so the wait is generous and asserts no timing.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(
                "registration failed" in r.getMessage() and "invalid resource name" in r.getMessage()
                for r in list(caplog.records)):
            time.sleep(0.1)
        assert agent.registrations == 0
        assert any("invalid resource name" in r.getMessage() for r in list(caplog.records))


def test_health_checks_disabled(make_node, kubelet, run_agent):
    host = make_node("8xC500")
    generator.fail_gpu(host, 1, "smi")
    with run_agent(host, healthy_interval=0) as agent:
        kubelet.wait_for_devices(all_healthy(8))
        generator.fail_gpu(host, 3, "bus")
        time.sleep(1.5)
        assert len(healthy(kubelet.latest())) == 8
        assert agent.state.scans <= 2


def test_concurrent_calls(shared):
    """Allocations from several threads at once."""
    kubelet, agent = shared[1], shared[2]
    before = agent.service.allocations
    errors = []

    def call(i):
        try:
            kubelet.stub.Allocate(pb.AllocateRequest(container_requests=[
                pb.ContainerAllocateRequest(devices_ids=[BDFS_8XC500[i % 8]])]), timeout=60)
        except grpc.RpcError as exc:     # pragma: no cover - reported below
            errors.append(exc)
    threads = [threading.Thread(target=call, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    assert agent.service.allocations == before + 16
