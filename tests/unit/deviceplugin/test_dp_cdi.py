# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""gpu-device in CDI mode and its fallback, over the real gRPC API and the CDI library (cdi-validate).

In CDI mode Allocate hands out names, and the runtime resolves them through
the node's spec: the tests resolve them with the CDI library itself, so a
name missing from the spec fails here as it would in containerd. The
HAMi#1903 case: after a VF change a new pod's devices still resolve.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.cdi.mode import MODE_CDI, MODE_DEVICES
from ansible_collections.metax.gpu.plugins.module_utils.deviceplugin.api import deviceplugin_v1beta1_pb2 as pb
from ansible_collections.metax.gpu.plugins.module_utils.deviceplugin.cdi import SpecSync
from ansible_collections.metax.gpu.plugins.module_utils.host import HostRoot
from ansible_collections.metax.gpu.plugins.module_utils.names import CDI_SPEC_FILE
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator
from ansible_collections.metax.gpu.plugins.module_utils.sim.maca import activate_maca, install_maca

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cdi"))
from cdi_tools import inject, needs_validator  # noqa: E402  pylint: disable=wrong-import-position

KIND = "metax-tech.com/gpu"
PREFIX = "/var/lib/metax-sim/root"


def healthy(devices):
    return sorted(d[0] for d in devices if d[1] == "Healthy")


def allocate(kubelet, *ids):
    response = kubelet.stub.Allocate(pb.AllocateRequest(container_requests=[
        pb.ContainerAllocateRequest(devices_ids=list(ids))]), timeout=60)
    return response.container_responses[0]


def cdi_agent(run_agent, host, spec_dir, **kwargs):
    return run_agent(host, mode=MODE_CDI, spec_sync=SpecSync(host, str(spec_dir)), **kwargs)


def spec_names(spec_dir):
    with open(os.path.join(str(spec_dir), CDI_SPEC_FILE), encoding="utf-8") as handle:
        return ["%s=%s" % (KIND, d["name"]) for d in json.load(handle)["devices"]]


def poll(condition, agent, scans=8):
    """Whether ``condition`` holds within ``scans`` health scans of ``agent`` (not a wall-clock limit)."""
    until = agent.state.scans + scans
    while not condition():
        if agent.state.scans >= until:
            return False
        agent.stop.wait(0.2)
    return True


def index_names(spec_dir):
    return [n.split("=", 1)[1] for n in spec_names(spec_dir) if n.split("=", 1)[1].isdigit()]


@needs_validator
def test_cdi_mode_answers_with_names_that_resolve_to_exactly_the_devices(make_node, tmp_path, kubelet, run_agent):
    host = make_node("8xC500")
    install_maca(host, "3.0.0.8")
    spec_dir = tmp_path / "cdi"
    with cdi_agent(run_agent, host, spec_dir):
        _seen, devices = kubelet.wait_for_devices(lambda ds: len(healthy(ds)) == 8)
        ids = sorted(d[0] for d in devices)
        cresp = allocate(kubelet, ids[5], ids[2])
    assert [c.name for c in cresp.cdi_devices] == [KIND + "=2", KIND + "=5"]
    # nothing besides the names: the runtime takes nodes, MACA and its environment from the spec
    assert not cresp.devices and not cresp.mounts
    assert dict(cresp.envs)["METAX_DEVICE_INDICES"] == "2,5"
    edits = inject(str(spec_dir), *[c.name for c in cresp.cdi_devices])
    assert sorted(d["path"] for d in edits["devices"]) == [
        "/dev/dri/card2", "/dev/dri/card5", "/dev/dri/renderD130", "/dev/dri/renderD133", "/dev/mxcd"]
    assert [(mt["source"], mt["destination"]) for mt in edits["mounts"]] == [
        (host.join("opt/maca-3.0.0.8"), "/opt/maca")]
    assert "MACA_PATH=/opt/maca" in edits["env"]


def test_devices_mode_carries_nodes_maca_and_its_environment(make_node, tmp_path, kubelet, run_agent):
    host = make_node("8xC500")
    install_maca(host, "3.0.0.8")
    prefixed = HostRoot(host.path, host_prefix=PREFIX)
    spec_dir = tmp_path / "cdi"
    with run_agent(prefixed, mode=MODE_DEVICES, spec_sync=SpecSync(prefixed, str(spec_dir))):
        _seen, devices = kubelet.wait_for_devices(lambda ds: len(healthy(ds)) == 8)
        cresp = allocate(kubelet, sorted(d[0] for d in devices)[1])
    assert not cresp.cdi_devices
    assert [(d.container_path, d.host_path) for d in cresp.devices] == [
        ("/dev/mxcd", PREFIX + "/dev/mxcd"), ("/dev/dri/card1", PREFIX + "/dev/dri/card1"),
        ("/dev/dri/renderD129", PREFIX + "/dev/dri/renderD129")]
    assert [(mt.container_path, mt.host_path, mt.read_only) for mt in cresp.mounts] == [
        ("/opt/maca", PREFIX + "/opt/maca-3.0.0.8", True)]
    envs = dict(cresp.envs)
    assert envs["MACA_PATH"] == "/opt/maca"
    assert envs["LD_LIBRARY_PATH"] == "/opt/maca/lib:/opt/maca/mxgpu_llvm/lib"
    # devices mode writes no spec: the runtime would not read it
    assert not os.path.exists(str(spec_dir))


