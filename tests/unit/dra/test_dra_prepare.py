# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""gpu-dra's Prepare/Unprepare: one CDI spec per claim, checkpointed, idempotent.

The claims are what the API server returns for an allocated ResourceClaim
(dicts); the node is a simulated one read by the real discovery; the specs are
resolved by the CDI library itself (cdi-validate) where it is built.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.cdi.writer import host_maca
from ansible_collections.metax.gpu.plugins.module_utils.dra import prepare as P
from ansible_collections.metax.gpu.plugins.module_utils.dra.slices import device_name
from ansible_collections.metax.gpu.plugins.module_utils.gpu.discovery import discover
from ansible_collections.metax.gpu.plugins.module_utils.names import DRA_DRIVER
from ansible_collections.metax.gpu.plugins.module_utils.sim.maca import install_maca

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cdi"))
from cdi_tools import inject, needs_validator  # noqa: E402  pylint: disable=wrong-import-position

POOL = "node-a"


def claim(uid, devices, name="c", namespace="ns", driver=DRA_DRIVER, pool=POOL, allocated=True):
    obj = {"metadata": {"name": name, "namespace": namespace, "uid": uid}, "status": {}}
    if allocated:
        obj["status"]["allocation"] = {"devices": {"results": [
            {"request": req, "driver": driver, "pool": pool, "device": dev} for req, dev in devices]}}
    return obj


class Api:
    """The claims the API server holds, by (namespace, name); counts the reads."""

    def __init__(self):
        self.claims = {}
        self.reads = 0

    def put(self, obj):
        self.claims[(obj["metadata"]["namespace"], obj["metadata"]["name"])] = obj

    def get(self, namespace, name):
        self.reads += 1
        try:
            return self.claims[(namespace, name)]
        except KeyError:
            raise P.ClaimError("resourceclaim %s/%s not found" % (namespace, name))


@pytest.fixture
def node(make_node, tmp_path):
    host = make_node("8xC500")
    install_maca(host, "3.0.0.8")
    inv = discover(host)
    names = [device_name(d.id) for d in inv.devices]
    api = Api()
    dirs = {"plugin": str(tmp_path / "plugin"), "cdi": str(tmp_path / "cdi")}

    def preparer():
        return P.Preparer(POOL, dirs["plugin"], dirs["cdi"], api.get, lambda: P.cdi_devices(discover(host, False)),
                          lambda: host_maca(host), host.host_path)
    return host, names, api, dirs, preparer


def spec_files(dirs):
    return sorted(os.listdir(dirs["cdi"])) if os.path.isdir(dirs["cdi"]) else []


@needs_validator
def test_prepare_writes_one_spec_with_exactly_the_claims_devices_and_maca(node):
    host, names, api, dirs, preparer = node
    api.put(claim("uid-1", [("gpus", names[2]), ("gpus", names[5])]))
    outcome = preparer().prepare(P.ClaimRef("ns", "uid-1", "c"))
    assert outcome.error == ""
    assert [(d.device_name, d.request_names, d.pool_name) for d in outcome.devices] == [
        (names[2], ["gpus"], POOL), (names[5], ["gpus"], POOL)]
    ids = [i for d in outcome.devices for i in d.cdi_device_ids]
    assert ids == ["metax-tech.com/gpu=uid-1-%s" % names[2], "metax-tech.com/gpu=uid-1-%s" % names[5]]
    assert spec_files(dirs) == ["metax-tech.com-gpu-claim-uid-1.json"]
    edits = inject(dirs["cdi"], *ids)
    assert sorted(d["path"] for d in edits["devices"]) == [
        "/dev/dri/card2", "/dev/dri/card5", "/dev/dri/renderD130", "/dev/dri/renderD133", "/dev/mxcd"]
    assert [(m["source"], m["destination"]) for m in edits["mounts"]] == [(host.join("opt/maca-3.0.0.8"), "/opt/maca")]
    assert "MACA_PATH=/opt/maca" in edits["env"]


def test_prepare_is_idempotent_and_survives_a_restart(node):
    _host, names, api, dirs, preparer = node
    api.put(claim("uid-1", [("gpu", names[0])]))
    first = preparer()
    ref = P.ClaimRef("ns", "uid-1", "c")
    a = first.prepare(ref)
    b = first.prepare(ref)                  # the kubelet's retry: answered from the checkpoint
    assert a == b and api.reads == 1
    # a restarted plugin: the checkpoint knows the claim, even when the API server does not any more
    api.claims.clear()
    again = preparer()
    assert set(again.prepared) == {"uid-1"}
    assert again.prepare(ref) == a and api.reads == 1
    # its spec went missing (a tmpfs /var/run/cdi after a node reboot): written again
    os.unlink(os.path.join(dirs["cdi"], spec_files(dirs)[0]))
    assert again.prepare(ref) == a and spec_files(dirs) == ["metax-tech.com-gpu-claim-uid-1.json"]
    with open(os.path.join(dirs["plugin"], P.CHECKPOINT_FILE)) as handle:
        saved = json.load(handle)
    assert saved["version"] == 1 and list(saved["claims"]) == ["uid-1"]
    assert [n for n in os.listdir(dirs["plugin"]) if n.startswith(".metax-tmp")] == []


