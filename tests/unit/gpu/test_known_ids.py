"""KnownIds: an agent's repeated scans run ``mx-smi -L`` again only when the device table changes."""
from __future__ import annotations

import os
import stat

from ansible_collections.metax.gpu.plugins.module_utils.deviceplugin.containers import reading_discovery
from ansible_collections.metax.gpu.plugins.module_utils.gpu.discovery import KnownIds, discover
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator


def count_runs(host):
    """Put a wrapper in front of the node's mx-smi that logs each run's arguments; the log's path."""
    tool = host.join("usr/bin/mx-smi")
    os.rename(tool, tool + ".real")
    log = host.join("mx-smi-runs.log")
    with open(tool, "w") as handle:
        handle.write('#!/bin/sh\necho "$*" >> %s\nexec %s.real "$@"\n' % (log, tool))
    os.chmod(tool, os.stat(tool).st_mode | stat.S_IXUSR)
    return log


def runs(log):
    with open(log) as handle:
        return handle.read().splitlines()


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_the_list_is_read_once_while_the_table_lists_the_same_gpus(make_node):
    host = make_node("8xC500")
    log = count_runs(host)
    known = KnownIds()
    first = discover(host, topology=False, known_ids=known)
    again = discover(host, topology=False, known_ids=known)
    assert runs(log) == ["", "-L", ""]
    assert again == first and [g.uuid for g in again.gpus] == [g["uuid"] for g in generator.load_state(host)["gpus"]]
    assert known.runs == 1
    plain = discover(host, topology=False)                 # without KnownIds: as before, -L every time
    assert runs(log)[3:] == ["", "-L"] and plain == first


def test_a_gpu_gone_from_the_table_or_back_reads_the_list_again(make_node):
    host = make_node("8xC500")
    log = count_runs(host)
    known = KnownIds()
    discover(host, topology=False, known_ids=known)
    generator.fail_gpu(host, 3)                            # off the bus: the table lists seven
    seven = discover(host, topology=False, known_ids=known)
    generator.recover_gpu(host, 3)
    eight = discover(host, topology=False, known_ids=known)
    assert runs(log).count("-L") == 3
    assert seven.gpu_count == 7 and eight.gpu_count == 8 and all(g.uuid for g in eight.gpus)


def test_a_list_without_every_uuid_is_not_kept_and_a_recovered_gpu_gets_its_uuid_back(make_node):
    host = make_node("8xC500")
    generator.fail_gpu(host, 6, mode="smi")               # in the table, Unavailable; -L: no UUID
    known = KnownIds()
    first = discover(host, topology=False, known_ids=known)
    again = discover(host, topology=False, known_ids=known)
    assert known.runs == 2                                 # asked again while one GPU has no UUID
    assert any("Not Available" in w for w in first.warnings) and again.warnings == first.warnings
    generator.recover_gpu(host, 6)                         # same table GPUs, state Available again
    recovered = discover(host, topology=False, known_ids=known)
    assert all(g.uuid for g in recovered.gpus) and not any("Not Available" in w for w in recovered.warnings)
    discover(host, topology=False, known_ids=known)
    assert known.runs == 3                                 # kept from there on


def test_a_gpu_that_turns_unavailable_in_the_table_reads_the_list_again(make_node):
    host = make_node("8xC500")
    known = KnownIds()
    discover(host, topology=False, known_ids=known)
    generator.fail_gpu(host, 6, mode="smi")
    failed = discover(host, topology=False, known_ids=known)
    assert known.runs == 2 and next(g for g in failed.gpus if g.index == 6).uuid is None


def test_the_list_is_read_again_after_max_age(make_node):
    host = make_node("1xC500")
    clock = Clock()
    known = KnownIds(max_age=300.0, clock=clock)
    discover(host, topology=False, known_ids=known)
    clock.now = 299.0
    discover(host, topology=False, known_ids=known)
    clock.now = 300.0
    discover(host, topology=False, known_ids=known)
    assert known.runs == 2


def test_a_failed_list_is_not_kept(make_node):
    host = make_node("1xC500")
    tool = host.join("usr/bin/mx-smi")
    os.rename(tool, tool + ".real")
    with open(tool, "w") as handle:
        handle.write('#!/bin/sh\n[ "$1" = -L ] && { echo "list failed" >&2; exit 4; }\nexec %s.real "$@"\n' % tool)
    os.chmod(tool, 0o755)
    known = KnownIds()
    failed = discover(host, topology=False, known_ids=known)
    assert failed.gpus[0].uuid is None and any("exited 4: list failed" in w for w in failed.warnings)
    os.replace(tool + ".real", tool)
    fixed = discover(host, topology=False, known_ids=known)
    assert fixed.gpus[0].uuid and known.runs == 1


def test_each_reading_agent_keeps_its_own(make_node):
    host = make_node("1xC500")
    log = count_runs(host)
    device_scan, dra_scan = reading_discovery(), reading_discovery(for_containers=False)
    for scan in (device_scan, dra_scan, device_scan, dra_scan):
        scan(host, topology=False)
    assert runs(log).count("-L") == 2
