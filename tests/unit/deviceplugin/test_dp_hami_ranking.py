# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""gpu-device's topology tables as HAMi reads them (issue 12, deliverable 3).

HAMi (``pkg/device/metax/device.go``, ``ScoreNode``) decodes
``metax-tech.com/gpu.topology.losses`` / ``.scores`` with Go's
``json.Unmarshal`` into a ``map[int]int``, looks up the number of devices the
pod asks for, and scores the node ``2000 - losses[n]`` under the binpack
policy (higher ranks first) or ``2000 - scores[n]`` under spread (lower ranks
first); a decode error or a missing key reads as 0. HAMi's Fit counts the
node's *capacity* and does not see pods placed by other schedulers, so it
scores nodes that are full or have failed GPUs as if they were empty: the
tables are what keeps them from winning.

The decoder below is as strict as Go's: keys must parse as base-10 int64
(``strconv.ParseInt``), values must be JSON integers (``1.0``, ``1e3``,
``true`` are errors that zero the whole table).
"""

from __future__ import annotations

import json
import random
import re
from typing import Dict, FrozenSet, List, Tuple

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.deviceplugin import constants as C
from ansible_collections.metax.gpu.plugins.module_utils.deviceplugin.annotations import node_annotations
from ansible_collections.metax.gpu.plugins.module_utils.deviceplugin.devices import DeviceState
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator
from ansible_collections.metax.gpu.plugins.module_utils.sim.spec import PRESETS, preset

INT64 = (-(2 ** 63), 2 ** 63 - 1)
_GO_INT_KEY = re.compile(r"^[+-]?[0-9]+$")
PRESET_NAMES = sorted(PRESETS)


class GoDecodeError(ValueError):
    """json.Unmarshal into map[int]int would return an error."""


def _no_float(text: str) -> None:
    raise GoDecodeError("cannot unmarshal number %s into Go value of type int" % text)


def _no_constant(text: str) -> None:
    raise GoDecodeError("invalid character in %s" % text)


def go_map_int_int(text: str) -> Dict[int, int]:
    """``json.Unmarshal([]byte(text), &map[int]int{})`` in Python; ``null`` leaves the map empty."""
    try:
        value = json.loads(text, parse_float=_no_float, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise GoDecodeError(str(exc)) from None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise GoDecodeError("cannot unmarshal %s into Go value of type map[int]int" % type(value).__name__)
    table: Dict[int, int] = {}
    for key, item in value.items():
        if not _GO_INT_KEY.match(key) or not INT64[0] <= int(key) <= INT64[1]:
            raise GoDecodeError("cannot unmarshal number %s into Go value of type int" % key)
        if isinstance(item, bool) or not isinstance(item, int) or not INT64[0] <= item <= INT64[1]:
            raise GoDecodeError("cannot unmarshal %r into Go value of type int" % (item,))
        table[int(key)] = item
    return table


def hami_score(annotations: Dict[str, str], count: int, policy: str) -> float:
    """HAMi's ``ScoreNode`` for a pod asking for ``count`` devices."""
    key = C.ANNOTATION_LOSSES if policy == "binpack" else C.ANNOTATION_SCORES
    if key not in annotations:
        return 0.0
    try:
        value = go_map_int_int(annotations[key]).get(count, 0)
    except GoDecodeError:
        value = 0
    return float(2000 - value)


def hami_order(nodes: Dict[str, Dict[str, str]], count: int, policy: str) -> List[str]:
    """Node names best first (binpack: highest score first; spread: lowest first)."""
    return sorted(nodes, key=lambda name: hami_score(nodes[name], count, policy),
                  reverse=(policy == "binpack"))


@pytest.mark.parametrize("text, expected", [
    ('{"1":800,"2":750}', {1: 800, 2: 750}),
    ('{"+3":1,"-1":2,"007":3}', {3: 1, -1: 2, 7: 3}),      # strconv.ParseInt accepts these keys
    ("null", {}),
    ("{}", {}),
])
def test_go_decoder_accepts(text, expected):
    assert go_map_int_int(text) == expected


@pytest.mark.parametrize("text", ['{"1":1.0}', '{"1":1e3}', '{"1":true}', '{"1":"800"}', '{"a":1}', '{"1.0":1}',
                                  '{" 1":1}', '{"1":null}', '[1,2]', '{"1":NaN}', '{"1":9223372036854775808}', "{"])
def test_go_decoder_rejects_what_go_rejects(text):
    with pytest.raises(GoDecodeError):
        go_map_int_int(text)


def test_hami_reads_a_broken_table_as_zero():
    assert hami_score({C.ANNOTATION_LOSSES: '{"2":1.5}'}, 2, "binpack") == 2000.0
    assert hami_score({C.ANNOTATION_SCORES: '{"1":800}'}, 2, "spread") == 2000.0
    assert hami_score({}, 1, "spread") == 0.0


# ------------------------------------------------------------ simulated nodes

class SimNode:
    """A simulated node's gpu-device annotations, with HAMi's view of it: capacity and free healthy devices."""

    def __init__(self, name: str, annotations: Dict[str, str]) -> None:
        self.name = name
        self.annotations = annotations
        devices = json.loads(annotations[C.ANNOTATION_DEVICES])
        self.capacity = len(devices)
        self.free = sum(1 for d in devices if d["health"] == "Healthy" and not d["allocated"])


