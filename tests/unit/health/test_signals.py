"""Health signals: the parsers on real captures, the simulator's injection, the reader and its kernel-log tail."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.gpu import mxsmi_ecc, mxsmi_json
from ansible_collections.metax.gpu.plugins.module_utils.gpu.discovery import discover
from ansible_collections.metax.gpu.plugins.module_utils.health import eid as E
from ansible_collections.metax.gpu.plugins.module_utils.health.reader import HealthReader
from ansible_collections.metax.gpu.plugins.module_utils.health.signals import SIGNAL_NAMES, SIGNALS, gpu_readings
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator
from ansible_collections.metax.gpu.plugins.module_utils.sim import signals as sim_signals
from ansible_collections.metax.gpu.plugins.module_utils.sim.__main__ import main as sim_main

SAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gpu", "fixtures", "mx-smi")


def sample(name):
    with open(os.path.join(SAMPLES, name)) as handle:
        return handle.read()


def mx_smi(host, *args):
    res = subprocess.run([host.join("usr/bin/mx-smi")] + list(args), capture_output=True, text=True, check=True)
    return res.stdout


# -- the real captures ----------------------------------------------------------
def test_the_real_json_gives_state_pci_events_and_ras_all_zero():
    parsed = mxsmi_json.parse_json(sample("json-2.2.12-1xC500-sgpu.txt"))
    dev = parsed.devices[0]
    assert parsed.problems == ()
    assert dev.available and dict(dev.pci_events) == {"aer_ue": 0, "aer_ce": 0, "synfld": 0, "dbe": 0, "mmio": 0}
    # the capture's ras_count holds two empty objects: zero errors, known
    assert (dev.ras_uncorrected, dev.ras_corrected) == (0, 0)
    assert dev.mxlk_aer == ()          # not in the capture: unknown


def test_the_real_count_ecc_gives_every_ecc_signal():
    ecc = mxsmi_ecc.parse_count_ecc(sample("count-ecc-2.2.12-1xC500.txt"))
    assert ecc["0000:37:00.0"]["retired_dbe"] == 0
    text = sample("count-ecc-2.2.12-1xC500.txt").replace(
        "Double Bit ECC                            : 0", "Double Bit ECC                            : 3")
    assert mxsmi_ecc.parse_count_ecc(text)["0000:37:00.0"]["retired_dbe"] == 3
    # a kind of retired page not seen yet is read by its words, not dropped or fatal
    more = text.replace("End of Log", "").rstrip() + "\n        Single Bit ECC      : 2 \n"
    assert mxsmi_ecc.parse_count_ecc(more)["0000:37:00.0"]["retired_single_bit_ecc"] == 2


def test_json_readers_tolerate_forms_not_seen():
    doc = json.loads(sample("json-2.2.12-1xC500-sgpu.txt").split("\n", 1)[1])
    entry = doc["0000:37:00.0"]
    entry["ras_count"] = {"uncorrected_error": {"MCCTL0": "2", "DMA1": 1, "odd": "lots"}, "corrected_error": "5"}
    entry["MetaXLink_AER"] = {"1": {"aer_ce": "4", "aer_ue": "0"}, "0": {"CE": 1, "UE": 2}, "2": "broken"}
    parsed = mxsmi_json.parse_json("mx-smi  version: 2.2.12\n" + json.dumps(doc))
    dev = parsed.devices[0]
    assert dev.ras_uncorrected == 3 and dev.ras_corrected == 5
    assert dev.mxlk_aer == (("0", 1, 2), ("1", 4, 0))
    assert len(parsed.problems) == 2 and "odd" in parsed.problems[0] and "MetaXLink_AER.2" in parsed.problems[1]


# -- the simulator prints what the real tool prints, and injects each signal ------------
def test_sim_count_ecc_is_the_real_form_and_carries_injected_counts(make_node):
    host = make_node("1xC500")
    real = [l for l in sample("count-ecc-2.2.12-1xC500.txt").splitlines() if not l.startswith("Timestamp")]
    ours = [l for l in mx_smi(host, "--count-ecc").splitlines() if not l.startswith("Timestamp")]
    bdf = generator.load_state(host)["gpus"][0]["bdf"]
    assert ours == [l.replace("0000:37:00.0", bdf) for l in real]
    assert sim_main(["fail", host.path, "--gpu", "0", "--ecc-uncorrectable", "1", "--retired-pages", "2"]) == 0
    assert sim_main(["fail", host.path, "--gpu", "0", "--ecc-uncorrectable", "1"]) == 0     # counts add up
    counts = mxsmi_ecc.parse_count_ecc(mx_smi(host, "--count-ecc"))[bdf]
    assert counts["dram_uncorrectable"] == 2 and counts["retired_dbe"] == 2 and counts["sram_correctable"] == 0
    # the GPU stays available: a counter moved, nothing else
    assert mxsmi_json.parse_json(mx_smi(host, "-j")).devices[0].available


def test_sim_json_keys_are_the_real_ones_plus_mxlk(make_node):
    host = make_node("8xC500")
    real = json.loads(sample("json-2.2.12-1xC500-sgpu.txt").split("\n", 1)[1])["0000:37:00.0"]
    doc = json.loads(mx_smi(host, "-j").split("\n", 1)[1])
    entry = doc[generator.load_state(host)["gpus"][0]["bdf"]]
    assert set(real["pci_event_info"]) == set(entry["pci_event_info"])
    assert real["ras_count"] == entry["ras_count"]
    assert set(entry["mxlk_aer_count"]) == {"0", "1", "2"}        # three MetaXLink peers in a group of four


def test_sim_injects_pci_ras_mxlk_and_not_available(make_node):
    host = make_node("8xC500")
    assert sim_main(["fail", host.path, "--gpu", "2", "--aer-ue", "1", "--aer-ce", "3", "--pci-mmio", "1",
                     "--ras-uncorrected", "2", "--mxlk-aer", "1:ue=1", "--mxlk-aer", "0:ce=5"]) == 0
    assert sim_main(["fail", host.path, "--gpu", "4", "--mode", "smi"]) == 0
    bdfs = [g["bdf"] for g in generator.load_state(host)["gpus"]]
    devs = {d.bdf: d for d in mxsmi_json.parse_json(mx_smi(host, "-j")).devices}
    two = devs[bdfs[2]]
    assert dict(two.pci_events)["aer_ue"] == 1 and dict(two.pci_events)["aer_ce"] == 3
    assert two.ras_uncorrected == 2 and two.mxlk_aer[:2] == (("0", 5, 0), ("1", 0, 1))
    assert not devs[bdfs[4]].available and devs[bdfs[3]].available
    with pytest.raises(generator.SimError, match="no link '7'"):
        sim_signals.inject_signals(host, 2, mxlk_aer={"7": {"ue": 1}})
    assert sim_main(["fail", host.path, "--gpu", "2", "--mxlk-aer", "nonsense"]) == 2
    # recover zeroes the counters
    assert sim_main(["recover", host.path, "--gpu", "2"]) == 0
    two = {d.bdf: d for d in mxsmi_json.parse_json(mx_smi(host, "-j")).devices}[bdfs[2]]
    assert dict(two.pci_events)["aer_ue"] == 0 and two.ras_uncorrected == 0
    assert sim_main(["recover", host.path, "--gpu", "2"]) == 2      # nothing left to recover


def test_sim_eid_lines_match_the_default_pattern(make_node):
    host = make_node("8xC500")
    bdf = generator.load_state(host)["gpus"][1]["bdf"]
    assert sim_main(["fail", host.path, "--gpu", "1", "--eid", "1021"]) == 0
    assert sim_main(["fail", host.path, "--gpu", "1", "--eid", "3005", "--sdk"]) == 0
    with open(host.join(sim_signals.KERNEL_LOG)) as handle:
        lines = handle.read().splitlines()
    found = E.parse_lines(lines, E.compile_pattern(E.DEFAULT_PATTERN))
    assert [(e.eid, e.sdk, e.bdf) for e in found] == [(1021, False, bdf), (3005, True, bdf)]


# -- the EID pattern and the log tail -----------------------------------------------------
def test_an_administrators_pattern_is_checked_and_used():
    with pytest.raises(E.PatternError, match="no named group"):
        E.compile_pattern(r"EID (\d+)")
    with pytest.raises(E.PatternError, match="not a regular expression"):
        E.compile_pattern(r"(?P<eid>")
    with pytest.raises(E.PatternError, match="unknown named group"):
        E.compile_pattern(r"(?P<eid>\d+) (?P<gpu>\S+)")
    mine = E.compile_pattern(r"mxgpu error code=(?P<eid>0x[0-9a-f]+)")
    problems = []
    found = E.parse_lines(["x mxgpu error code=0x3fd on card", "unrelated"], mine, problems)
    assert [(e.eid, e.bdf, e.sdk) for e in found] == [(0x3FD, None, False)] and problems == []


def test_the_tail_starts_at_the_end_follows_appends_and_rotation(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text("old line [EID 1]\n")
    tail = E.LogTail([str(tmp_path / "missing.log"), str(log)])
    assert tail.read() == []                     # history before the agent is not news
    late = E.LogTail([str(tmp_path / "late.log")])
    assert late.read() == []
    (tmp_path / "late.log").write_text("created after the start\n")
    assert late.read() == ["created after the start"]     # a file created since: all of it is new
    with open(log, "a") as handle:
        handle.write("new one\nhalf a li")
    assert tail.read() == ["new one"]
    with open(log, "a") as handle:
        handle.write("ne\n")
    assert tail.read() == ["half a line"]
    os.rename(log, tmp_path / "kern.log.1")
    log.write_text("after rotation\n")
    assert tail.read() == ["after rotation"]
    log.write_text("")                           # truncated
    assert tail.read() == []
    log.write_text("again\n")
    assert tail.read() == ["again"]


# -- the reader end to end on a simulated node -------------------------------------
def test_the_reader_gives_every_signal_of_a_simulated_node(make_node):
    host = make_node("8xC500")
    reader = HealthReader(host)
    first = reader.read(discover(host, topology=False))
    assert first.problems == () and len(first.gpus) == 8
    clean = first.gpus[0].values
    assert set(clean) == set(SIGNAL_NAMES) - set()    # every signal is known on a 2.2.12 node
    assert all(v == 0 for v in clean.values())
    sim_signals.inject_signals(host, 0, ecc={"dram_uncorrectable": 1})
    sim_signals.add_eid(host, 3, 43)
    with open(host.join(sim_signals.KERNEL_LOG), "a") as handle:
        handle.write("Nov 28 10:00:00 n kernel: metax: [EID 7] a line that names no GPU\n")
    generator.fail_gpu(host, 6, "bus")
    inv = discover(host, topology=False)
    bdfs = [g["bdf"] for g in generator.load_state(host)["gpus"]]
    reading = reader.read(inv, lost=[(bdfs[6], 6)])
    by = {g.bdf: g for g in reading.gpus}
    assert by[bdfs[0]].values["ecc-dram-uncorrectable"] == 1
    assert by[bdfs[3]].values["eid-driver"] == 2 and by[bdfs[3]].details["eid-driver"] == "last EID 7"
    assert by[bdfs[0]].values["eid-driver"] == 1           # the line naming no GPU counts for every GPU
    assert by[bdfs[6]].values == {"gpu-lost": 1}
    assert all(name in SIGNALS for g in reading.gpus for name in g.values)


def test_an_old_mx_smi_leaves_the_new_signals_unknown(make_node):
    host = make_node("1xC500")
    generator.set_mx_smi_version(host, "2.2.9")
    reader = HealthReader(host)
    reading = reader.read(discover(host, topology=False))
    values = reading.gpus[0].values
    assert "ecc-dram-uncorrectable" not in values and "pci-aer-ue" not in values
    assert values["gpu-not-available"] == 0 and values["eid-driver"] == 0
    assert any("--count-ecc" in p for p in reading.problems)
    runs = reader.runs
    reader.read(discover(host, topology=False))
    assert reader.runs == runs                      # not retried on every reading


def test_readings_without_mx_smi_json_know_only_the_old_checks(make_node):
    host = make_node("1xC500")
    generator.unload_driver(host)
    values = gpu_readings(discover(host, topology=False))[0].values
    assert values == {"gpu-lost": 0, "driver-not-loaded": 1}
