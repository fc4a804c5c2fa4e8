# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""gpu-dra's two sockets over real gRPC, as the kubelet uses them: the plugin watcher's
GetInfo / NotifyRegistrationStatus, then NodePrepareResources / NodeUnprepareResources."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

grpc = pytest.importorskip("grpc")

from ansible_collections.metax.gpu.plugins.module_utils.deviceplugin.api import (  # noqa: E402
    dra_v1_pb2 as dra, dra_v1_pb2_grpc as dra_grpc, pluginregistration_v1_pb2 as reg,
    pluginregistration_v1_pb2_grpc as reg_grpc)
from ansible_collections.metax.gpu.plugins.module_utils.dra import prepare as P  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.dra.server import DraPlugin  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.dra.slices import device_name  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.gpu.discovery import discover  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.names import DRA_DRIVER  # noqa: E402


@pytest.fixture
def sockdir():
    path = tempfile.mkdtemp(prefix="mxdra-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_the_kubelet_registers_the_plugin_and_prepares_claims(make_node, sockdir, tmp_path):
    host = make_node("8xC500")
    inv = discover(host)
    names = [device_name(d.id) for d in inv.devices]
    claims = {("ns", "train"): {"metadata": {"uid": "u-1"}, "status": {"allocation": {"devices": {"results": [
        {"request": "gpus", "driver": DRA_DRIVER, "pool": "node-a", "device": names[0]},
        {"request": "gpus", "driver": DRA_DRIVER, "pool": "node-a", "device": names[1]}]}}}}}

    def get_claim(namespace, name):
        try:
            return claims[(namespace, name)]
        except KeyError:
            raise P.ClaimError("not found")
    preparer = P.Preparer("node-a", os.path.join(sockdir, "plugins", DRA_DRIVER), str(tmp_path / "cdi"), get_claim,
                          lambda: P.cdi_devices(inv), host_path=host.host_path)
    plugin = DraPlugin(preparer, os.path.join(sockdir, "plugins"), os.path.join(sockdir, "plugins_registry"))
    plugin.start()
    try:
        assert plugin.sockets_present()
        registry = sorted(os.listdir(os.path.join(sockdir, "plugins_registry")))
        assert registry == [DRA_DRIVER + "-reg.sock"]
        with grpc.insecure_channel("unix://" + os.path.join(sockdir, "plugins_registry", registry[0])) as channel:
            watcher = reg_grpc.RegistrationStub(channel)
            info = watcher.GetInfo(reg.InfoRequest(), timeout=60)
            assert (info.type, info.name, list(info.supported_versions)) == ("DRAPlugin", DRA_DRIVER, ["v1.DRAPlugin"])
            assert info.endpoint == os.path.join(sockdir, "plugins", DRA_DRIVER, "dra.sock")
            watcher.NotifyRegistrationStatus(reg.RegistrationStatus(plugin_registered=True), timeout=60)
        assert plugin.registration.wait_registered(60) and plugin.registration.state.calls == 1
        with grpc.insecure_channel("unix://" + info.endpoint) as channel:
            kubelet = dra_grpc.DRAPluginStub(channel)
            request = dra.NodePrepareResourcesRequest(claims=[
                dra.Claim(namespace="ns", uid="u-1", name="train"), dra.Claim(namespace="ns", uid="u-2", name="gone")])
            response = kubelet.NodePrepareResources(request, timeout=60)
            assert set(response.claims) == {"u-1", "u-2"}       # every claim has an entry
            ok, failed = response.claims["u-1"], response.claims["u-2"]
            assert ok.error == "" and failed.error == "not found" and not failed.devices
            assert [(d.pool_name, d.device_name, list(d.request_names), list(d.cdi_device_ids)) for d in ok.devices] == [
                ("node-a", names[i], ["gpus"], ["metax-tech.com/gpu=u-1-%s" % names[i]]) for i in (0, 1)]
            # the kubelet's retry is answered the same
            assert kubelet.NodePrepareResources(request, timeout=60).claims["u-1"] == ok
            assert os.listdir(str(tmp_path / "cdi")) == ["metax-tech.com-gpu-claim-u-1.json"]
            gone = kubelet.NodeUnprepareResources(dra.NodeUnprepareResourcesRequest(claims=[
                dra.Claim(namespace="ns", uid="u-1", name="train"), dra.Claim(namespace="ns", uid="u-2", name="gone")]),
                timeout=60)
            assert set(gone.claims) == {"u-1", "u-2"} and all(c.error == "" for c in gone.claims.values())
            assert os.listdir(str(tmp_path / "cdi")) == []
        assert plugin.service.calls == {"prepare": 2, "unprepare": 1}
    finally:
        plugin.stop()
    assert os.listdir(os.path.join(sockdir, "plugins_registry")) == []
