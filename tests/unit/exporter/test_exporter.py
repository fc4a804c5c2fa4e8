# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""gpu-exporter on simulated nodes: readings, exposition (checked by promtool), pod labels, failures."""

from __future__ import annotations

import os
import sys

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.agents.gpu_exporter import Exporter, timeouts
from ansible_collections.metax.gpu.plugins.module_utils.exporter.collect import JSON_RETRY_READINGS, NodeReader
from ansible_collections.metax.gpu.plugins.module_utils.exporter.mx_families import MX_FAMILIES
from ansible_collections.metax.gpu.plugins.module_utils.health.eid import EidTracker
from ansible_collections.metax.gpu.plugins.module_utils.exporter.readings import MIB
from ansible_collections.metax.gpu.plugins.module_utils.exporter.render import DEVICE_METRICS, EXPORTER_METRICS
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from exposition import promtool_check_mx, samples, series  # noqa: E402

FIXED_TIME = "1790000000"


@pytest.fixture(autouse=True)
def fixed_time(monkeypatch):
    """The simulated mx-smi's readings are a function of the seed and this time."""
    monkeypatch.setenv("METAX_SIM_TIME", FIXED_TIME)


def with_vfs(host, bdf, count):
    host.write_attribute("sys/bus/pci/devices/%s/sriov_numvfs" % bdf, str(count))


def scrape(reader, node="node-a"):
    exporter = Exporter(reader, node, interval=60.0, wait=30.0)
    return exporter.exposition().decode()


def test_every_reading_of_a_loaded_gpu_in_base_units(make_node):
    host = make_node("8xC500")
    state = generator.load_state(host)
    busy, idle = state["gpus"][2]["bdf"], state["gpus"][5]["bdf"]
    generator.set_load(host, busy, 0.9, processes=2)
    text = scrape(NodeReader(host, timeout=60.0))
    util = series(text, "metax_gpu_utilization_ratio")
    assert len(util) == 8
    assert 0.7 <= util[busy] <= 0.9 and util[idle] < 0.05
    assert series(text, "metax_gpu_processes")[busy] == 2 and series(text, "metax_gpu_processes")[idle] == 0
    used, total = series(text, "metax_gpu_memory_used_bytes"), series(text, "metax_gpu_memory_total_bytes")
    assert total[busy] == 64 * 1024 * MIB and used[busy] > used[idle] > 0
    assert used[busy] % MIB == 0      # the table's MiB, converted to bytes
    temp, power = series(text, "metax_gpu_temperature_celsius"), series(text, "metax_gpu_power_watts")
    assert temp[busy] > temp[idle] and power[busy] > power[idle]
    assert series(text, "metax_gpu_power_limit_watts")[busy] == 350
    assert set(series(text, "metax_gpu_healthy").values()) == {1.0}
    # labels: index, UUID and product from discovery
    labels = next(lab for name, lab, _v in samples(text) if name == "metax_gpu_healthy" and lab["bdf"] == busy)
    assert labels == {"node": "node-a", "gpu": "2", "uuid": state["gpus"][2]["uuid"], "bdf": busy,
                      "product": "MXC500", "function": "pf"}
    assert series(text, "metax_gpu_exporter_mx_smi_up") == {"": 1.0}
    assert series(text, "metax_gpu_exporter_mx_smi_runs_total", command="json", result="ok") == {"": 1.0}
    assert series(text, "metax_gpu_exporter_mx_smi_runs_total", command="table", result="ok") == {"": 1.0}


def test_promtool_accepts_the_exposition(make_node):
    """A node with VFs, an allocated device, a failed GPU: every family present, promtool clean."""
    host = make_node("2xC550-sriov")
    pf0, pf1 = [g["bdf"] for g in generator.load_state(host)["gpus"]]
    with_vfs(host, pf0, 4)
    vf = generator.device_bdfs(host)[1]
    generator.set_load(host, vf, 0.5)
    generator.fail_gpu(host, 1, "smi")
    reader = NodeReader(host, timeout=60.0, allocations=lambda: {vf: ("team-a", "train-0", "main")},
                        eids=EidTracker(host.path))
    text = scrape(reader)
    ok, output = promtool_check_mx(text)
    assert ok, output
    names = {name for name, _l, _v in samples(text)}
    assert {m.name for m in DEVICE_METRICS} <= names
    assert {m.name for m in EXPORTER_METRICS} <= names
    assert {m.name for m in MX_FAMILIES} <= names
    for name, _labels, _value in samples(text):
        assert name.startswith("metax_gpu_") or name in {m.name for m in MX_FAMILIES}


