# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The CDI spec of simulated nodes, checked with the CDI library's own validator (cdi-validate)."""

from __future__ import annotations

import json
import os

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.cdi import spec as cdi_spec
from ansible_collections.metax.gpu.plugins.module_utils.cdi import writer
from ansible_collections.metax.gpu.plugins.module_utils.gpu.discovery import discover
from ansible_collections.metax.gpu.plugins.module_utils.host import HostRoot
from ansible_collections.metax.gpu.plugins.module_utils.names import CDI_SPEC_FILE
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator
from ansible_collections.metax.gpu.plugins.module_utils.sim.maca import activate_maca, install_maca

from .cdi_tools import CDI_VALIDATE, inject, needs_validator, validate

KIND = "metax-tech.com/gpu"


def node_with_maca(make_node, preset="8xC500", version="3.0.0.8"):
    host = make_node(preset)
    install_maca(host, version)
    return host


def refreshed(host, tmp_path):
    result = writer.refresh(host, str(tmp_path / "cdi"))
    return result, json.loads(open(result.path).read()) if result.spec else None


def by_name(spec):
    return {d["name"]: d["containerEdits"] for d in spec["devices"]}


def test_one_device_per_gpu_by_index_uuid_and_serial_plus_all(make_node, tmp_path):
    host = node_with_maca(make_node)
    state = generator.load_state(host)
    result, spec = refreshed(host, tmp_path)
    assert result.changed and result.warnings == [] and spec["kind"] == KIND
    names = by_name(spec)
    assert len(spec["devices"]) == 8 * 3 + 1 and "all" in names
    for index, gpu in enumerate(state["gpus"]):
        nodes = [host.join("dev/dri/card%d" % index), host.join("dev/dri/renderD%d" % (128 + index))]
        for name in (str(index), gpu["uuid"], gpu["serial"]):
            assert [n["hostPath"] for n in names[name]["deviceNodes"]] == nodes
            paths = ["/dev/dri/card%d" % index, "/dev/dri/renderD%d" % (128 + index)]
            assert [n["path"] for n in names[name]["deviceNodes"]] == paths
    assert len(names["all"]["deviceNodes"]) == 16
    common = spec["containerEdits"]
    assert common["deviceNodes"] == [{"path": "/dev/mxcd", "hostPath": host.join("dev/mxcd")}]
    assert common["mounts"] == [{"hostPath": host.join("opt/maca-3.0.0.8"), "containerPath": "/opt/maca",
                                 "options": ["ro", "nosuid", "nodev", "bind"]}]
    assert common["env"] == ["MACA_PATH=/opt/maca", "LD_LIBRARY_PATH=/opt/maca/lib:/opt/maca/mxgpu_llvm/lib"]
    # digit-first names and hostPath both need 0.5.0, the most podman 4.3 reads
    assert spec["cdiVersion"] == "0.5.0"


@needs_validator
@pytest.mark.parametrize("preset", ["8xC500", "4xN100", "2xC550-sriov"])
def test_the_cdi_library_accepts_the_spec_at_its_minimum_version(make_node, tmp_path, preset):
    host = node_with_maca(make_node, preset)
    if preset == "2xC550-sriov":
        for sysfs in generator.gpu_sysfs_dirs(host).values():
            host.write_attribute(sysfs + "/sriov_numvfs", "4")
    result, spec = refreshed(host, tmp_path)
    (checked,) = validate(result.path)
    assert checked["valid"], checked["error"]
    assert checked["cdiVersion"] == checked["minimumVersion"] == spec["cdiVersion"] == "0.5.0"
    assert sorted(checked["devices"]) == sorted(cdi_spec.device_names(spec))


@needs_validator
def test_the_library_injects_exactly_the_named_device_with_maca(make_node, tmp_path):
    host = node_with_maca(make_node)
    gpu3 = generator.load_state(host)["gpus"][3]
    result, _spec = refreshed(host, tmp_path)
    for name in (gpu3["uuid"], gpu3["serial"], "3"):
        edits = inject(os.path.dirname(result.path), "%s=%s" % (KIND, name))
        assert sorted(d["path"] for d in edits["devices"]) == ["/dev/dri/card3", "/dev/dri/renderD131", "/dev/mxcd"]
        assert {d["path"]: d["major"] for d in edits["devices"]}["/dev/dri/card3"] == 226
        assert [(m["source"], m["destination"]) for m in edits["mounts"]] == [
            (host.join("opt/maca-3.0.0.8"), "/opt/maca")]
        assert "MACA_PATH=/opt/maca" in edits["env"]
    edits = inject(os.path.dirname(result.path), KIND + "=all")
    assert len(edits["devices"]) == 17


def test_vfs_are_named_by_index_only(make_node, tmp_path):
    host = node_with_maca(make_node, "2xC550-sriov")
    for sysfs in generator.gpu_sysfs_dirs(host).values():
        host.write_attribute(sysfs + "/sriov_numvfs", "2")
    inventory = discover(host, topology=False)
    devices, skipped = cdi_spec.devices_of(inventory)
    assert skipped == [] and [d.names for d in devices] == [("0",), ("1",), ("2",), ("3",)]
    assert [d.bdf for d in devices] == [d.bdf for d in inventory.devices]


