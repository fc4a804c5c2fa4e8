"""vfio-manager's metax-tech.com/vfio-gpu plugin over the wire, against a kubelet peer (issue 43)."""
from __future__ import annotations

import os
import threading
import time

import polling
from kubelet_peer import pb

from ansible_collections.metax.gpu.plugins.module_utils import names
from ansible_collections.metax.gpu.plugins.module_utils.agents.vfio_manager import Registration, VfioManager, run
from ansible_collections.metax.gpu.plugins.module_utils.deviceplugin.server import PluginServer
from ansible_collections.metax.gpu.plugins.module_utils.deviceplugin.vfio import GroupState, VfioPluginService
from ansible_collections.metax.gpu.plugins.module_utils.vfio import backend


class Api:
    def __init__(self, entry_text=""):
        self.data = {names.DRIVER_CONFIG_VFIO_KEY: entry_text} if entry_text else {}
        self.events = []

    def config(self):
        return self.data

    def annotate(self, annotations):
        pass

    def event(self, reason, message, warning=True):
        self.events.append(reason)


def _running(host, sockdir, api):
    groups = GroupState(host)
    manager = VfioManager(host, api, "vm", holders=lambda: {}, groups=groups)
    directory = os.path.join(sockdir, "device-plugins")
    registration = Registration(PluginServer(VfioPluginService(groups, host), directory), directory,
                                names.VFIO_RESOURCE_NAME)
    stop = threading.Event()
    thread = threading.Thread(target=run, args=(manager, groups, registration, stop, 0.2), daemon=True)
    thread.start()
    return stop, thread


def test_registers_vfio_gpu_and_serves_groups_and_allocate(make_node, kubelet, sockdir):
    host = make_node("8xC500")
    api = Api("- nodeName: vm\n  gpus: \"6,7\"\n")
    stop, thread = _running(host, sockdir, api)
    try:
        _when, request = kubelet.wait_for_registration()
        assert request.resource_name == "metax-tech.com/vfio-gpu"
        assert kubelet.options.get_preferred_allocation_available is False
        devices = kubelet.wait_for_devices(lambda d: len(d) == 2, timeout=30)[1]
        assert [(d[0], d[1], d[2]) for d in devices] == [("6", "Healthy", [1]), ("7", "Healthy", [1])]
        response = kubelet.stub.Allocate(pb.AllocateRequest(container_requests=[
            pb.ContainerAllocateRequest(devices_ids=["7"])]), timeout=60)
        cresp = response.container_responses[0]
        assert [d.container_path for d in cresp.devices] == ["/dev/vfio/vfio", "/dev/vfio/7"]
        assert dict(cresp.envs) == {"PCI_RESOURCE_METAX-TECH_COM_VFIO-GPU": backend.read_node(host).gpus[7].bdf}
        # the entry removed: the GPUs go back and the list empties
        seen = len(kubelet.updates)
        api.data = {}
        deadline = time.monotonic() + 30
        while [g.driver for g in backend.read_node(host).gpus] != ["metax"] * 8 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert [g.driver for g in backend.read_node(host).gpus] == ["metax"] * 8
        kubelet.wait_for_devices(lambda d: d == [] and len(kubelet.updates) > seen)
    finally:
        stop.set()
        thread.join(10)


def test_no_iommu_registers_zero_devices_and_keeps_running(make_node, kubelet, sockdir):
    host = make_node("8xC500-noiommu")
    api = Api("- nodeName: vm\n  gpus: all\n")
    stop, thread = _running(host, sockdir, api)
    try:
        kubelet.wait_for_registration()
        assert kubelet.wait_for_devices(lambda d: d == [])[1] == []
        # the event comes from the round after the registration: polled, then a second more (it stays one)
        polling.wait_until(lambda: api.events, 60, "the IOMMUDisabled event", interval=0.05)
        stop.wait(1.0)
        assert thread.is_alive() and api.events == ["IOMMUDisabled"]
    finally:
        stop.set()
        thread.join(10)