def test_vfs_pod_labels_and_health(make_node):
    host = make_node("2xC550-sriov")
    pf0, pf1 = [g["bdf"] for g in generator.load_state(host)["gpus"]]
    with_vfs(host, pf0, 4)
    vfs = [b for b in generator.device_bdfs(host) if b not in (pf0, pf1)]
    generator.set_load(host, vfs[1], 0.6)
    generator.fail_gpu(host, 1, "smi")
    reader = NodeReader(host, timeout=60.0, allocations=lambda: {vfs[1]: ("team-a", "train-0", "main")})
    text = scrape(reader)
    healthy = series(text, "metax_gpu_healthy")
    assert healthy == {pf0: 1.0, **{v: 1.0 for v in vfs}, pf1: 0.0}
    owned = [lab for name, lab, v in samples(text) if name == "metax_gpu_allocated" and v == 1.0]
    assert owned == [{"node": "node-a", "gpu": "0", "uuid": "", "bdf": vfs[1], "product": "MXC550",
                      "function": "vf", "namespace": "team-a", "pod": "train-0", "container": "main"}]
    # the pod's utilisation is found by its pod label (what a PromQL query does)
    by_pod = series(text, "metax_gpu_utilization_ratio", pod="train-0")
    assert list(by_pod) == [vfs[1]] and by_pod[vfs[1]] >= 0.45
    others = series(text, "metax_gpu_utilization_ratio", function="vf")
    assert all(value < 0.05 for bdf, value in others.items() if bdf != vfs[1])
    # a PF with VFs is as busy as its VFs on average
    util = series(text, "metax_gpu_utilization_ratio")
    assert util[pf0] == pytest.approx(sum(util[v] for v in vfs) / len(vfs), abs=0.011)


def test_pod_labels_from_the_kubelets_pod_resources_api(make_node, tmp_path):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "deviceplugin"))
    from kubelet_peer import PodResourcesPeer
    from ansible_collections.metax.gpu.plugins.module_utils.agents.gpu_exporter import pod_resources_reader

    host = make_node("1xC500")
    bdf = generator.load_state(host)["gpus"][0]["bdf"]
    socket_path = str(tmp_path / "pod-resources.sock")
    peer = PodResourcesPeer(socket_path)
    peer.assignments = [("ml", "infer-7", "server", "metax-tech.com/gpu", [bdf]),
                        ("ml", "other", "c", "example.com/fpga", ["x"])]
    peer.start()
    try:
        reader = NodeReader(host, timeout=60.0, allocations=pod_resources_reader(socket_path, "metax-tech.com/gpu"))
        text = scrape(reader)
    finally:
        peer.stop()
    assert series(text, "metax_gpu_allocated", namespace="ml", pod="infer-7", container="server") == {bdf: 1.0}
    assert series(text, "metax_gpu_exporter_pod_resources_up") == {"": 1.0}
    # the kubelet gone: no pod labels, a metric says why, the GPU readings stay
    text = scrape(reader)
    assert series(text, "metax_gpu_exporter_pod_resources_up") == {"": 0.0}
    assert series(text, "metax_gpu_allocated") == {bdf: 0.0}
    assert len(series(text, "metax_gpu_utilization_ratio")) == 1


def test_simulated_readings_are_reproducible_and_change_over_time(make_node, monkeypatch):
    host = make_node("4xN100")
    generator.set_load(host, generator.device_bdfs(host)[0], 0.5)
    first = scrape(NodeReader(host, timeout=60.0))
    again = scrape(NodeReader(host, timeout=60.0))
    keep = ("metax_gpu_utilization_ratio", "metax_gpu_temperature_celsius", "metax_gpu_power_watts",
            "metax_gpu_memory_used_bytes")

    def pick(text):
        return [s for s in samples(text) if s[0] in keep]

    assert pick(first) == pick(again)
    monkeypatch.setenv("METAX_SIM_TIME", str(int(FIXED_TIME) + 75))
    later = scrape(NodeReader(host, timeout=60.0))
    assert pick(later) != pick(first)
    assert [(n, l) for n, l, _v in pick(later)] == [(n, l) for n, l, _v in pick(first)]


def test_old_mx_smi_without_json_reads_the_table(make_node):
    host = make_node("8xC500")
    generator.set_mx_smi_version(host, "2.2.9")
    generator.set_load(host, generator.device_bdfs(host)[0], 0.8)
    reader = NodeReader(host, timeout=60.0)
    text = scrape(reader)
    assert series(text, "metax_gpu_exporter_mx_smi_up") == {"": 1.0}
    assert series(text, "metax_gpu_exporter_mx_smi_runs_total", command="json", result="error") == {"": 1.0}
    util = series(text, "metax_gpu_utilization_ratio")
    assert len(util) == 8 and util[generator.device_bdfs(host)[0]] >= 0.6
    assert len(series(text, "metax_gpu_temperature_celsius")) == 8
    # -j is not tried again on every reading
    for _reading in range(3):
        reader.read()
    assert reader.runs.snapshot()[("json", "error")] == 1
    assert reader.runs.snapshot()[("table", "ok")] == 4
    assert JSON_RETRY_READINGS > 3


