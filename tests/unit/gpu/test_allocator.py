"""Allocator: the manual's examples, presets, bad input, the CLI, and properties against brute force."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from ansible_collections.metax.gpu.plugins.module_utils.gpu import allocator_cli
from ansible_collections.metax.gpu.plugins.module_utils.sim.alloc_synth import (
    random_matrix, random_spec, random_ultrametric, topology_from_spec)
from ansible_collections.metax.gpu.plugins.module_utils.gpu.alloc_tree import hierarchy
from ansible_collections.metax.gpu.plugins.module_utils.gpu.allocator import (
    MAX_LOSS, MAX_SCORE, AllocationError, allocate, bounded_loss, per_count_tables, preferred_allocation,
    topology_annotations)
from ansible_collections.metax.gpu.plugins.module_utils.gpu.discovery import discover
from ansible_collections.metax.gpu.plugins.module_utils.gpu.model import LinkClass
from ansible_collections.metax.gpu.plugins.module_utils.gpu.scoring import evaluate, exhaustive_best
from ansible_collections.metax.gpu.plugins.module_utils.names import ANNOTATION_LOSSES, ANNOTATION_SCORES
from ansible_collections.metax.gpu.plugins.module_utils.sim.spec import preset

C500x8 = topology_from_spec(preset("8xC500"))
N100x4 = topology_from_spec(preset("4xN100"))
SETTINGS = settings(max_examples=150, deadline=None)


def choose(topology, free, size, must=()):
    return allocate(topology, free, size, must).devices


# -- the manual's examples (GPU 1..8 in the manual are indices 0..7) ----------

def test_manual_example_1_size_4_after_0_1():
    assert choose(C500x8, range(2, 8), 4) == (4, 5, 6, 7)


def test_manual_example_2_size_2_after_0_1():
    assert choose(C500x8, range(2, 8), 2) == (2, 3)


@pytest.mark.parametrize("size, expected", [(4, (4, 5, 6, 7)), (2, (2, 3))])
def test_manual_examples_are_unique_optima(size, expected):
    """Every other set of that size is strictly worse on the objective (no tie-break needed)."""
    import itertools
    free = list(range(2, 8))
    best = evaluate(C500x8, expected, free).key()
    for other in itertools.combinations(free, size):
        if other != expected:
            assert evaluate(C500x8, other, free).key() < best, other


def test_manual_examples_through_discovery(make_node):
    inv = discover(make_node("8xC500"))
    assert choose(inv.topology, range(2, 8), 4) == (4, 5, 6, 7)
    assert choose(inv.topology, range(2, 8), 2) == (2, 3)


def test_rule_1_metaxlink_beats_switch():
    # GPUs 0-1 share a switch only, 2-3 share a switch and MetaXLink.
    links = {(0, 1): LinkClass.PIX, (2, 3): LinkClass.MX}
    topo = _topology(4, links, LinkClass.PHB)
    assert choose(topo, range(4), 2) == (2, 3)


def test_rule_2_one_switch_beats_metaxlink_spread():
    # Three MX GPUs and a lone fourth, versus four GPUs on one switch: the
    # four on one switch keep every pair on the switch.
    links = {}
    for a in range(3):
        for b in range(a + 1, 3):
            links[(a, b)] = LinkClass.MX
    for a in range(4, 8):
        for b in range(a + 1, 8):
            links[(a, b)] = LinkClass.PIX
    topo = _topology(8, links, LinkClass.SYS)
    assert choose(topo, [0, 1, 2, 3, 4, 5, 6, 7], 4) == (4, 5, 6, 7)


def test_rule_3_best_fit_keeps_whole_groups():
    # group 0-3 has one GPU taken: small requests go there, group 4-7 stays whole
    assert choose(C500x8, range(1, 8), 1) == (1,)
    assert choose(C500x8, range(1, 8), 2) == (1, 2)
    assert choose(C500x8, range(1, 8), 3) == (1, 2, 3)
    assert choose(C500x8, [1, 2, 4, 5, 6, 7], 2) == (1, 2)


def _topology(count, links, default):
    from ansible_collections.metax.gpu.plugins.module_utils.gpu.model import build_topology
    return build_topology(range(count), lambda a, b: links.get((a, b), default))


# -- presets ----------------------------------------------------------------

def test_4xn100_switch_pairs():
    assert choose(N100x4, range(4), 2) == (0, 1)
    assert choose(N100x4, [1, 2, 3], 2) == (2, 3)       # rule 2: one switch
    assert choose(N100x4, [1, 2, 3], 1) == (1,)         # best fit: the broken switch
    assert choose(N100x4, range(4), 3) == (0, 1, 2)
    alloc = allocate(N100x4, range(4), 2)
    assert alloc.bottleneck == LinkClass.PIX and alloc.exact


def test_4xn100_through_discovery(make_node):
    inv = discover(make_node("4xN100"))
    assert choose(inv.topology, [1, 2, 3], 2) == (2, 3)


def _sriov_inventory(make_node, vfs):
    host = make_node("2xC550-sriov")
    inv = discover(host)
    for gpu in inv.gpus:
        host.write_attribute("/sys/bus/pci/devices/%s/sriov_numvfs" % gpu.bdf, str(vfs))
    return discover(host)


def test_sriov_vfs_of_one_gpu_are_closest(make_node):
    inv = _sriov_inventory(make_node, 4)
    topo = inv.topology
    assert len(topo.device_indices) == 8
    assert choose(topo, range(8), 2) == (0, 1)
    assert allocate(topo, range(8), 2).bottleneck == LinkClass.SAME_GPU
    # pack onto the split GPU; keep GPU 1 (VFs 4-7) whole
    assert choose(topo, range(1, 8), 1) == (1,)
    assert choose(topo, range(1, 8), 2) == (1, 2)
    assert choose(topo, range(1, 8), 3) == (1, 2, 3)
    assert choose(topo, range(1, 8), 4) == (4, 5, 6, 7)


def test_sriov_packing_beats_bigger_pools():
    # 16 GPUs x 8 VFs. GPU 0 is split (VF 0 taken) inside a group with three
    # whole GPUs; GPU 4 is the last free GPU of its group. A single VF goes to
    # the split GPU, so both whole GPUs stay whole.
    topo = topology_from_spec(preset("16xC500"), 8)
    free = list(range(1, 32)) + list(range(32, 40))
    assert choose(topo, free, 1) == (1,)
    assert choose(topo, free, 7) == tuple(range(1, 8))
    # a whole GPU's worth goes to the GPU alone in its group
    assert choose(topo, free, 8) == tuple(range(32, 40))


def test_16xc500_all_sizes_are_groups_first():
    topo = topology_from_spec(preset("16xC500"))
    assert choose(topo, range(16), 4) == (0, 1, 2, 3)
    assert choose(topo, range(16), 8) == tuple(range(8))          # two groups on one port (PXB)
    assert allocate(topo, range(16), 8).bottleneck == LinkClass.PXB
    assert choose(topo, [0] + list(range(4, 16)), 3) == tuple(range(4, 7))


# -- bad input ---------------------------------------------------------------

@pytest.mark.parametrize("free, size, must, message", [
    (range(2, 8), 7, (), "only 6 available"),
    (range(8), 0, (), "at least 1"),
    (range(8), -1, (), "at least 1"),
    ([0, 9], 1, (), "unknown device index(es) 9"),
    (range(2, 8), 2, (1,), "must-include device(s) 1 are not available"),
    (range(8), 2, (12,), "must-include: unknown"),
    (range(8), 1, (0, 1), "do not fit"),
    (range(8), "2", (), "must be an integer"),
    (["0"], 1, (), "not an integer"),
])
def test_bad_input_is_a_clear_error(free, size, must, message):
    with pytest.raises(AllocationError) as err:
        allocate(C500x8, free, size, must)
    assert message in str(err.value)


def test_must_include_is_honoured():
    assert choose(C500x8, range(8), 2, [5]) == (4, 5)
    alloc = allocate(C500x8, range(8), 4, [3, 4])
    assert {3, 4} <= set(alloc.devices) and alloc.bottleneck == LinkClass.SYS
    assert choose(C500x8, range(8), 1, [6]) == (6,)


# -- device plugin mapping ---------------------------------------------------

def test_preferred_allocation_maps_ids(make_node):
    inv = discover(make_node("8xC500"))
    ids = [d.id for d in inv.devices]
    chosen = preferred_allocation(inv, ids[2:], [], 2)
    assert chosen == [ids[2], ids[3]]
    assert preferred_allocation(inv, ids, [ids[5]], 2) == [ids[4], ids[5]]
    with pytest.raises(AllocationError, match="unknown device id"):
        preferred_allocation(inv, ids + ["0000:ff:00.0"], [], 2)


# -- tables ------------------------------------------------------------------

def test_tables_8xc500():
    scores, losses = per_count_tables(C500x8, range(2, 8))
    assert sorted(scores) == sorted(losses) == [1, 2, 3, 4, 5, 6]
    assert scores[2] == scores[4] == 670          # MX level (6), pairs weigh 70
    assert losses[2] == 80 and losses[6] == 0     # {2,3} cuts 8 SYS pairs; taking all cuts nothing
    assert scores[1] == 800
    assert per_count_tables(C500x8, []) == ({}, {})


def test_annotations_are_json_objects_keyed_by_count():
    notes = topology_annotations(C500x8, range(8))
    scores = json.loads(notes[ANNOTATION_SCORES])
    losses = json.loads(notes[ANNOTATION_LOSSES])
    assert list(scores) == [str(n) for n in range(1, 9)] and list(losses) == list(scores)
    assert all(isinstance(v, int) for v in list(scores.values()) + list(losses.values()))


def test_annotations_pad_to_capacity_with_the_worst_values():
    """Keys "1".."C" always present (HAMi reads a missing key as 0): unservable sizes are worst."""
    scores, losses = per_count_tables(C500x8, range(2, 8))
    notes = topology_annotations(C500x8, range(2, 8), capacity=8)
    published_scores = json.loads(notes[ANNOTATION_SCORES])
    published_losses = json.loads(notes[ANNOTATION_LOSSES])
    assert list(published_scores) == [str(n) for n in range(1, 9)] == list(published_losses)
    assert {n: published_scores[str(n)] for n in scores} == scores
    assert {n: published_losses[str(n)] for n in losses} == {n: bounded_loss(v) for n, v in losses.items()}
    assert [published_scores["7"], published_scores["8"]] == [0, 0]
    assert [published_losses["7"], published_losses["8"]] == [MAX_LOSS, MAX_LOSS]
    assert all(0 <= v <= MAX_SCORE for v in published_scores.values())


def test_annotations_without_free_devices_or_topology():
    assert topology_annotations(C500x8, [], capacity=2) == {
        ANNOTATION_SCORES: '{"1":0,"2":0}', ANNOTATION_LOSSES: '{"1":%d,"2":%d}' % (MAX_LOSS, MAX_LOSS)}
    assert topology_annotations(None, range(4), capacity=1) == {
        ANNOTATION_SCORES: '{"1":0}', ANNOTATION_LOSSES: '{"1":%d}' % MAX_LOSS}
    assert topology_annotations(C500x8, []) == {ANNOTATION_SCORES: "{}", ANNOTATION_LOSSES: "{}"}


def test_bounded_loss_is_monotone_and_below_max():
    previous = -1
    for raw in list(range(0, 5000)) + [70880, 10 ** 6, 10 ** 9]:
        value = bounded_loss(raw)
        assert previous <= value < MAX_LOSS
        previous = value
    assert bounded_loss(0) == 0 and bounded_loss(1) >= 1


def test_tables_are_fast_enough_for_128_vfs():
    import time
    topo = topology_from_spec(preset("16xC500"), 8)
    hierarchy(topo)
    start = time.perf_counter()
    scores, losses = per_count_tables(topo, range(128))
    assert len(scores) == 128
    assert time.perf_counter() - start < 1.0     # generous: the benchmark reports the real figure


# -- CLI ---------------------------------------------------------------------

def _cli(args, capsys):
    rc = allocator_cli.main(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_manual_examples(make_node, capsys):
    host = make_node("8xC500")
    rc, out, _err = _cli(["--host-root", host.path, "--exclude", "0,1", "--size", "4"], capsys)
    result = json.loads(out)
    assert rc == 0 and result["devices"] == [4, 5, 6, 7] and result["bottleneck"] == "MX"
    assert result["score"] == 670 and isinstance(result["loss"], int) and len(result["ids"]) == 4
    rc, out, _err = _cli(["--host-root", host.path, "--exclude", "0,1", "--size", "2"], capsys)
    assert json.loads(out)["devices"] == [2, 3]
    rc, out, _err = _cli(["--host-root", host.path, "--exclude", "0-1", "--tables"], capsys)
    tables = json.loads(out)
    assert rc == 0 and tables["available"] == [2, 3, 4, 5, 6, 7]
    assert tables["scores"]["2"] == 670 and tables["losses"]["2"] == 80


def test_cli_errors(make_node, capsys):
    host = make_node("8xC500")
    rc, out, err = _cli(["--host-root", host.path, "--exclude", "0,1", "--size", "7"], capsys)
    assert rc == 2 and not out and "only 6 available" in err
    rc, out, err = _cli(["--host-root", host.path, "--exclude", "0,1", "--must-include", "0", "--size", "2"], capsys)
    assert rc == 2 and "not available" in err
    rc, out, err = _cli(["--host-root", host.path, "--exclude", "42", "--size", "1"], capsys)
    assert rc == 2 and "unknown" in err
    rc, out, err = _cli(["--host-root", os.path.join(host.path, "missing"), "--size", "1"], capsys)
    assert rc == 2 and err.startswith("error:")


def test_cli_preset_and_module_entry_point():
    """Presets come from the simulator's entry point (the library's CLI imports no simulator)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    proc = subprocess.run(
        [sys.executable, "-m", "ansible_collections.metax.gpu.plugins.module_utils.sim.allocator_cli",
         "--preset", "2xC550-sriov", "--vfs", "4", "--exclude", "0", "--size", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, check=False, universal_newlines=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["devices"] == [1, 2]
    # the library's own entry point still runs, and offers no --preset
    proc = subprocess.run(
        [sys.executable, "-m", "ansible_collections.metax.gpu.plugins.module_utils.gpu.allocator_cli",
         "--preset", "2xC550-sriov", "--size", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, check=False, universal_newlines=True)
    assert proc.returncode == 2 and "--host-root is required" in proc.stderr


# -- properties ----------------------------------------------------------------

@st.composite
def problems(draw, max_devices=12, kinds=("ultrametric", "spec", "vf", "matrix")):
    """A topology, a free set, a size and must-include devices."""
    kind = draw(st.sampled_from(kinds))
    rng = random.Random(draw(st.integers(0, 2 ** 32)))
    if kind == "ultrametric":
        topo = random_ultrametric(rng, draw(st.integers(1, max_devices)))
    elif kind == "spec":
        topo = topology_from_spec(random_spec(rng, draw(st.integers(1, max_devices))))
    elif kind == "vf":
        vfs = draw(st.sampled_from([2, 4]))
        topo = topology_from_spec(random_spec(rng, draw(st.integers(1, max(1, max_devices // vfs)))), vfs)
    else:
        topo = random_matrix(rng, draw(st.integers(1, min(max_devices, 9))))
    devices = list(topo.device_indices)
    free = sorted(draw(st.sets(st.sampled_from(devices), min_size=1)))
    size = draw(st.integers(1, len(free)))
    must = sorted(draw(st.sets(st.sampled_from(free), max_size=min(size, 3))))
    return topo, free, size, must


@SETTINGS
@given(problems())
def test_result_is_valid_and_deterministic(problem):
    topo, free, size, must = problem
    first = allocate(topo, free, size, must)
    assert len(first.devices) == size == len(set(first.devices))
    assert set(first.devices) <= set(free) and set(must) <= set(first.devices)
    assert list(first.devices) == sorted(first.devices)
    assert allocate(topo, list(reversed(free)), size, list(reversed(must))) == first
    metrics = evaluate(topo, first.devices, free)
    assert (metrics.score, metrics.loss, metrics.pair_sum, metrics.bottleneck) == (
        first.score, first.loss, first.pair_sum, first.bottleneck)


@SETTINGS
@given(problems())
def test_optimum_equals_exhaustive_search(problem):
    topo, free, size, must = problem
    alloc = allocate(topo, free, size, must)
    best, metrics = exhaustive_best(topo, free, size, must)
    assert alloc.exact
    assert alloc.devices == best
    assert (alloc.score, alloc.loss) == (metrics.score, metrics.loss)


@SETTINGS
@given(problems(max_devices=12, kinds=("ultrametric", "spec", "vf")))
def test_tree_search_is_exact_on_hierarchies(problem):
    """Ultrametric topologies never fall back to enumeration."""
    topo, free, size, must = problem
    assert hierarchy(topo).ultrametric
    alloc = allocate(topo, free, size, must)
    assert alloc.method == "tree"
    assert alloc.devices == exhaustive_best(topo, free, size, must)[0]


@SETTINGS
@given(problems(max_devices=16))
def test_tables_match_the_allocator(problem):
    topo, free = problem[0], problem[1]
    scores, losses = per_count_tables(topo, free)
    assert sorted(scores) == list(range(1, len(free) + 1))
    for n in scores:
        alloc = allocate(topo, free, n)
        assert (scores[n], losses[n]) == (alloc.score, alloc.loss)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2 ** 32), st.integers(13, 18))
def test_bounded_search_on_non_hierarchical_topologies_is_valid(seed, count):
    """Beyond the enumeration limit a non-ultrametric topology gets the bounded search."""
    rng = random.Random(seed)
    topo = random_matrix(rng, count)
    free = list(topo.device_indices)
    size = rng.randint(5, count - 5)
    must = [free[0]]
    alloc = allocate(topo, free, size, must)
    assert len(alloc.devices) == size and free[0] in alloc.devices
    assert alloc.method in ("search", "exhaustive")
    assert allocate(topo, free, size, must) == alloc


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 2 ** 32))
def test_tables_match_the_bounded_search(seed):
    """The tables reuse greedy growth orders across sizes; allocate grows each size alone."""
    rng = random.Random(seed)
    topo = random_matrix(rng, 20)
    free = [d for d in topo.device_indices if rng.random() < 0.9]
    scores, losses = per_count_tables(topo, free)
    for n in scores:
        alloc = allocate(topo, free, n)
        assert (scores[n], losses[n]) == (alloc.score, alloc.loss)
