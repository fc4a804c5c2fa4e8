# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The topology-table contract (issue 12) over presets and synthetic topologies up to 16 x 8 VFs."""

from __future__ import annotations

import random

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.gpu.allocator import MAX_LOSS, bounded_loss, per_count_tables
from ansible_collections.metax.gpu.plugins.module_utils.sim import alloc_synth
from ansible_collections.metax.gpu.plugins.module_utils.sim.spec import PRESETS, preset


def _cases():
    for name in sorted(PRESETS):
        yield name, 0
    yield "16xC500", 8


@pytest.mark.parametrize("name,vfs", list(_cases()))
def test_published_values_bounded_and_order_preserved(name, vfs):
    topology = alloc_synth.topology_from_spec(preset(name), vfs=vfs)
    rng = random.Random(12)
    total = vfs * len(preset(name).gpus) if vfs else len(preset(name).gpus)
    for _round in range(3):
        free = sorted(rng.sample(range(total), rng.randint(1, total)))
        scores, losses = per_count_tables(topology, free)
        assert sorted(scores) == list(range(1, len(free) + 1))
        for n in scores:
            assert 0 <= scores[n] <= 1000
            assert 0 <= bounded_loss(losses[n]) < MAX_LOSS
        # order of sizes kept: raw a <= b implies published a <= b
        ordered = sorted(losses.values())
        assert [bounded_loss(v) for v in ordered] == sorted(bounded_loss(v) for v in ordered)
