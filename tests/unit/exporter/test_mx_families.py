# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""mx-exporter's families (mx_gpu_usage, mx_memory_used{type="vram"} ...) served by gpu-exporter (issue 38).

The exposition is read back with prometheus_client's own parser, as Prometheus
would read it; values are checked against gpu-exporter's metax_gpu_* families
of the same scrape and against the real mx-smi captures.
"""

from __future__ import annotations

import os
import sys

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.exporter.collect import NodeReader
from ansible_collections.metax.gpu.plugins.module_utils.exporter.mx_families import MX_FAMILIES
from ansible_collections.metax.gpu.plugins.module_utils.health.eid import EidTracker
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator

from ansible_collections.metax.gpu.plugins.module_utils.sim import signals as sim_signals
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from exposition import series  # noqa: E402
from test_exporter import FIXED_TIME, _replace_mx_smi, scrape, with_vfs  # noqa: E402,F401

parser = pytest.importorskip("prometheus_client.parser")
SAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gpu", "fixtures", "mx-smi")
MX_LABELS = {"deviceId", "uuid", "Hostname", "driver_version", "bios_version", "modelName"}


@pytest.fixture(autouse=True)
def fixed_time(monkeypatch):
    monkeypatch.setenv("METAX_SIM_TIME", FIXED_TIME)


def families(text):
    """{family name: [(labels, value)]}, parsed by prometheus_client (raises on what Prometheus would refuse)."""
    out = {}
    for family in parser.text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def by_device(found, name, **match):
    return {labels["deviceId"]: value for labels, value in found.get(name, [])
            if all(labels.get(k) == v for k, v in match.items())}


def test_the_real_products_dashboard_families_parse_and_agree_with_ours(make_node):
    host = make_node("8xC500")
    state = generator.load_state(host)
    busy = state["gpus"][2]["bdf"]
    generator.set_load(host, busy, 0.9, processes=2)
    text = scrape(NodeReader(host, timeout=60.0, eids=EidTracker(host.path)), node="gpu-node-7")
    found = families(text)
    assert {f.name for f in MX_FAMILIES} <= set(found)
    usage = by_device(found, "mx_gpu_usage")
    assert sorted(usage) == [str(i) for i in range(8)]
    util = series(text, "metax_gpu_utilization_ratio")
    assert usage["2"] == pytest.approx(util[busy] * 100, abs=0.01) and usage["2"] > 70
    # memory in KB (1024 bytes) under type="vram", as dashboards made for mx-exporter select it
    used = by_device(found, "mx_memory_used", type="vram")
    total = by_device(found, "mx_memory_total", type="vram")
    assert used["2"] * 1024 == series(text, "metax_gpu_memory_used_bytes")[busy]
    assert total["2"] == 64 * 1024 * 1024
    assert by_device(found, "mx_memory_usage", type="vram")["2"] == pytest.approx(100 * used["2"] / total["2"], abs=0.01)
    assert by_device(found, "mx_board_power")["2"] == pytest.approx(series(text, "metax_gpu_power_watts")[busy] * 1000)
    assert by_device(found, "mx_chip_hotspot_temp")["2"] == series(text, "metax_gpu_temperature_celsius")[busy]
    assert set(by_device(found, "mx_gpu_state").values()) == {1.0}
    assert by_device(found, "mx_gpu_clock")["2"] > by_device(found, "mx_gpu_clock")["5"] >= 1125
    assert set(by_device(found, "mx_mem_clock").values()) == {1800.0}
    assert by_device(found, "mx_pci_event", type="aer_ue") == {str(i): 0.0 for i in range(8)}
    assert by_device(found, "mx_device_type", deviceType="MXC500") == {str(i): 1.0 for i in range(8)}
    # mx-exporter's label set; no die_id (mx-smi prints none), no exported_* for an unassigned GPU
    labels = next(lab for lab, _v in found["mx_gpu_usage"] if lab["deviceId"] == "2")
    assert labels == {"deviceId": "2", "uuid": state["gpus"][2]["uuid"], "Hostname": "gpu-node-7",
                      "driver_version": state["driver_version"], "bios_version": "1.22.3.0", "modelName": "MXC500"}


def test_a_gpu_assigned_to_a_container_carries_exported_pod_labels_and_vfs_have_no_mx_series(make_node):
    host = make_node("2xC550-sriov")
    pf0, pf1 = [g["bdf"] for g in generator.load_state(host)["gpus"]]
    with_vfs(host, pf0, 4)
    reader = NodeReader(host, timeout=60.0, allocations=lambda: {pf1: ("team-a", "train-0", "main")})
    found = families(scrape(reader))
    usage = found["mx_memory_used"]
    assert len(usage) == 2      # the two GPUs; the VFs of GPU 0 are not mx-exporter devices
    owned = [lab for lab, _v in usage if "exported_pod" in lab]
    assert owned == [{"deviceId": "1", "uuid": owned[0]["uuid"], "exported_namespace": "team-a",
                      "exported_pod": "train-0", "exported_container": "main", "Hostname": "node-a",
                      "driver_version": owned[0]["driver_version"], "bios_version": "1.22.3.0",
                      "modelName": "MXC550", "type": "vram"}]
    # the query dashboards built for the real product run
    assert [v for lab, v in usage if lab.get("exported_pod") == "train-0" and lab["type"] == "vram"]


def test_the_real_2_2_12_json_and_2_2_9_table_give_the_real_values(make_node):
    host = make_node("1xC500")
    bdf = generator.device_bdfs(host)[0]
    with open(os.path.join(SAMPLES, "json-2.2.12-1xC500-sgpu.txt")) as handle:
        js = handle.read().replace("0000:37:00.0", bdf)
    with open(os.path.join(SAMPLES, "table-2.2.9-8xC500.txt")) as handle:
        table = handle.read().replace("0000:0e:00.0", bdf)
    reader = NodeReader(host, timeout=60.0)
    reader.read()       # discovery with the simulated mx-smi (UUIDs)
    for name, text in (("json", js), ("table", table)):
        with open(host.join("usr/bin/mx-smi.%s" % name), "w") as handle:
            handle.write(text)
    _replace_mx_smi(host, 'd=$(dirname "$0")\nif [ "$1" = -j ]; then cat "$d/mx-smi.json"; else cat "$d/mx-smi.table"; fi')
    found = families(scrape(reader))
    one = {name: by_device(found, name) for name in ("mx_gpu_usage", "mx_chip_hotspot_temp", "mx_board_power",
                                                     "mx_gpu_clock", "mx_mem_clock", "mx_gpu_state")}
    assert one == {"mx_gpu_usage": {"0": 0.0}, "mx_chip_hotspot_temp": {"0": 38.5}, "mx_board_power": {"0": 61919.0},
                   "mx_gpu_clock": {"0": 1125.0}, "mx_mem_clock": {"0": 1800.0}, "mx_gpu_state": {"0": 1.0}}
    assert by_device(found, "mx_memory_used", type="vram") == {"0": 826 * 1024.0}
    assert by_device(found, "mx_memory_total", type="vram") == {"0": 65536 * 1024.0}
    labels = found["mx_gpu_usage"][0][0]
    # the versions mx-smi -j reports win (the table says driver 3.4.4, BIOS 1.30.0.0)
    assert labels["driver_version"] == "3.8.30" and labels["bios_version"] == "1.33.5.0"


def test_an_mx_smi_that_fails_leaves_only_the_state_it_can_tell(make_node):
    host = make_node("1xC500")
    reader = NodeReader(host, timeout=60.0)
    reader.read()
    _replace_mx_smi(host, "echo 'mx-smi: failed to initialize MetaX management library' >&2; exit 9")
    found = families(scrape(reader))
    assert "mx_gpu_usage" not in found and "mx_memory_used" not in found and "mx_board_power" not in found
    assert by_device(found, "mx_gpu_state") == {"0": 1.0}      # driver bound: as metax_gpu_healthy
    # the driver's version from sysfs when mx-smi cannot say
    assert found["mx_gpu_state"][0][0]["driver_version"] == generator.load_state(host)["driver_version"]


def test_ecc_errors_from_count_ecc_every_fourth_reading(make_node):
    from ansible_collections.metax.gpu.plugins.module_utils.exporter.collect import ECC_EVERY_READINGS
    host = make_node("1xC500")
    reader = NodeReader(host, timeout=60.0)
    found = families(scrape(reader))
    assert by_device(found, "mx_ecc_error_count") == {"0": 0.0}
    state = generator.load_state(host)
    bdf = state["gpus"][0]["bdf"]
    with open(os.path.join(SAMPLES, "count-ecc-2.2.12-1xC500.txt")) as handle:
        ecc = handle.read().replace("0000:37:00.0", bdf).replace(
            "SRAM Correctable                          : 0", "SRAM Correctable                          : 3").replace(
            "DRAM Uncorrectable                        : 0", "DRAM Uncorrectable                        : 1")
    real = host.join(generator.MX_SMI_PATH) + ".sim"
    os.rename(host.join(generator.MX_SMI_PATH), real)
    with open(host.join("usr/bin/mx-smi.ecc"), "w") as handle:
        handle.write(ecc)
    _replace_mx_smi(host, 'd=$(dirname "$0")\nif [ "$1" = --count-ecc ]; then cat "$d/mx-smi.ecc"; '
                          'else exec "%s" "$@"; fi' % real)
    runs = reader.runs.snapshot()[("ecc", "ok")]
    for _reading in range(ECC_EVERY_READINGS - 1):
        reader.read()
    assert reader.runs.snapshot()[("ecc", "ok")] == runs       # not on every reading
    reader.read()
    assert reader.runs.snapshot()[("ecc", "ok")] == runs + 1
    found = families(scrape(reader))
    assert by_device(found, "mx_ecc_error_count") == {"0": 4.0}


def test_an_mx_smi_without_count_ecc_serves_the_rest(make_node):
    host = make_node("1xC500")
    generator.set_mx_smi_version(host, "2.2.9")
    reader = NodeReader(host, timeout=60.0)
    found = families(scrape(reader))
    assert "mx_ecc_error_count" not in found and by_device(found, "mx_gpu_usage") == {"0": 0.0}
    for _reading in range(5):
        reader.read()
    assert reader.runs.snapshot()[("ecc", "error")] == 1        # tried again only after a while


def test_health_signals_per_gpu_with_the_pod_holding_it(make_node):
    """ECC by kind, retired pages, RAS, MetaXLink AER per link and EIDs (docs/health.md), attributed like the rest."""
    host = make_node("8xC500")
    bdfs = [g["bdf"] for g in generator.load_state(host)["gpus"]]
    owners = {bdfs[3]: ("team-a", "train-0", "main")}
    reader = NodeReader(host, timeout=60.0, allocations=lambda: owners, eids=EidTracker(host.path))
    found = families(scrape(reader))
    assert by_device(found, "mx_driver_eid_errors") == {str(i): 0.0 for i in range(8)}
    assert by_device(found, "mx_ecc_error_detail", memory="dram", type="ue") == {str(i): 0.0 for i in range(8)}
    sim_signals.inject_signals(host, 3, ecc={"dram_uncorrectable": 2, "sram_correctable": 5, "retired_dbe": 1},
                               ras={"uncorrected": 4}, mxlk_aer={"2": {"ue": 1}}, pci_events={"aer_ue": 1})
    sim_signals.add_eid(host, 3, 1021)
    sim_signals.add_eid(host, 3, 3005, sdk=True)
    from ansible_collections.metax.gpu.plugins.module_utils.exporter.collect import ECC_EVERY_READINGS
    for _reading in range(ECC_EVERY_READINGS - 1):     # --count-ecc runs on every 4th reading
        reader.read()
    found = families(scrape(reader))
    assert by_device(found, "mx_ecc_error_detail", memory="dram", type="ue")["3"] == 2.0
    assert by_device(found, "mx_ecc_error_detail", memory="sram", type="ce")["3"] == 5.0
    assert by_device(found, "mx_ecc_error_count")["3"] == 7.0          # retired pages are not errors
    assert by_device(found, "mx_retired_pages", type="dbe")["3"] == 1.0
    assert by_device(found, "mx_ras_count", type="uncorrected")["3"] == 4.0
    assert by_device(found, "mx_mxlk_aer_count", mxlkId="2", type="ue")["3"] == 1.0
    assert by_device(found, "mx_mxlk_aer_count", mxlkId="2", type="ue")["2"] == 0.0
    assert by_device(found, "mx_pci_event", type="aer_ue")["3"] == 1.0
    assert by_device(found, "mx_driver_eid_errors")["3"] == 1021.0 and by_device(found, "mx_sdk_eid_errors")["3"] == 3005.0
    assert by_device(found, "mx_driver_eid_count")["3"] == 1.0 and by_device(found, "mx_driver_eid_count")["4"] == 0.0
    labels = next(lab for lab, _v in found["mx_ras_count"] if lab["deviceId"] == "3")
    assert (labels["exported_namespace"], labels["exported_pod"], labels["exported_container"]) == (
        "team-a", "train-0", "main")
