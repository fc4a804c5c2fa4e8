# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The claim docs/dra.md's Figures show, and the DRA benchmarks' machinery, on a real kube-scheduler.

A private control plane (benchmarks/dra_common.py: etcd, kube-apiserver,
kube-scheduler; no kubelet, the shared local cluster is not needed):

- the Figures' ``firstAvailable`` claim is accepted as written (strict field
  validation) and the scheduler takes its first satisfiable subrequest: a
  whole MetaXLink group on an 8xC500 with GPUs 0 and 1 held, no constraint
  when each group has a GPU held;
- dra_choice_bench on the manual's two examples: the scheduler's sets are
  the allocator's ({4,5,6,7} and {2,3}).
"""

from __future__ import annotations

import os
import random
import re
import sys

import pytest
import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
sys.path.insert(0, os.path.join(ROOT, "tests", "unit"))

import dra_common as D  # noqa: E402
from charts.helm import find_helm  # noqa: E402

from ansible_collections.metax.gpu.plugins.module_utils.sim.spec import preset  # noqa: E402

pytestmark = pytest.mark.skipif(find_helm() is None, reason="helm renders the chart's DeviceClasses")


def figures_claim():
    text = open(os.path.join(ROOT, "docs", "dra.md"), encoding="utf-8").read()
    figures = text[text.index("\n## Figures"):]
    claim = yaml.safe_load(re.search(r"```yaml\n(.*?)```", figures, re.S).group(1))
    claim["metadata"]["namespace"] = D.NAMESPACE
    return claim


@pytest.fixture(scope="module")
def cluster():
    with D.Cluster() as running:
        yield running


def test_the_figures_claim_takes_its_first_satisfiable_subrequest(cluster, tmp_path):
    api = cluster.api
    inventory = D.simulated_inventory(str(tmp_path / "node"), preset("8xC500"))
    names = [d["name"] for d in D.node_slices("x", inventory)[0]["spec"]["devices"]]
    watch = D.PodWatch(api)
    try:
        for node, held, subrequest, expected in (("fig-a", [0, 1], "metaxlink", names[4:]),
                                                 ("fig-b", [0, 4], "any", None)):
            D.create_node(api, D.node_manifest(node))
            for item in D.node_slices(node, inventory):
                api.create("/apis/resource.k8s.io/v1/resourceslices", item)
            D.hold_devices(api, node + "-held", node, [names[i] for i in held])
            claim = figures_claim()
            claim["metadata"]["name"] = node
            api.create(D.claims_path() + "?fieldValidation=Strict", claim)
            api.create(D.pods_path(), D.pod_manifest(node, node, node))
            state, detail = watch.wait(node, timeout=60, settle=5.0)
            assert state == "bound", detail
            results = D.allocation_results(api.request("GET", "%s/%s" % (D.claims_path(), node)))
            assert {r["request"] for r in results} == {"gpus/" + subrequest}
            devices = sorted(r["device"] for r in results)
            assert len(devices) == 4 and not set(devices) & {names[i] for i in held}
            if expected:
                assert devices == sorted(expected)
    finally:
        watch.stop()


def test_the_choice_benchmark_matches_the_allocator_on_the_manuals_examples():
    import compare_go
    import dra_choice_bench
    requests = compare_go.build_cases(random.Random(7), 0)[:2]
    steps, version = dra_choice_bench.run(requests, "first-available", quiet=True)
    assert version.startswith("v1.")
    assert [(s.scheduler, s.optimum, s.verdict, s.first_fit) for s in steps] == [
        ([4, 5, 6, 7], [4, 5, 6, 7], "same", True), ([2, 3], [2, 3], "same", True)]