@pytest.mark.parametrize("content, version", [
    ({"devices": [{"name": "gpu0", "containerEdits": {"deviceNodes": [{"path": "/dev/x"}]}}]}, "0.3.0"),
    ({"devices": [{"name": "gpu0", "containerEdits": {"mounts": [
        {"hostPath": "/a", "containerPath": "/b", "type": "bind"}]}}]}, "0.4.0"),
    ({"devices": [{"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/x"}]}}]}, "0.5.0"),
    ({"devices": [{"name": "gpu0", "containerEdits": {"deviceNodes": [{"path": "/dev/x", "hostPath": "/y"}]}}]},
     "0.5.0"),
    ({"annotations": {"a.b/c": "d"},
      "devices": [{"name": "gpu0", "containerEdits": {"deviceNodes": [{"path": "/dev/x"}]}}]}, "0.6.0"),
])
def test_required_version_follows_the_library(tmp_path, content, version):
    spec = dict(content, kind=KIND, cdiVersion="")
    spec["cdiVersion"] = cdi_spec.required_version(spec)
    assert spec["cdiVersion"] == version
    if CDI_VALIDATE is None:      # no validator (outside CI): the table above still holds
        return
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    (checked,) = validate(str(path))
    assert checked["valid"] and checked["minimumVersion"] == version, checked


def test_a_repeated_uuid_names_no_device(make_node):
    devices = [cdi_spec.CdiDevice(0, "0000:03:00.0", "card0", "renderD128", uuid="GPU-1"),
               cdi_spec.CdiDevice(1, "0000:04:00.0", "card1", "renderD129", uuid="GPU-1")]
    with pytest.raises(cdi_spec.CdiSpecError, match="devices 0 and 1 are both named 'GPU-1'"):
        cdi_spec.build_spec(devices, None)
    # names CDI would refuse are not used; the index always is
    assert cdi_spec.CdiDevice(0, "x", "card0", "renderD128", uuid="GPU 1", serial="all").names == ("0",)


def test_without_maca_there_is_no_mount_and_a_warning(make_node, tmp_path):
    host = make_node("1xC500")
    result, spec = refreshed(host, tmp_path)
    assert "mounts" not in spec["containerEdits"] and "env" not in spec["containerEdits"]
    assert any("no MXMACA at" in w for w in result.warnings)


def test_a_real_root_has_no_host_paths(make_node):
    devices = [cdi_spec.CdiDevice(0, "0000:03:00.0", "card0", "renderD128", uuid="GPU-1")]
    spec = cdi_spec.build_spec(devices, cdi_spec.Maca("/opt/maca-3", ("lib",)))
    assert all("hostPath" not in n for n in spec["containerEdits"]["deviceNodes"])
    assert spec["containerEdits"]["env"] == ["MACA_PATH=/opt/maca", "LD_LIBRARY_PATH=/opt/maca/lib"]
    # still 0.5.0: the index names start with a digit
    assert spec["cdiVersion"] == "0.5.0"


# -- the spec is never stale ---------------------------------------------------------------
def test_unchanged_node_is_not_rewritten(make_node, tmp_path):
    host = node_with_maca(make_node)
    first = writer.refresh(host, str(tmp_path / "cdi"))
    inode = os.stat(first.path).st_ino
    again = writer.refresh(host, str(tmp_path / "cdi"))
    assert first.changed and not again.changed and os.stat(again.path).st_ino == inode
    assert os.listdir(os.path.dirname(first.path)) == [CDI_SPEC_FILE]


def test_vf_count_change_gpu_failure_and_maca_switch_rewrite_it(make_node, tmp_path):
    host = node_with_maca(make_node, "2xC550-sriov")
    _result, before = refreshed(host, tmp_path)
    assert len(before["devices"]) == 2 * 3 + 1
    pf0 = sorted(generator.gpu_sysfs_dirs(host).values())[0]
    host.write_attribute(pf0 + "/sriov_numvfs", "4")
    result, spec = refreshed(host, tmp_path)
    # GPU 0 is now four VFs (by index only), GPU 1 still whole (three names)
    assert result.changed and [d["name"] for d in spec["devices"]][:4] == ["0", "1", "2", "3"]
    assert len(spec["devices"]) == 4 + 3 + 1
    generator.fail_gpu(host, 1, mode="smi")
    result, spec = refreshed(host, tmp_path)
    assert result.changed and [d["name"] for d in spec["devices"]] == ["0", "1", "2", "3", "all"]
    generator.fail_gpu(host, 0, mode="bus")
    # no usable device left: the spec goes (one without devices is invalid)
    result, spec = refreshed(host, tmp_path)
    assert result.changed and spec is None and not os.path.exists(result.path)
    generator.recover_gpu(host, 0)
    generator.recover_gpu(host, 1)
    install_maca(host, "3.1.0.2", activate=False)
    result, spec = refreshed(host, tmp_path)
    assert result.changed and spec["containerEdits"]["mounts"][0]["hostPath"].endswith("/opt/maca-3.0.0.8")
    activate_maca(host, "3.1.0.2")
    result, spec = refreshed(host, tmp_path)
    assert result.changed and spec["containerEdits"]["mounts"][0]["hostPath"].endswith("/opt/maca-3.1.0.2")


def test_an_interrupted_write_leaves_the_old_spec(tmp_path, monkeypatch):
    path = str(tmp_path / "cdi" / CDI_SPEC_FILE)
    assert writer.write_if_changed(path, b"old\n")

    def fail(*_args):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        writer.write_if_changed(path, b"new\n")
    assert open(path, "rb").read() == b"old\n" and os.listdir(os.path.dirname(path)) == [CDI_SPEC_FILE]


def test_an_agent_view_writes_host_paths(make_node, tmp_path):
    node = node_with_maca(make_node)
    # an agent that sees the node under a mount of its own writes paths the runtime can use
    seen = HostRoot(node.path, host_prefix="/var/lib/metax-sim/root")
    _result, spec = refreshed(seen, tmp_path)
    assert spec["containerEdits"]["mounts"][0]["hostPath"] == "/var/lib/metax-sim/root/opt/maca-3.0.0.8"
    assert by_name(spec)["0"]["deviceNodes"][0]["hostPath"] == "/var/lib/metax-sim/root/dev/dri/card0"