def test_legacy_layout_reads_the_same_values(make_node):
    host = make_node("1xC500")
    bdf = generator.device_bdfs(host)[0]
    generator.set_load(host, bdf, 0.8)
    generator.set_mx_smi_version(host, "2.1.6")
    real = scrape(NodeReader(host, timeout=60.0))
    generator.set_mx_smi_layout(host, "legacy")
    legacy = scrape(NodeReader(host, timeout=60.0))
    for name in ("metax_gpu_utilization_ratio", "metax_gpu_memory_used_bytes", "metax_gpu_power_watts"):
        assert series(real, name) == series(legacy, name)


def _replace_mx_smi(host, body):
    path = host.join(generator.MX_SMI_PATH)
    with open(path, "w") as handle:
        handle.write("#!/bin/sh\n" + body + "\n")
    os.chmod(path, 0o755)


def test_failing_mx_smi_is_a_metric_and_a_problem(make_node, caplog):
    host = make_node("8xC500")
    reader = NodeReader(host, timeout=60.0)
    reader.read()                       # discovery while mx-smi still works
    _replace_mx_smi(host, "echo 'mx-smi: failed to initialize MetaX management library' >&2; exit 9")
    with caplog.at_level("WARNING", logger="gpu-exporter.collect"):
        text = scrape(reader)
    assert series(text, "metax_gpu_exporter_mx_smi_up") == {"": 0.0}
    assert series(text, "metax_gpu_exporter_mx_smi_runs_total", command="table", result="error") == {"": 1.0}
    assert series(text, "metax_gpu_exporter_problems")[""] >= 1
    assert "exited 9: mx-smi: failed to initialize" in caplog.text
    # no readings invented; health from sysfs and the driver
    assert series(text, "metax_gpu_utilization_ratio") == {}
    assert set(series(text, "metax_gpu_healthy").values()) == {1.0}
    ok, output = promtool_check_mx(text)
    assert ok, output


def test_hung_mx_smi_ends_at_the_timeout(make_node):
    host = make_node("1xC500")
    reader = NodeReader(host, timeout=60.0)
    reader.read()
    _replace_mx_smi(host, "exec sleep 30")
    reader.timeout = 0.5
    reading = reader.read()
    assert not reading.mx_smi_ok
    assert any("timed out" in p for p in reading.problems)
    runs = reader.runs.snapshot()
    assert runs[("json", "timeout")] + runs[("table", "timeout")] >= 1
    assert reading.duration_seconds < 20     # the budget, not mx-smi, ended the reading


def test_unhealthy_when_mx_smi_no_longer_lists_a_gpu(make_node):
    host = make_node("4xN100")
    reader = NodeReader(host, timeout=60.0)
    reader.read()
    bdf = generator.device_bdfs(host)[3]
    generator.fail_gpu(host, 3, "smi")
    assert series(scrape(reader), "metax_gpu_healthy")[bdf] == 0.0
    generator.recover_gpu(host, 3)
    generator.fail_gpu(host, 3, "bus")     # gone from PCI: rediscovered, no series left for it
    text = scrape(reader)
    assert bdf not in series(text, "metax_gpu_healthy") and len(series(text, "metax_gpu_healthy")) == 3
    assert reader.discoveries == 2


def test_default_timeouts_stay_inside_the_interval():
    assert timeouts(15.0, None, None) == (7.5, 8.5)
    assert timeouts(60.0, None, None) == (10.0, 10.0)
    assert timeouts(15.0, 3.0, 1.0) == (3.0, 1.0)
    assert timeouts(1.0, None, None) == (5.0, 6.0)     # a short interval still lets mx-smi finish


def test_discovery_without_mx_smi_is_repeated_until_it_answers(make_node):
    from ansible_collections.metax.gpu.plugins.module_utils.exporter.collect import REDISCOVER_READINGS

    host = make_node("1xC500")
    path = host.join(generator.MX_SMI_PATH)
    os.rename(path, path + ".away")
    reader = NodeReader(host, timeout=60.0)
    first = reader.read()
    assert first.devices[0].uuid == "" and not first.mx_smi_ok
    assert any("mx-smi not found" in p for p in first.problems)
    os.rename(path + ".away", path)
    for _reading in range(REDISCOVER_READINGS - 1):
        reading = reader.read()
    assert reader.discoveries == 1 and reading.mx_smi_ok
    reading = reader.read()
    assert reader.discoveries == 2
    assert reading.devices[0].uuid == generator.load_state(host)["gpus"][0]["uuid"]
