# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The DRA benchmarks' pure parts (benchmarks/dra_*.py): what they read, compare and build.

Their figures come from a private control plane (make -C benchmarks dra); here
only what decides those figures without one: the index mapping between the
allocator benchmark's synthetic nodes and the simulated ones, the first-fit
prediction, the verdicts, the histogram quantiles, the manifests. No timing.
"""

from __future__ import annotations

import os
import random
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "benchmarks")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)

import compare_go  # noqa: E402
import dra_choice_bench as C  # noqa: E402
import dra_common as D  # noqa: E402
import dra_scale_bench as SC  # noqa: E402

from ansible_collections.metax.gpu.plugins.module_utils.gpu.model import LinkClass  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.sim.spec import preset  # noqa: E402


@pytest.fixture(scope="module")
def cases():
    return compare_go.build_cases(random.Random(7), 12)


def node_named(cases, name):
    return next(r.node for r in cases if r.node.name == name)


def test_the_allocator_benchmark_has_69_requests_whose_nodes_keep_their_spec(cases):
    assert sum(len(r.sizes) for r in cases) == 69
    assert all(r.node.spec.gpus and r.node.vfs in (0, 4, 8) for r in cases)


def test_a_node_the_simulator_numbers_differently_maps_pair_by_pair(cases, tmp_path):
    """dual-board 16: the simulator's PCI order is not the spec's (boards span both sockets)."""
    node = node_named(cases, "dual-board 16")
    sim = C.simulate(node, str(tmp_path / "n"))
    assert sorted(sim.names) == list(range(16)) and len(set(sim.names.values())) == 16
    assert [sim.index_of[n] for n in sim.order] != list(range(16))     # not the identity
    # spec GPUs 4-7 (board 0, socket 1) and 8-11 (board 1, socket 0): same board is MetaXLink
    group = {i: sim.attrs[sim.names[i]]["metaxLinkGroup"] for i in range(16)}
    assert len({group[i] for i in range(8)}) == 1 and group[0] != group[8]
    assert node.topology.link(0, 4) == LinkClass.MX


def test_vfs_map_to_gpu_times_vfs_plus_vf(cases, tmp_path):
    node = node_named(cases, "2xC550 x4 VFs")
    sim = C.simulate(node, str(tmp_path / "n"))
    assert sim.device_class == D.VF_CLASS
    pf = [sim.attrs[sim.names[i]]["physicalFunction"] for i in range(8)]
    assert len(set(pf[:4])) == 1 and len(set(pf[4:])) == 1 and pf[0] != pf[4]


def test_first_fit_takes_the_first_fitting_devices_in_slice_order(cases, tmp_path):
    sim = C.simulate(node_named(cases, "8xC500"), str(tmp_path / "n"))
    names = [sim.names[i] for i in range(8)]
    free = names[1:4] + names[5:]                       # 0 and 4 taken
    assert C.first_fit(sim, free, 2, D.ATTR_GROUP, None) == [names[1], names[2]]
    assert C.first_fit(sim, free, 4, D.ATTR_GROUP, None) is None          # no group has four free
    assert C.first_fit(sim, free, 4, None, None) == names[1:4] + [names[5]]
    assert C.first_fit(sim, free, 2, D.ATTR_GROUP, names[6]) == [names[5], names[6]]
    # a device without the attribute never matches it (physicalFunction is a VF's)
    assert C.first_fit(sim, free, 2, D.ATTR_PF, None) is None


def test_verdicts_name_the_term_that_differs(cases):
    node = node_named(cases, "8xC500")
    free = list(range(8))
    assert C.verdict(node, free, [0, 1], [1, 0]) == ("same", "")
    assert C.verdict(node, free, [0, 1], [4, 5]) == ("equivalent", "")
    worse, why = C.verdict(node, free, [0, 1], [3, 4])
    assert worse == "worse" and why == "worst link SYS, optimum MX"
    assert C.verdict(node, free, [3, 4], [0, 1])[0] == "better"
    # the same worst link and pair weights; taking 2 of a whole group damages more than 0 and 1 of a broken one
    worse, why = C.verdict(node, [0, 1, 2, 4, 5, 6, 7], [0, 1], [4, 5])
    theirs, ours = [int(w.strip(",")) for w in why.split() if w.strip(",").isdigit()]
    assert worse == "worse" and why.startswith("damage to the free GPUs") and theirs > ours


def test_the_ladder_goes_from_the_tightest_attribute_to_none(cases, tmp_path):
    sim = C.simulate(node_named(cases, "4xN100"), str(tmp_path / "n"))
    assert C.ladder_of(sim, 1) == (None,)
    assert C.ladder_of(sim, 2) == C.GPU_LADDER and C.GPU_LADDER[-1] is None
    what_if = C.simulate(node_named(cases, "4xN100"), str(tmp_path / "w"), switch_attribute=True)
    ladder = C.ladder_of(what_if, 2)
    assert ladder.index(C.ATTR_SWITCH) == ladder.index(D.ATTR_ROOT) - 1
    switches = {what_if.attrs[what_if.names[i]]["pcieSwitch"] for i in range(4)}
    assert len(switches) == 2                            # two switches of two GPUs (the preset)
    published = what_if.slices("n")[0]["spec"]["devices"]
    assert all("pcieSwitch" in d["attributes"] for d in published)
    assert all("pcieSwitch" not in d["attributes"] for d in sim.slices("n")[0]["spec"]["devices"])


def test_a_prioritized_claim_lists_every_rung_and_constrains_each(cases):
    request, constraints = D.prioritized_request("gpus", 3, C.GPU_LADDER, also=["must"])
    assert [s["name"] for s in request["firstAvailable"]] == ["t0", "t1", "t2", "t3"]
    assert all(s["count"] == 3 and s["deviceClassName"] == D.GPU_CLASS for s in request["firstAvailable"])
    assert constraints == [{"requests": ["must", "gpus/t%d" % i], "matchAttribute": a}
                           for i, a in enumerate(C.GPU_LADDER) if a]
    claim = D.claim_manifest("c", [request], constraints=constraints)
    assert claim["spec"]["devices"]["constraints"] == constraints
    plain = D.claim_manifest("c", [D.device_request("gpus", 4)], D.ATTR_GROUP)
    assert plain["spec"]["devices"]["constraints"] == [{"requests": ["gpus"], "matchAttribute": D.ATTR_GROUP}]


def test_pods_ask_through_a_claim_or_the_extended_resource():
    dra = D.pod_manifest("p", "n1", claim="c")
    assert dra["spec"]["resourceClaims"] == [{"name": "gpus", "resourceClaimName": "c"}]
    assert dra["spec"]["containers"][0]["resources"]["claims"] == [{"name": "gpus"}]
    assert dra["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "n1"}
    dp = D.pod_manifest("p", gpus=4)
    assert dp["spec"]["containers"][0]["resources"]["limits"] == {D.RESOURCE: "4"}
    assert "nodeSelector" not in dp["spec"] and "resourceClaims" not in dp["spec"]
    assert D.node_manifest("n", gpus=8)["status"]["allocatable"][D.RESOURCE] == "8"
    assert D.RESOURCE not in D.node_manifest("n")["status"]["capacity"]


def test_the_fleet_slices_are_gpu_dras_with_identifiers_unique_per_node(tmp_path):
    template = D.node_slices("template", D.simulated_inventory(str(tmp_path / "n"), preset("8xC500")))
    assert len(template) == 1 and len(template[0]["spec"]["devices"]) == 8
    a, b = SC.per_node_devices(template, "fake-1"), SC.per_node_devices(template, "fake-2")
    assert a[0]["spec"]["nodeName"] == a[0]["spec"]["pool"]["name"] == "fake-1"
    assert a[0]["metadata"]["name"] == D.S.slice_name("fake-1", 0)
    uuids = {d["attributes"]["uuid"]["string"] for s in a + b for d in s["spec"]["devices"]}
    assert len(uuids) == 16
    assert template[0]["spec"]["nodeName"] == "template"        # the template is left as it was


BEFORE = """# HELP x
scheduler_scheduling_attempt_duration_seconds_bucket{profile="p",result="scheduled",le="0.001"} 1
scheduler_scheduling_attempt_duration_seconds_bucket{profile="p",result="scheduled",le="0.002"} 1
scheduler_scheduling_attempt_duration_seconds_bucket{profile="p",result="scheduled",le="0.004"} 1
scheduler_scheduling_attempt_duration_seconds_bucket{profile="p",result="scheduled",le="+Inf"} 1
scheduler_scheduling_attempt_duration_seconds_sum{profile="p",result="scheduled"} 0.0005
scheduler_scheduling_attempt_duration_seconds_count{profile="p",result="scheduled"} 1
scheduler_scheduling_attempt_duration_seconds_bucket{profile="p",result="unschedulable",le="+Inf"} 7
scheduler_scheduling_attempt_duration_seconds_count{profile="p",result="unschedulable"} 7
"""
AFTER = """scheduler_scheduling_attempt_duration_seconds_bucket{profile="p",result="scheduled",le="0.001"} 1
scheduler_scheduling_attempt_duration_seconds_bucket{profile="p",result="scheduled",le="0.002"} 51
scheduler_scheduling_attempt_duration_seconds_bucket{profile="p",result="scheduled",le="0.004"} 101
scheduler_scheduling_attempt_duration_seconds_bucket{profile="p",result="scheduled",le="+Inf"} 101
scheduler_scheduling_attempt_duration_seconds_sum{profile="p",result="scheduled"} 0.2005
scheduler_scheduling_attempt_duration_seconds_count{profile="p",result="scheduled"} 101
scheduler_scheduling_attempt_duration_seconds_bucket{profile="p",result="unschedulable",le="+Inf"} 9
scheduler_scheduling_attempt_duration_seconds_count{profile="p",result="unschedulable"} 9
"""


def test_histogram_quantiles_of_one_run_interpolate_inside_the_buckets():
    h = D.histogram(AFTER, BEFORE, "scheduler_scheduling_attempt_duration_seconds", {"result": "scheduled"})
    assert h.count == 100 and h.mean_ms == pytest.approx(2.0)
    assert h.p50_ms == pytest.approx(2.0)            # the 50th of 100 ends the (1, 2] ms bucket
    assert h.p99_ms == pytest.approx(3.96)           # 49 of 50 into the (2, 4] ms bucket
    assert D.histogram(AFTER, AFTER, "scheduler_scheduling_attempt_duration_seconds", {}).count == 0


def test_percentile_is_the_nearest_rank():
    assert D.percentile(list(range(1, 101)), 50) == 51
    assert D.percentile([3.0], 99) == 3.0
