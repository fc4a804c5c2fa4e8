# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The one PluginService under gpu-device's and vfio-manager's DevicePlugin services: options, the
ListAndWatch stream over a versioned state, stop and resume (the wire: test_dp_protocol.py and
test_dp_vfio_protocol.py)."""
from __future__ import annotations

import threading
import time

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.deviceplugin.devices import DeviceState
from ansible_collections.metax.gpu.plugins.module_utils.deviceplugin.server import DevicePluginService, PluginService
from ansible_collections.metax.gpu.plugins.module_utils.deviceplugin.vfio import GroupState, VfioPluginService
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator


class Context:
    """What ListAndWatch asks of gRPC's context: whether the kubelet still listens."""

    def __init__(self) -> None:
        self.active = True

    def is_active(self) -> bool:
        return self.active


def services(host):
    gpus, groups = DeviceState(host), GroupState(host)
    gpus.refresh()
    groups.refresh()
    return DevicePluginService(gpus, host), VfioPluginService(groups, host)


def test_both_services_are_plugin_services_with_their_own_options(make_node):
    device, vfio = services(make_node("8xC500"))
    assert isinstance(device, PluginService) and isinstance(vfio, PluginService)
    assert device.GetDevicePluginOptions(None, None).get_preferred_allocation_available is True
    assert vfio.GetDevicePluginOptions(None, None).get_preferred_allocation_available is False
    for service in (device, vfio):
        assert service.GetDevicePluginOptions(None, None).pre_start_required is False
        assert service.PreStartContainer(None, None).ByteSize() == 0


def drain(stream, into):
    for response in stream:
        into.append([d.ID for d in response.devices])


@pytest.mark.parametrize("which", ["gpu-device", "vfio-manager"])
def test_stop_ends_the_stream_and_resume_accepts_a_new_one(make_node, which):
    device, vfio = services(make_node("8xC500"))
    service = device if which == "gpu-device" else vfio
    for _round in range(2):                       # the second: after resume, as a restarted server
        seen = []
        thread = threading.Thread(target=drain, args=(service.ListAndWatch(None, Context()), seen), daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while not seen and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(seen) == 1 and len(seen[0]) == (8 if service is device else 0)   # no GPU with VMs
        service.stop()
        thread.join(60)
        assert not thread.is_alive()
        service.resume()
    assert device.streams == 0


def test_a_change_is_sent_and_a_gone_kubelet_ends_the_stream(make_node):
    host = make_node("8xC500")
    device, _vfio = services(host)
    context, seen = Context(), []
    thread = threading.Thread(target=drain, args=(device.ListAndWatch(None, context), seen), daemon=True)
    thread.start()
    generator.fail_gpu(host, 3, "bus")
    device.state.refresh()
    deadline = time.monotonic() + 30
    while len(seen) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(seen) == 2 and len(seen[1]) == 8      # the gone GPU stays listed (Unhealthy)
    assert device.streams == 1
    context.active = False                          # the kubelet went away: the stream ends at its next poll
    thread.join(60)
    assert not thread.is_alive() and device.streams == 0
