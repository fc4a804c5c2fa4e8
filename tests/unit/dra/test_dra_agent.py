# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""gpu-dra as a whole on a simulated node: the mode switch, publishing, taints that clear,
a restart that keeps prepared claims, withdrawal when the node leaves DRA mode.

The API server is the one stand-in (ApiServer below): it keeps ResourceSlices by name with a
resourceVersion and answers a stale update with 409, as the real one does; the kubelet's side
is real gRPC over the agent's sockets.
"""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
import threading
import time

import pytest

grpc = pytest.importorskip("grpc")

from ansible_collections.metax.gpu.plugins.module_utils.agents import gpu_dra  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.deviceplugin.api import (  # noqa: E402
    dra_v1_pb2 as dra, dra_v1_pb2_grpc as dra_grpc, pluginregistration_v1_pb2 as reg,
    pluginregistration_v1_pb2_grpc as reg_grpc)
from ansible_collections.metax.gpu.plugins.module_utils.dra import slices as S  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.dra.prepare import ClaimError  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.kube.client import ApiException  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.names import DEVICE_MODE_DRA, DRA_DRIVER  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator  # noqa: E402


class ApiServer:
    """ResourceSlices by name with resourceVersions (a stale replace is a 409), claims, the mode label."""

    def __init__(self, mode=DEVICE_MODE_DRA):
        self.slices = {}
        self.claims = {}
        self.mode = mode
        self.allocatable = 0          # the device plugin's metax-tech.com/gpu in the Node's allocatable
        self.version = 0
        self.lock = threading.Lock()
        self.writes = 0

    def _stamp(self, body):
        self.version += 1
        body["metadata"]["resourceVersion"] = str(self.version)
        for dev in body["spec"].get("devices") or []:
            for taint in dev.get("taints") or []:
                taint.setdefault("timeAdded", "2026-11-28T00:00:%02dZ" % (self.version % 60))
        return body

    def list(self):
        with self.lock:
            return [copy.deepcopy(s) for s in self.slices.values()]

    def create(self, body):
        with self.lock:
            if body["metadata"]["name"] in self.slices:
                raise ApiException(status=409, reason="AlreadyExists")
            self.writes += 1
            self.slices[body["metadata"]["name"]] = self._stamp(copy.deepcopy(body))

    def replace(self, body):
        with self.lock:
            old = self.slices.get(body["metadata"]["name"])
            if old is None:
                raise ApiException(status=404, reason="NotFound")
            if old["metadata"]["resourceVersion"] != body["metadata"].get("resourceVersion"):
                raise ApiException(status=409, reason="Conflict")
            self.writes += 1
            self.slices[body["metadata"]["name"]] = self._stamp(copy.deepcopy(body))

    def delete(self, name):
        with self.lock:
            self.slices.pop(name, None)

    def get_claim(self, namespace, name):
        try:
            return self.claims[(namespace, name)]
        except KeyError:
            raise ClaimError("resourceclaim %s/%s not found" % (namespace, name))

    def node_mode(self):
        return self.mode

    def plugin_allocatable(self):
        return self.allocatable

    def devices(self):
        return [d for s in sorted(self.slices) for d in self.slices[s]["spec"].get("devices") or []]


def until(condition, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def sockdir():
    path = tempfile.mkdtemp(prefix="mxdra-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


class Running:
    def __init__(self, agent):
        self.agent = agent
        self.thread = threading.Thread(target=agent.run, name="gpu-dra", daemon=True)

    def __enter__(self):
        self.thread.start()
        return self.agent

    def __exit__(self, *exc):
        self.agent.stop.set()
        self.thread.join(60)
        assert not self.thread.is_alive(), "gpu-dra did not stop"


def make_agent(host, api, sockdir, tmp_path, **kwargs):
    kwargs.setdefault("healthy_interval", 1)
    kwargs.setdefault("resync_interval", 1.0)
    return gpu_dra.GpuDraAgent(host, "node-a", api, os.path.join(sockdir, "plugins"),
                               os.path.join(sockdir, "registry"), str(tmp_path / "cdi"), None, **kwargs)


def reg_socket(sockdir):
    return os.path.join(sockdir, "registry", DRA_DRIVER + "-reg.sock")


def test_publishes_the_pool_and_taints_a_failed_gpu_until_it_recovers(make_node, sockdir, tmp_path):
    host = make_node("8xC500")
    api = ApiServer()
    with Running(make_agent(host, api, sockdir, tmp_path)) as agent:
        assert until(lambda: len(api.devices()) == 8)
        assert len(api.slices) == 1
        item = next(iter(api.slices.values()))
        assert item["spec"]["pool"]["generation"] == 1 and item["spec"]["nodeName"] == "node-a"
        assert until(lambda: os.path.exists(reg_socket(sockdir)))
        generator.fail_gpu(host, 3, "smi")
        victim = S.device_name(agent.state.snapshot().devices[3].id)
        assert until(lambda: S.tainted(api.devices()) == [(victim, S.REASON_UNHEALTHY)])
        tainted_gen = list(api.slices.values())[0]["spec"]["pool"]["generation"]
        assert tainted_gen == 2
        stamp = [d for d in api.devices() if d["name"] == victim][0]["taints"][0]["timeAdded"]
        generator.recover_gpu(host, 3)
        assert until(lambda: S.tainted(api.devices()) == [])
        assert list(api.slices.values())[0]["spec"]["pool"]["generation"] == 3
        assert stamp
        writes = api.writes
        time.sleep(2.5)                       # resyncs with nothing changed write nothing
        assert api.writes == writes


def test_waits_without_registering_while_the_node_is_on_the_device_plugin(make_node, sockdir, tmp_path):
    host = make_node("1xC500")
    api = ApiServer(mode=None)
    with Running(make_agent(host, api, sockdir, tmp_path)):
        time.sleep(1.0)
        assert api.slices == {} and not os.path.exists(reg_socket(sockdir))
        api.mode = DEVICE_MODE_DRA
        assert until(lambda: os.path.exists(reg_socket(sockdir)) and len(api.devices()) == 1)
        # switched back: unregistered and the pool deleted, so the device plugin alone serves the node
        api.mode = "device-plugin"
        assert until(lambda: api.slices == {} and not os.path.exists(reg_socket(sockdir)))


def test_a_restarted_plugin_keeps_its_prepared_claim(make_node, sockdir, tmp_path):
    host = make_node("8xC500")
    api = ApiServer()
    with Running(make_agent(host, api, sockdir, tmp_path)) as agent:
        assert until(lambda: len(api.devices()) == 8 and os.path.exists(reg_socket(sockdir)))
        names = [d["name"] for d in api.devices()]
        api.claims[("ns", "c")] = {"metadata": {"uid": "u-1"}, "status": {"allocation": {"devices": {"results": [
            {"request": "r", "driver": DRA_DRIVER, "pool": "node-a", "device": names[6]}]}}}}
        with grpc.insecure_channel("unix://" + reg_socket(sockdir)) as channel:
            endpoint = reg_grpc.RegistrationStub(channel).GetInfo(reg.InfoRequest(), timeout=60).endpoint
        with grpc.insecure_channel("unix://" + endpoint) as channel:
            first = dra_grpc.DRAPluginStub(channel).NodePrepareResources(dra.NodePrepareResourcesRequest(
                claims=[dra.Claim(namespace="ns", uid="u-1", name="c")]), timeout=60).claims["u-1"]
        assert first.error == "" and [d.device_name for d in first.devices] == [names[6]]
        assert agent.preparer.api_reads == 1
    api.claims.clear()            # the API server cannot help the restarted plugin: the checkpoint must
    with Running(make_agent(host, api, sockdir, tmp_path)) as again:
        assert set(again.preparer.prepared) == {"u-1"}
        assert until(lambda: os.path.exists(reg_socket(sockdir)))
        with grpc.insecure_channel("unix://" + endpoint) as channel:
            stub = dra_grpc.DRAPluginStub(channel)
            retry = stub.NodePrepareResources(dra.NodePrepareResourcesRequest(
                claims=[dra.Claim(namespace="ns", uid="u-1", name="c")]), timeout=60).claims["u-1"]
            assert retry == first and again.preparer.api_reads == 0
            assert os.listdir(str(tmp_path / "cdi")) == ["metax-tech.com-gpu-claim-u-1.json"]
            gone = stub.NodeUnprepareResources(dra.NodeUnprepareResourcesRequest(
                claims=[dra.Claim(namespace="ns", uid="u-1", name="c")]), timeout=60).claims["u-1"]
            assert gone.error == "" and os.listdir(str(tmp_path / "cdi")) == []


def test_parser_and_main_refuse_clearly(tmp_path):
    args = gpu_dra.build_parser().parse_args([])
    assert (args.plugins_dir, args.plugins_registry_dir, args.healthy_interval) == (
        "/var/lib/kubelet/plugins", "/var/lib/kubelet/plugins_registry", 5)
    with pytest.raises(gpu_dra.UsageError, match="--node-name"):
        gpu_dra.main(["--node-name", "", "--log-format", "text"])


def test_sockets_removed_by_a_restarting_kubelet_are_served_again(make_node, sockdir, tmp_path):
    host = make_node("1xC500")
    api = ApiServer()
    with Running(make_agent(host, api, sockdir, tmp_path)) as agent:
        assert until(lambda: os.path.exists(reg_socket(sockdir)))
        os.unlink(reg_socket(sockdir))          # what a kubelet cleaning plugins_registry does
        assert until(lambda: os.path.exists(reg_socket(sockdir)))     # (the inode number may be reused)
        with grpc.insecure_channel("unix://" + reg_socket(sockdir)) as channel:
            info = reg_grpc.RegistrationStub(channel).GetInfo(reg.InfoRequest(), timeout=60)
        assert info.name == DRA_DRIVER and os.path.exists(info.endpoint)
        assert agent.plugin.sockets_present()


def test_publishes_only_once_the_device_plugin_serves_nothing(make_node, sockdir, tmp_path):
    host = make_node("1xC500")
    api = ApiServer()
    api.allocatable = 1                 # switched by its label: gpu-device's devices not zeroed yet
    with Running(make_agent(host, api, sockdir, tmp_path)):
        assert until(lambda: os.path.exists(reg_socket(sockdir)))
        time.sleep(1.5)
        assert api.slices == {}         # registered, but not a device offered beside the device plugin's
        api.allocatable = 0             # the kubelet's next node-status update
        assert until(lambda: len(api.devices()) == 1)


def test_stopping_on_a_node_that_left_dra_mode_takes_the_pool_along(make_node, sockdir, tmp_path):
    host = make_node("1xC500")
    api = ApiServer()
    with Running(make_agent(host, api, sockdir, tmp_path, resync_interval=3600.0)):
        assert until(lambda: len(api.devices()) == 1)
    # a restart in DRA mode keeps the pool (the claims stay schedulable)
    assert len(api.devices()) == 1
    with Running(make_agent(host, api, sockdir, tmp_path, resync_interval=3600.0)):
        assert until(lambda: os.path.exists(reg_socket(sockdir)))
        # the label goes: the DaemonSet controller stops us long before the next look at the label
        api.mode = "device-plugin"
    assert api.slices == {} and not os.path.exists(reg_socket(sockdir))


def test_the_kubelets_health_stream_follows_the_taints(make_node, sockdir, tmp_path):
    from ansible_collections.metax.gpu.plugins.module_utils.deviceplugin.api import (
        dra_health_v1alpha1_pb2 as hpb, dra_health_v1alpha1_pb2_grpc as hgrpc)
    from ansible_collections.metax.gpu.plugins.module_utils.dra.health import health_map

    host = make_node("8xC500")
    api = ApiServer()
    with Running(make_agent(host, api, sockdir, tmp_path)) as agent:
        assert until(lambda: len(api.devices()) == 8 and os.path.exists(reg_socket(sockdir)))
        names = sorted(d["name"] for d in api.devices())
        socket = os.path.join(sockdir, "plugins", DRA_DRIVER, "dra.sock")
        with grpc.insecure_channel("unix://" + socket) as channel:
            # the call the kubelet makes (pkg/kubelet/cm/dra/plugin: NodeWatchResources on the DRA socket)
            watcher = hgrpc.DRAResourceHealthStub(channel)
            # the stream's deadline covers the whole exchange below (generous: it is cancelled at the end)
            stream = watcher.NodeWatchResources(hpb.NodeWatchResourcesRequest(), timeout=120)
            first = next(stream)
            assert health_map(first) == {n: (hpb.HEALTHY, "") for n in names}
            assert {d.device.pool_name for d in first.devices} == {"node-a"}
            assert all(d.health_check_timeout_seconds == 30 and d.last_updated_time > 0 for d in first.devices)
            generator.fail_gpu(host, 3, "smi")
            victim = S.device_name(agent.state.snapshot().devices[3].id)
            for message in stream:
                got = health_map(message)
                if got[victim][0] == hpb.UNHEALTHY:
                    break
            assert got[victim][1].startswith("failed gpu-dra's health checks") and "Unhealthy" in got[victim][1]
            assert all(got[n] == (hpb.HEALTHY, "") for n in names if n != victim)
            # the same health that taints the device in the slice
            assert until(lambda: S.tainted(api.devices()) == [(victim, S.REASON_UNHEALTHY)])
            generator.recover_gpu(host, 3)
            for message in stream:
                if health_map(message)[victim][0] == hpb.HEALTHY:
                    break
            stream.cancel()
        assert until(lambda: agent.plugin.health.streams == 0)
