# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""gpu-exporter's readings from every real mx-smi capture (tests/unit/gpu/fixtures/mx-smi/)."""

from __future__ import annotations

import json
import os

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.gpu import mxsmi, mxsmi_json

SAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gpu", "fixtures", "mx-smi")


def sample(name):
    with open(os.path.join(SAMPLES, name)) as handle:
        return handle.read()


# (file, GPUs, first GPU: bdf, util %, temp C, power W, cap W, used MiB, total MiB; processes per GPU)
TABLES = [
    ("table-2.1.6-4xMXC500-processes.txt", 4, ("0000:05:00.0", 0.0, 51.0, 71.0, None, 60982, 65536),
     {0: 1, 1: 1, 2: 1, 3: 1}),
    ("table-2.2.4-8xC550.txt", 8, ("0000:0f:00.0", 0.0, 29.0, 53.0, 450.0, 858, 65536), {}),
    ("table-2.2.9-8xC500.txt", 8, ("0000:0e:00.0", 0.0, 35.0, 57.0, 350.0, 826, 65536), {}),
]


@pytest.mark.parametrize("name,count,first,processes", TABLES, ids=[t[0] for t in TABLES])
def test_table_readings_of_every_capture(name, count, first, processes):
    table = mxsmi.parse_table(sample(name))
    assert table.problems == ()
    assert len(table.samples) == len(table.gpus) == count
    got = table.samples[0]
    assert (got.bdf, got.utilization_percent, got.temperature_celsius, got.power_watts, got.power_cap_watts,
            got.memory_used_mib, got.memory_total_mib) == first
    assert [s.bdf for s in table.samples] == [g.bdf for g in table.gpus]
    # every GPU of a capture has every reading its layout prints
    for one in table.samples:
        assert one.temperature_celsius is not None and one.power_watts is not None
        assert one.memory_used_mib is not None and one.memory_used_mib <= one.memory_total_mib
    assert table.processes == processes


def test_table_readings_follow_the_cell_not_the_position():
    """2.2.4 prints Temp and Pwr in one cell; 2.2.9 splits them over two: both read the same way."""
    text = sample("table-2.2.9-8xC500.txt")
    table = mxsmi.parse_table(text)
    temps = [s.temperature_celsius for s in table.samples]
    assert temps == [35.0, 37.0, 36.0, 35.0, 33.0, 34.0, 34.0, 36.0]
    assert [s.power_watts for s in table.samples] == [57.0, 58.0, 58.0, 60.0, 57.0, 56.0, 55.0, 56.0]


def test_table_cap_printed_as_na_is_unknown():
    text = sample("table-2.2.4-8xC550.txt").replace("53W / 450W", "53W / NA  ", 1)
    table = mxsmi.parse_table(text)
    assert table.samples[0].power_watts == 53.0 and table.samples[0].power_cap_watts is None
    assert table.samples[1].power_cap_watts == 450.0


def test_table_unreadable_reading_is_none_not_zero():
    text = sample("table-2.2.4-8xC550.txt").replace("| 0%                   |", "| N/A                  |", 1)
    table = mxsmi.parse_table(text)
    assert table.samples[0].utilization_percent is None
    assert table.samples[1].utilization_percent == 0.0


def test_json_capture():
    parsed = mxsmi_json.parse_json(sample("json-2.2.12-1xC500-sgpu.txt"))
    assert (parsed.version, parsed.driver_version, parsed.maca_version) == ("2.2.12", "3.8.30", "3.5.3.20")
    assert parsed.problems == ()
    (device,) = parsed.devices
    assert device.bdf == "0000:37:00.0" and device.index == 0 and device.available
    assert device.temperature_celsius == 38.5
    assert device.utilization_percent == 0.0
    # the three rails of board_power.power, summed
    assert device.power_watts == pytest.approx(25.789 + 26.652 + 9.478)


def _json_doc(**changes):
    text = sample("json-2.2.12-1xC500-sgpu.txt")
    version, body = text.split("\n", 1)
    doc = json.loads(body)
    doc["0000:37:00.0"].update(changes)
    return version + "\n" + json.dumps(doc)


@pytest.mark.parametrize("value,expected", [("37%", 37.0), ("12", 12.0), (55, 55.0), (7.5, 7.5)])
def test_json_numbers_as_strings_or_numbers(value, expected):
    (device,) = mxsmi_json.parse_json(_json_doc(utilization=value)).devices
    assert device.utilization_percent == expected


def test_json_unreadable_value_is_a_problem_not_a_guess():
    parsed = mxsmi_json.parse_json(_json_doc(hotspot="NA"))
    assert parsed.devices[0].temperature_celsius is None
    assert len(parsed.problems) == 1 and "hotspot" in parsed.problems[0] and "0000:37:00.0" in parsed.problems[0]


def test_json_unavailable_gpu():
    (device,) = mxsmi_json.parse_json(_json_doc(unavailable_reason="ECC error")).devices
    assert not device.available and device.unavailable_reason == "ECC error"


@pytest.mark.parametrize("text", ["mx-smi  version: 2.2.12\n", "mx-smi  version: 2.2.12\n{ not json", "[1, 2]"])
def test_json_without_an_object_raises(text):
    with pytest.raises(mxsmi.MxSmiParseError):
        mxsmi_json.parse_json(text)


def test_json_fewer_devices_than_attached_is_reported():
    text = sample("json-2.2.12-1xC500-sgpu.txt").replace('"attached_gpus": 1', '"attached_gpus": 2')
    parsed = mxsmi_json.parse_json(text)
    assert len(parsed.devices) == 1 and "2 GPUs attached, 1 devices read" in parsed.problems[0]