@needs_validator
def test_after_a_vf_change_a_new_pod_still_starts_hami_1903(make_node, tmp_path, kubelet, run_agent):
    """The spec follows the VFs, and a name is never handed out before the spec that defines it."""
    host = make_node("2xC550-sriov")
    install_maca(host, "3.0.0.8")
    spec_dir = tmp_path / "cdi"
    # health checks every hour: only Allocate itself can bring the spec up to date below
    with cdi_agent(run_agent, host, spec_dir, healthy_interval=3600) as agent:
        kubelet.wait_for_devices(lambda ds: len(healthy(ds)) == 2)
        assert index_names(spec_dir) == ["0", "1"]
        pf0 = sorted(generator.gpu_sysfs_dirs(host).values())[0]
        host.write_attribute(pf0 + "/sriov_numvfs", "4")
        # the scan the kubelet learns the VFs from (the health loop's), without its spec write
        assert agent.state.refresh()
        _seen, devices = kubelet.wait_for_devices(lambda ds: len(healthy(ds)) == 5)
        vfs = [d for d in agent.state.snapshot().devices if d.device is not None and d.device.is_vf]
        assert len(vfs) == 4
        assert index_names(spec_dir) == ["0", "1"]        # stale until the next write
        cresp = allocate(kubelet, vfs[3].id)
        assert index_names(spec_dir) == ["0", "1", "2", "3", "4"]
        assert [c.name for c in cresp.cdi_devices] == [KIND + "=3"]
        # the spec on disk already resolves it, to the VF's own nodes
        edits = inject(str(spec_dir), KIND + "=3")
        vf = vfs[3].device
        assert sorted(d["path"] for d in edits["devices"]) == sorted(
            ["/dev/mxcd", "/dev/dri/" + vf.drm_card, "/dev/dri/" + vf.drm_render])
        # and back: VFs removed, the whole GPU is "0" again with its UUID
        host.write_attribute(pf0 + "/sriov_numvfs", "0")
        assert agent.state.refresh()
        kubelet.wait_for_devices(lambda ds: len(healthy(ds)) == 2)
        whole = [d for d in agent.state.snapshot().devices if d.device is not None and d.device.index == 0][0]
        assert [c.name for c in allocate(kubelet, whole.id).cdi_devices] == [KIND + "=0"]
        assert index_names(spec_dir) == ["0", "1"]
        inject(str(spec_dir), KIND + "=0")


def test_gpu_failure_and_maca_switch_rewrite_the_spec(make_node, tmp_path, kubelet, run_agent):
    host = make_node("4xN100")
    install_maca(host, "3.0.0.8")
    spec_dir = tmp_path / "cdi"
    path = os.path.join(str(spec_dir), CDI_SPEC_FILE)

    def maca_source():
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)["containerEdits"]["mounts"][0]["hostPath"]

    with cdi_agent(run_agent, host, spec_dir, healthy_interval=1) as agent:
        kubelet.wait_for_devices(lambda ds: len(healthy(ds)) == 4)
        assert KIND + "=2" in spec_names(spec_dir)
        generator.fail_gpu(host, 2, "smi")
        kubelet.wait_for_devices(lambda ds: len(healthy(ds)) == 3)
        agent.sync_spec()   # the health loop's write may be a moment behind the list it sent
        assert KIND + "=2" not in spec_names(spec_dir) and KIND + "=3" in spec_names(spec_dir)
        generator.recover_gpu(host, 2)
        # the peer keeps every list it got (4 healthy already matched before the failure): the newest counts
        assert poll(lambda: kubelet.latest() is not None and len(healthy(kubelet.latest())) == 4, agent)
        agent.sync_spec()
        assert KIND + "=2" in spec_names(spec_dir)
        writes = agent.spec_sync.writes
        install_maca(host, "3.1.0.2", activate=False)
        agent.sync_spec()
        assert agent.spec_sync.writes == writes and maca_source().endswith("/opt/maca-3.0.0.8")
        activate_maca(host, "3.1.0.2")
        # no device changed: the health loop's next scans (every second) notice the switch alone
        assert poll(lambda: maca_source().endswith("/opt/maca-3.1.0.2"), agent)


def test_cdi_mode_needs_a_spec_writer(make_node):
    from ansible_collections.metax.gpu.plugins.module_utils.deviceplugin.devices import DeviceState
    from ansible_collections.metax.gpu.plugins.module_utils.deviceplugin.server import DevicePluginService
    host = make_node("4xN100")
    with pytest.raises(ValueError, match="SpecSync"):
        DevicePluginService(DeviceState(host), host, mode=MODE_CDI, spec_sync=None)