def _simulate(make_node, preset_name: str, rng: random.Random, label: str) -> SimNode:
    """A node of ``preset_name`` with a random share of its devices allocated and maybe failed GPUs."""
    host = make_node(preset_name)
    state = DeviceState(host)
    state.refresh()
    gpus = len(preset(preset_name).gpus)
    # fail after the first discovery, as in a running cluster: the failed GPU still counts in capacity
    failed = rng.sample(range(gpus), rng.choice([0, 0, 1, min(2, gpus)]))
    for index in failed:
        generator.fail_gpu(host, index, rng.choice(["bus", "smi"]))
    if failed:
        state.refresh()
    snapshot = state.snapshot()
    ids = [d.id for d in snapshot.devices]
    share = rng.choice([0.0, 0.25, 0.5, 1.0, rng.random()])
    allocated: FrozenSet[str] = frozenset(rng.sample(ids, int(round(share * len(ids)))))
    return SimNode("%s-%s" % (label, preset_name), node_annotations(snapshot, allocated))


def _cluster(make_node, seed: int) -> List[SimNode]:
    rng = random.Random(seed)
    nodes = [_simulate(make_node, name, rng, "n%d" % i) for i, name in enumerate(PRESET_NAMES)]
    nodes += [_simulate(make_node, rng.choice(PRESET_NAMES), rng, "x%d" % i) for i in range(4)]
    return nodes


def _contract_shape(node: SimNode) -> Tuple[Dict[int, int], Dict[int, int]]:
    scores = go_map_int_int(node.annotations[C.ANNOTATION_SCORES])
    losses = go_map_int_int(node.annotations[C.ANNOTATION_LOSSES])
    # the raw JSON text: every key is the decimal spelling of 1..capacity, every value a plain integer
    for key in (C.ANNOTATION_SCORES, C.ANNOTATION_LOSSES):
        raw = json.loads(node.annotations[key])
        assert list(raw) == [str(n) for n in range(1, node.capacity + 1)], (node.name, key, raw)
        assert all(isinstance(v, int) and not isinstance(v, bool) for v in raw.values()), (node.name, key, raw)
    return scores, losses


@pytest.mark.parametrize("seed", range(4))
def test_hami_never_ranks_a_node_first_for_a_size_it_cannot_serve(make_node, seed):
    nodes = _cluster(make_node, seed)
    checked = 0
    for node in nodes:
        _contract_shape(node)
    for count in range(1, max(node.capacity for node in nodes) + 1):
        # HAMi's Fit passes every node with enough capacity (it cannot see allocations or failures)
        candidates = {node.name: node for node in nodes if node.capacity >= count}
        servable = {name for name, node in candidates.items() if node.free >= count}
        unservable = set(candidates) - servable
        if not servable or not unservable:
            continue
        annotations = {name: node.annotations for name, node in candidates.items()}
        for policy in ("binpack", "spread"):
            order = hami_order(annotations, count, policy)
            assert order[0] in servable, (policy, count, order, {n: candidates[n].free for n in order})
            # strictly: every node that can serve the size ranks before every node that cannot
            worst_servable = max(order.index(name) for name in servable)
            best_unservable = min(order.index(name) for name in unservable)
            assert worst_servable < best_unservable, (policy, count, order)
            key = [hami_score(annotations[name], count, policy) for name in order]
            assert (key[worst_servable] != key[best_unservable]), (policy, count, "tie", order, key)
            checked += 1
    assert checked, "the random cluster had no size that some node could serve and another could not"


def test_full_and_failed_nodes_lose_to_an_empty_one(make_node):
    rng = random.Random(0)
    empty_host = make_node("8xC500")
    empty = DeviceState(empty_host)
    empty.refresh()
    full = DeviceState(make_node("8xC500"))
    full.refresh()
    failed_host = make_node("8xC500")
    failed = DeviceState(failed_host)
    failed.refresh()
    generator.fail_gpu(failed_host, rng.randrange(8), "bus")
    failed.refresh()
    nodes = {
        "empty": node_annotations(empty.snapshot(), frozenset()),
        "full": node_annotations(full.snapshot(), frozenset(d.id for d in full.snapshot().devices)),
        "failed": node_annotations(failed.snapshot(), frozenset()),
    }
    assert hami_order(nodes, 8, "binpack")[0] == "empty"
    assert hami_order(nodes, 8, "spread")[0] == "empty"
    for count in range(1, 8):
        # one failed GPU still serves up to 7; the full node serves nothing
        assert hami_order(nodes, count, "binpack")[-1] == "full"
        assert hami_order(nodes, count, "spread")[-1] == "full"
    # The tables published before issue 12 (keys only up to the free count, {} when none is free)
    # made exactly this go wrong: the check above has teeth.
    old = {name: dict(tables, **{key: _keys_up_to_free(tables[key], tables) for key in
                                 (C.ANNOTATION_SCORES, C.ANNOTATION_LOSSES)})
           for name, tables in nodes.items()}
    assert hami_score(old["full"], 8, "binpack") >= hami_score(old["empty"], 8, "binpack")
    assert hami_order(old, 1, "binpack")[0] == "full"


def _keys_up_to_free(table: str, annotations: Dict[str, str]) -> str:
    free = SimNode("old", annotations).free
    return json.dumps({key: value for key, value in json.loads(table).items() if int(key) <= free})
