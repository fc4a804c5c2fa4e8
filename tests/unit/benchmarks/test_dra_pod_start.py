# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""benchmarks/dra_pod_start.py's pure parts: the pod's own timestamps, the statistics and ratios, the opt-in.

The figures come from the local cluster (tests/integration/test_dra_pod_start_cluster.py, run by the
benchmark with METAX_BENCH_POD_START=1); here what decides them without one, and that the cluster module
is skipped -- allow-listed, also under CI -- unless asked for.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "benchmarks")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)

import dra_pod_start as B  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
MODULE = "tests/integration/test_dra_pod_start_cluster.py"


def pod(created="2026-11-28T20:00:00Z", scheduled="2026-11-28T20:00:00Z", started="2026-11-28T20:00:03Z",
        ready="2026-11-28T20:00:04Z"):
    """A Running pod as the API server serves it (JSON, RFC 3339 timestamps in whole seconds)."""
    conditions = [{"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": started},
                  {"type": "Initialized", "status": "True", "lastTransitionTime": created},
                  {"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": ready or started},
                  {"type": "ContainersReady", "status": "True" if ready else "False",
                   "lastTransitionTime": ready or started},
                  {"type": "PodScheduled", "status": "True", "lastTransitionTime": scheduled}]
    return {"metadata": {"name": "dra-1-abc123", "creationTimestamp": created},
            "status": {"phase": "Running", "conditions": conditions,
                       "containerStatuses": [{"name": "main", "ready": bool(ready),
                                              "state": {"running": {"startedAt": started}}}]}}


def test_timestamps_are_the_apis_rfc3339_in_utc():
    assert B.parse_time("2026-11-28T20:00:03Z") - B.parse_time("2026-11-28T20:00:00Z") == 3
    assert B.parse_time("2026-11-28T20:00:00Z") == B.parse_time("2026-11-28T20:00:00+00:00")
    assert B.parse_time("2026-11-28T21:00:00+01:00") == B.parse_time("2026-11-28T20:00:00Z")


def test_server_times_count_from_the_creation_timestamp():
    times = B.server_times(pod())
    assert times == {"scheduled_s": 0.0, "started_s": 3.0, "ready_s": 4.0}


def test_a_condition_not_true_yet_and_a_container_not_running_are_none():
    times = B.server_times(pod(ready=None))
    assert times["ready_s"] is None and times["started_s"] == 3.0
    waiting = pod()
    waiting["status"]["containerStatuses"][0]["state"] = {"waiting": {"reason": "ContainerCreating"}}
    waiting["status"]["conditions"] = []
    assert B.server_times(waiting) == {"scheduled_s": None, "started_s": None, "ready_s": None}
    assert B.server_times({"metadata": {"creationTimestamp": "2026-11-28T20:00:00Z"}})["started_s"] is None


def sample(path, gpus, running, started, warmup=False, bound=0.1):
    return {"path": path, "gpus": gpus, "warmup": warmup, "running_s": running, "bound_s": bound,
            "started_s": started, "scheduled_s": 0.0, "create_call_s": 0.01}


def run_of(pods=4):
    """Device plugin at 1.0..1.3 s (1 GPU) and 2.0..2.3 s (4 GPUs); DRA twice that; one slow warm-up each."""
    samples = []
    for path, factor in ((B.PLUGIN, 1.0), (B.DRA, 2.0)):
        samples.append(sample(path, 1, 30.0, 30, warmup=True))
        for k in range(pods):
            samples.append(sample(path, 1, factor * (1.0 + k / 10.0), factor))
            samples.append(sample(path, 4, factor * (2.0 + k / 10.0), 2 * factor, bound=0.2 * factor))
    return samples


def test_the_warm_up_pods_are_left_out_and_p50_p99_are_nearest_rank():
    rows = B.summarise(run_of())["rows"]
    plugin_1 = rows["%s/1" % B.PLUGIN]["running_s"]
    assert plugin_1["n"] == 4 and plugin_1["p50"] == 1.2 and plugin_1["p99"] == 1.3 and plugin_1["max"] == 1.3
    assert math.isclose(plugin_1["mean"], 1.15)
    assert rows["%s/4" % B.DRA]["started_s"]["p50"] == 4


def test_the_ratios_are_dra_over_the_device_plugin_per_size():
    ratios = B.summarise(run_of())["ratios"]
    for size in B.SIZES:
        got = ratios[str(size)]
        assert math.isclose(got["running_s_p50"], 2.0) and math.isclose(got["running_s_p99"], 2.0)
        assert math.isclose(got["started_s_p50"], 2.0)
    assert math.isclose(ratios["4"]["bound_s_p50"], 2.0) and math.isclose(ratios["1"]["bound_s_p50"], 1.0)


def test_a_path_without_samples_gives_nan_not_an_error():
    summary = B.summarise([s for s in run_of() if s["path"] == B.PLUGIN])
    assert summary["rows"]["%s/1" % B.DRA]["running_s"]["n"] == 0
    assert math.isnan(summary["ratios"]["1"]["running_s_p50"])
    lines = B.report({"summary": summary, "samples": []})
    assert any(line.startswith(B.DRA) and "nan" in line for line in lines)
    # a run cut short after its first leg: its JSON has the samples, no summary yet
    partial = B.report({"samples": [s for s in run_of() if s["path"] == B.PLUGIN]})
    table = [line for line in lines if line.startswith((B.DRA, B.PLUGIN, "  "))]
    assert len(table) == 7 and [line for line in partial if line.startswith((B.DRA, B.PLUGIN, "  "))] == table