def test_unprepare_removes_exactly_that_claims_spec(node):
    _host, names, api, dirs, preparer = node
    api.put(claim("uid-1", [("gpu", names[0])], name="one"))
    api.put(claim("uid-2", [("gpu", names[1])], name="two"))
    prep = preparer()
    one, two = P.ClaimRef("ns", "uid-1", "one"), P.ClaimRef("ns", "uid-2", "two")
    assert not prep.prepare(one).error and not prep.prepare(two).error
    assert len(spec_files(dirs)) == 2
    assert prep.unprepare(one) == ""
    assert spec_files(dirs) == ["metax-tech.com-gpu-claim-uid-2.json"]
    assert set(prep.prepared) == {"uid-2"} and set(preparer().prepared) == {"uid-2"}
    # repeated, and of a claim never prepared: nothing to undo, no error
    assert prep.unprepare(one) == "" and prep.unprepare(P.ClaimRef("ns", "uid-9", "x")) == ""
    assert spec_files(dirs) == ["metax-tech.com-gpu-claim-uid-2.json"]


def test_unprepare_removes_a_spec_the_checkpoint_missed(node):
    """A crash after the spec was written but before the checkpoint: Unprepare still cleans up."""
    _host, names, api, dirs, preparer = node
    api.put(claim("uid-1", [("gpu", names[0])]))
    prep = preparer()
    assert not prep.prepare(P.ClaimRef("ns", "uid-1", "c")).error
    os.unlink(prep.checkpoint.path)
    fresh = preparer()
    assert fresh.prepared == {}
    assert fresh.unprepare(P.ClaimRef("ns", "uid-1", "c")) == "" and spec_files(dirs) == []


def test_stale_and_wrong_requests_are_refused_with_the_reason(node):
    _host, names, api, dirs, preparer = node
    prep = preparer()
    # the claim was deleted and made again under the same name: the old UID is stale
    api.put(claim("uid-new", [("gpu", names[0])]))
    out = prep.prepare(P.ClaimRef("ns", "uid-old", "c"))
    assert "stale" in out.error and not out.devices
    assert "not found" in prep.prepare(P.ClaimRef("ns", "uid-x", "missing")).error
    api.put(claim("uid-3", [], name="pending", allocated=False))
    assert "not allocated" in prep.prepare(P.ClaimRef("ns", "uid-3", "pending")).error
    api.put(claim("uid-4", [("gpu", names[0])], name="elsewhere", pool="node-b"))
    assert "pool node-b" in prep.prepare(P.ClaimRef("ns", "uid-4", "elsewhere")).error
    api.put(claim("uid-5", [("gpu", "gpu-0000-ff-00-0")], name="ghost"))
    assert "not on this node" in prep.prepare(P.ClaimRef("ns", "uid-5", "ghost")).error
    assert spec_files(dirs) == [] and prep.prepared == {}
    # another driver's devices only: prepared with nothing (and no spec)
    api.put(claim("uid-6", [("nic", "eth0")], name="other", driver="net.example.com"))
    out = prep.prepare(P.ClaimRef("ns", "uid-6", "other"))
    assert out.error == "" and out.devices == [] and spec_files(dirs) == []
    assert prep.unprepare(P.ClaimRef("ns", "uid-6", "other")) == ""


def test_one_device_in_two_requests_is_one_entry(node):
    _host, names, api, _dirs, preparer = node
    api.put(claim("uid-1", [("a", names[3]), ("b", names[3])]))
    out = preparer().prepare(P.ClaimRef("ns", "uid-1", "c"))
    assert [(d.device_name, d.request_names) for d in out.devices] == [(names[3], ["a", "b"])]


def test_a_corrupt_checkpoint_is_a_clear_error(tmp_path):
    plugin = tmp_path / "plugin"
    plugin.mkdir()
    (plugin / P.CHECKPOINT_FILE).write_text("{not json")
    with pytest.raises(P.CheckpointError, match="cannot read the checkpoint"):
        P.Preparer(POOL, str(plugin), str(tmp_path / "cdi"), lambda ns, n: {}, lambda: {})
    (plugin / P.CHECKPOINT_FILE).write_text('{"version": 99}')
    with pytest.raises(P.CheckpointError, match="not version 1"):
        P.Preparer(POOL, str(plugin), str(tmp_path / "cdi"), lambda ns, n: {}, lambda: {})