def test_the_report_has_both_paths_per_size_the_ratios_and_the_legs():
    samples = run_of()
    result = {"machine": "2 x test", "kubernetes": "v1.36.3", "node": "vm-0", "preset": "8xC500", "pods": 4,
              "plugin_halves": [2, 2], "poll_seconds": 0.2, "samples": samples, "summary": B.summarise(samples),
              "legs": [{"path": B.PLUGIN, "seconds": 40.0, "load_start": 3.1, "load_end": 3.3}],
              "switches": [{"to": "dra", "seconds": 35.2}]}
    lines = B.report(result)
    rows = [line.split() for line in lines if line.startswith((B.DRA, B.PLUGIN))]
    assert [(r[0], r[1]) for r in rows] == [(B.DRA, "1"), (B.PLUGIN, "1"), (B.DRA, "4"), (B.PLUGIN, "4")]
    assert [r[4] for r in rows] == ["2.40", "1.20", "4.40", "2.20"]       # client p50
    assert "  1 GPU: created -> Running (client) p50 x2.00, p99 x2.00" in "\n".join(lines)
    assert any(line.startswith("warm-up pods") and "30.00 s" in line for line in lines)
    assert any(line.startswith("switches: to dra 35 s") for line in lines)


EXPOSITION = """# HELP gpu_aware_filter_nodes_total Nodes judged by filter, by result (passed, failed, unresolvable).
# TYPE gpu_aware_filter_nodes_total counter
gpu_aware_filter_nodes_total{result="passed"} 11.0
gpu_aware_filter_nodes_created{result="passed"} 1.7953e+09
gpu_aware_request_duration_seconds_count{verb="filter"} 12.0
gpu_aware_request_duration_seconds_sum{verb="filter"} 0.0246
"""


def test_a_help_line_is_no_sample():
    text = ("# HELP gpu_aware_node_cache_synced 1 once the node cache has listed the nodes.\n"
            "# TYPE gpu_aware_node_cache_synced gauge\ngpu_aware_node_cache_synced 0.0\n")
    assert B.sample_value(text, "gpu_aware_node_cache_synced") == 0
    assert B.sample_value(text.replace("synced 0.0", "synced 1.0"), "gpu_aware_node_cache_synced") == 1


def test_a_sample_of_gpu_awares_metrics_by_name_and_labels():
    assert B.sample_value(EXPOSITION, 'gpu_aware_filter_nodes_total{result="passed"}') == 11
    assert B.sample_value(EXPOSITION, 'gpu_aware_request_duration_seconds_sum{verb="filter"}') == 0.0246
    assert B.sample_value(EXPOSITION, 'gpu_aware_filter_nodes_total{result="failed"}') == 0
    assert B.sample_value(EXPOSITION, "gpu_aware_filter_nodes_total") == 0


def test_the_extenders_share_is_reported_from_the_device_plugins_legs():
    legs = [{"path": B.PLUGIN, "seconds": 40.0, "load_start": 3.0, "load_end": 3.0, "filter_requests": 9,
             "filter_seconds": 0.018},
            {"path": B.DRA, "seconds": 80.0, "load_start": 3.0, "load_end": 3.0},
            {"path": B.PLUGIN, "seconds": 40.0, "load_start": 3.0, "load_end": 3.0, "filter_requests": 11,
             "filter_seconds": 0.022}]
    lines = B.report({"samples": run_of(), "legs": legs})
    assert "gpu-aware's filter (inside the device plugin's figures): 20 requests, mean 2.0 ms" in lines


def test_the_opt_in_and_the_pod_count():
    assert not B.enabled({}) and not B.enabled({B.OPT_IN: "0"}) and not B.enabled({B.OPT_IN: "false"})
    assert B.enabled({B.OPT_IN: "1"}) and B.enabled({B.OPT_IN: "yes"})
    assert B.pods_per_size({}) == B.DEFAULT_PODS == 10 and B.pods_per_size({B.PODS_ENV: "6"}) == 6
    with pytest.raises(ValueError):
        B.pods_per_size({B.PODS_ENV: "1"})
    assert B.halves(10) == (5, 5) and B.halves(7) == (3, 4)
    assert B.sequence(3) == [1, 4, 1, 4, 1, 4]


def collect(ci, opt_in):
    env = {k: v for k, v in os.environ.items() if k not in ("CI", B.OPT_IN)}
    env["PYTHONPATH"] = os.path.join(REPO, ".build", "collections")
    if ci:
        env["CI"] = "true"
    if opt_in:
        env[B.OPT_IN] = "1"
    # --collect-only: the cluster is never brought up (tests/integration/conftest.py)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q", "-rs",
                           MODULE], cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_the_cluster_module_is_skipped_unless_asked_for_also_under_ci():
    proc = collect(ci=True, opt_in=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 5, out            # no tests collected, no error: the skip is allow-listed
    assert "SKIPPED" in out and "an opt-in benchmark" in out, out
    proc = collect(ci=True, opt_in=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "4 tests collected" in out, out
    assert "test_dra_pod_start_cluster.py::test_the_figures" in out, out
