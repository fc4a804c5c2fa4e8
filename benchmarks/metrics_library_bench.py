# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""gpu-aware's metrics on its hot path: prometheus_client against the writer gpu-aware had, in one run.

    PYTHONPATH=.build/collections .venv/bin/python benchmarks/metrics_library_bench.py [--rounds 15]

Which metrics library every agent uses was decided by this measurement
(docs/design-decisions.md, benchmarks/results/metrics-library.md). Both sides
are measured in the same process, interleaved round by round:

* ``prometheus_client``: gpu-aware's :class:`ExtenderMetrics` as shipped
  (kubelet/metrics.py);
* ``hand-written``: the Prometheus text writer gpu-aware used before
  (formerly extender/metrics.py), kept below as the reference, with the same
  families.

Measured:

* **per request**: the metric updates of one filter request, exactly those
  the server and the service make (requests, duration, nodes passed and
  failed); and of one prioritize (requests, duration);
* **per scrape**: one ``/metrics`` exposition of every gpu-aware family,
  populated as after a day of traffic (both verbs, four status codes, both
  watched resources);
* **baseline**, in the same run, metrics included (what a request costs
  anyway): the cheapest request kube-scheduler sends, ``POST /filter`` with
  10 node names (``nodeCacheCapable: true``) over HTTP/1.1 keep-alive to the
  real server on loopback, timed at the client; and the service's filter
  decision alone on 10 names (the worst case for the metrics' share) and on
  1,000 full Nodes (``nodeCacheCapable: false``).

Printed: microseconds (median of the rounds' means), prometheus_client over
hand-written, and the difference as a share of each baseline.

And for gpu-exporter, which renders every scrape from a reading
(``exporter/render.py``): the render of a 16-GPU, 64-VF node's reading (the
node of benchmarks/exporter_bench.py) against prometheus_client writing the
very same families (parsed back from the render and handed to it as a
collector): prometheus_client's formatting alone, a lower bound of what the
exporter would pay with it.

Last, gpu-aware's RSS after importing the agent and building its metrics, in a
fresh process, with prometheus_client and with its import blocked.
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import gc
import http.client
import json
import logging
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Dict, List, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
COLLECTIONS = os.path.join(REPO, ".build", "collections")
for _path in (COLLECTIONS, os.path.join(REPO, "tests", "unit", "extender")):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from extender_support import extender_args, gpu_pod, make_node  # noqa: E402

from ansible_collections.metax.gpu.plugins.module_utils.extender.cache import NodeCache, WeightsHolder  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.extender.nodeinfo import StateCache  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.extender.server import ExtenderHTTPServer  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.extender.metrics import ExtenderMetrics  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.extender.policy import Weights  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.extender.service import ExtenderService  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.exporter.collect import NodeReader  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.exporter.render import ExporterState, render  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.kubelet.metrics import HAS_PROMETHEUS  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.sim.spec import preset  # noqa: E402


# -- the reference: gpu-aware's former hand-written writer (its counters, gauges, histograms) --------------
def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _format_value(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


class _Metric:
    kind = "untyped"

    def __init__(self, name: str, help_text: str, labels: Sequence[str] = ()) -> None:
        self.name, self.help, self.labels = name, help_text, tuple(labels)
        self._lock = threading.Lock()

    def _label_text(self, values: Tuple[str, ...], extra: str = "") -> str:
        parts = ['%s="%s"' % (k, _escape(v)) for k, v in zip(self.labels, values)]
        if extra:
            parts.append(extra)
        return "{%s}" % ",".join(parts) if parts else ""

    def _check(self, values: Tuple[str, ...]) -> Tuple[str, ...]:
        if len(values) != len(self.labels):
            raise ValueError("%s takes labels %s" % (self.name, self.labels))
        return tuple(str(v) for v in values)

    def samples(self) -> List[str]:
        raise NotImplementedError

    def render(self) -> str:
        return "\n".join(["# HELP %s %s" % (self.name, self.help), "# TYPE %s %s" % (self.name, self.kind)]
                         + self.samples())


class HandCounter(_Metric):
    kind = "counter"

    def __init__(self, name: str, help_text: str, labels: Sequence[str] = ()) -> None:
        super().__init__(name, help_text, labels)
        self._values: Dict[Tuple[str, ...], float] = {} if self.labels else {(): 0.0}

    def inc(self, *values: str, amount: float = 1.0) -> None:
        key = self._check(values)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def samples(self) -> List[str]:
        with self._lock:
            items = sorted(self._values.items())
        return ["%s%s %s" % (self.name, self._label_text(k), _format_value(v)) for k, v in items]


class HandGauge(HandCounter):
    kind = "gauge"

    def set(self, *values: str, value: float) -> None:
        key = self._check(values)
        with self._lock:
            self._values[key] = float(value)


class HandHistogram(_Metric):
    kind = "histogram"

    def __init__(self, name: str, help_text: str, labels: Sequence[str] = (),
                 buckets: Sequence[float] = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)) -> None:
        super().__init__(name, help_text, labels)
        self.buckets = tuple(sorted(buckets))
        self._series: Dict[Tuple[str, ...], List[float]] = {}

    def observe(self, *values: str, value: float) -> None:
        key = self._check(values)
        position = bisect.bisect_left(self.buckets, value)
        with self._lock:
            series = self._series.get(key)
            if series is None:
                series = self._series[key] = [0.0] * (len(self.buckets) + 2)
            if position < len(self.buckets):
                series[position] += 1
            series[-2] += 1
            series[-1] += value

    def samples(self) -> List[str]:
        out: List[str] = []
        with self._lock:
            items = sorted((k, list(v)) for k, v in self._series.items())
        for key, series in items:
            cumulative = 0.0
            for bound, count in zip(self.buckets, series):
                cumulative += count
                out.append("%s_bucket%s %s" % (self.name, self._label_text(key, 'le="%s"' % _format_value(bound)),
                                               _format_value(cumulative)))
            out.append("%s_bucket%s %s" % (self.name, self._label_text(key, 'le="+Inf"'), _format_value(series[-2])))
            out.append("%s_count%s %s" % (self.name, self._label_text(key), _format_value(series[-2])))
            out.append("%s_sum%s %s" % (self.name, self._label_text(key), _format_value(series[-1])))
        return out


class HandMetrics:
    """gpu-aware's families in the former writer (names, labels and help as they were)."""

    def __init__(self) -> None:
        self.requests = HandCounter("gpu_aware_requests_total", "HTTP requests by verb and status code.",
                                    ("verb", "code"))
        self.duration = HandHistogram("gpu_aware_request_duration_seconds", "Time to answer filter/prioritize.",
                                      ("verb",))
        self.nodes = HandCounter("gpu_aware_filter_nodes_total", "Nodes judged by filter, by result.", ("result",))
        self.weight = HandGauge("gpu_aware_weight", "Weight in use, by name (score, loss).", ("name",))
        self.config_valid = HandGauge("gpu_aware_config_valid", "1 when the last ConfigMap read was applied.")
        self.config_errors = HandCounter("gpu_aware_config_errors_total", "ConfigMap values rejected.")
        self.config_reloads = HandCounter("gpu_aware_config_reloads_total", "Weights changes applied.")
        self.cache_nodes = HandGauge("gpu_aware_node_cache_nodes", "Nodes in the node cache.")
        self.cache_synced = HandGauge("gpu_aware_node_cache_synced", "1 once the node cache has listed the nodes.")
        self.watch_restarts = HandCounter("gpu_aware_watch_restarts_total", "List/watch reconnects.", ("resource",))
        self.relists = HandCounter("gpu_aware_relists_total", "Full lists, by resource.", ("resource",))
        self.annotation_errors = HandCounter("gpu_aware_annotation_errors_total", "Unusable annotations.")
        self._all: List[_Metric] = [self.requests, self.duration, self.nodes, self.weight, self.config_valid,
                                    self.config_errors, self.config_reloads, self.cache_nodes, self.cache_synced,
                                    self.watch_restarts, self.relists, self.annotation_errors]
        self.config_valid.set(value=1)

    def exposition(self) -> bytes:
        return ("\n".join(m.render() for m in self._all) + "\n").encode("utf-8")


# -- the two sides: a request's updates, a day's population --------------------------------------------
def hand_filter(m: HandMetrics) -> None:
    m.nodes.inc("passed", amount=9)
    m.nodes.inc("failed", amount=1)
    m.requests.inc("filter", "200")
    m.duration.observe("filter", value=0.0031)


def hand_prioritize(m: HandMetrics) -> None:
    m.requests.inc("prioritize", "200")
    m.duration.observe("prioritize", value=0.0012)


def prom_filter(m: ExtenderMetrics) -> None:
    m.nodes.labels("passed").inc(9)
    m.nodes.labels("failed").inc(1)
    m.requests.labels("filter", "200").inc()
    m.duration.labels("filter").observe(0.0031)


def prom_prioritize(m: ExtenderMetrics) -> None:
    m.requests.labels("prioritize", "200").inc()
    m.duration.labels("prioritize").observe(0.0012)


def populate(hand: HandMetrics, prom: ExtenderMetrics) -> None:
    rng = random.Random(3)
    for _request in range(2000):
        verb = rng.choice(("filter", "prioritize"))
        code = rng.choice(("200", "200", "200", "400", "500", "rejected"))
        took = rng.expovariate(500.0)
        hand.requests.inc(verb, code)
        hand.duration.observe(verb, value=took)
        prom.requests.labels(verb, code).inc()
        prom.duration.labels(verb).observe(took)
    for result in ("passed", "failed", "unresolvable"):
        hand.nodes.inc(result, amount=100)
        prom.nodes.labels(result).inc(100)
    for resource in ("nodes", "configmap"):
        hand.watch_restarts.inc(resource)
        hand.relists.inc(resource)
        prom.watch_restarts.labels(resource).inc()
        prom.relists.labels(resource).inc()
    for name, value in (("score", 1.0), ("loss", 1.0)):
        hand.weight.set(name, value=value)
        prom.weight.labels(name).set(value)
    hand.cache_nodes.set(value=1000)
    prom.cache_nodes.set(1000)


def per_call_us(fn: Callable[[], object], calls: int) -> float:
    started = time.perf_counter()
    for _call in range(calls):
        fn()
    return (time.perf_counter() - started) / calls * 1e6


def exporter_sides() -> Tuple[Callable[[], object], Callable[[], object], int]:
    """(render, prometheus_client writing the same families, series) on exporter_bench's node."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families
    base = preset("16xC500")
    spec = dataclasses.replace(base, name="16xC550-sriov", gpus=tuple(
        dataclasses.replace(g, product="C550", sriov_totalvfs=8) for g in base.gpus))
    host = generator.create(os.path.join(tempfile.mkdtemp(prefix="metrics-bench-"), "node"), spec)
    for gpu in generator.load_state(host)["gpus"]:
        host.write_attribute("sys/bus/pci/devices/%s/sriov_numvfs" % gpu["bdf"], "4")
    reader = NodeReader(host, 10.0)
    reading = reader.read()
    state = ExporterState(runs=reader.runs.snapshot(), readings=1, scrapes=1, age_seconds=1.0)
    text = render("bench", reading, state)
    families = list(text_string_to_metric_families(text))

    class Same:  # pylint: disable=too-few-public-methods
        def collect(self) -> list:
            return families

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Same())
    series = sum(len(f.samples) for f in families)
    return (lambda: render("bench", reading, state).encode("utf-8")), (lambda: generate_latest(registry)), series


RSS_PROBE = """
import sys
if sys.argv[1] == "blocked":
    sys.modules["prometheus_client"] = None
import ansible_collections.metax.gpu.plugins.module_utils.agents.gpu_aware
from ansible_collections.metax.gpu.plugins.module_utils.extender.metrics import ExtenderMetrics
metrics = ExtenderMetrics()
print([line.split()[1] for line in open("/proc/self/status") if line.startswith("VmRSS:")][0])
"""


def rss_mib(side: str) -> float:
    """VmRSS of a fresh process that imported gpu-aware and built its metrics (``side``: prom or blocked)."""
    env = dict(os.environ, PYTHONPATH=COLLECTIONS)
    return int(subprocess.check_output([sys.executable, "-c", RSS_PROBE, side], env=env)) / 1024.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=20000, help="metric updates per round and side")
    args = parser.parse_args()
    if not HAS_PROMETHEUS:
        raise SystemExit("prometheus_client is not installed (requirements/agents.txt)")
    log = logging.getLogger("bench")
    log.setLevel(logging.WARNING)
    rng = random.Random(7)
    nodes = [make_node(i, rng) for i in range(1000)]
    names = extender_args(gpu_pod(2), names=[n["metadata"]["name"] for n in nodes[:10]])
    full = extender_args(gpu_pod(2), nodes)
    service_metrics = ExtenderMetrics()
    states = StateCache()
    cache = NodeCache(states, service_metrics, log)
    cache.replace(json.loads(json.dumps(nodes[:10])))
    weights = WeightsHolder(Weights(1, 1, "flags"), service_metrics, log, "ns")
    service = ExtenderService(weights, service_metrics, log, nodes=cache, states=states)
    server = ExtenderHTTPServer(("127.0.0.1", 0), service, service_metrics, log)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)

    def post() -> None:
        conn.request("POST", "/filter", body=names, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200 or b'"Error":""' not in resp.read().replace(b" ", b""):
            raise SystemExit("filter failed: %d" % resp.status)

    hand, prom = HandMetrics(), ExtenderMetrics()
    populate(hand, prom)
    scraped = {"hand-written": hand.exposition(), "prometheus_client": prom.exposition()}
    work: Dict[str, Callable[[], object]] = {
        "POST 10 names": post,
        "decide 10 names": lambda: service.filter(names),
        "decide 1000 nodes": lambda: service.filter(full),
    }
    calls = {"POST 10 names": 200, "decide 10 names": 500, "decide 1000 nodes": 3}
    sides = {
        "filter updates": (lambda: hand_filter(hand), lambda: prom_filter(prom), args.calls),
        "prioritize updates": (lambda: hand_prioritize(hand), lambda: prom_prioritize(prom), args.calls),
        "scrape": (hand.exposition, prom.exposition, max(20, args.calls // 100)),
    }
    exporter_render, exporter_prom, exporter_series = exporter_sides()
    sides["exporter scrape"] = (exporter_render, exporter_prom, max(5, args.calls // 2000))
    for fn in work.values():
        fn()
    results: Dict[str, List[float]] = {}
    gc.collect()
    for round_ in range(args.rounds):
        for name, fn in work.items():
            results.setdefault(name, []).append(per_call_us(fn, calls[name]))
        for name, (hand_fn, prom_fn, count) in sides.items():
            order = [("hand-written", hand_fn), ("prometheus_client", prom_fn)]
            for side, fn in (order if round_ % 2 == 0 else order[::-1]):
                results.setdefault("%s/%s" % (name, side), []).append(per_call_us(fn, count))
    conn.close()
    server.graceful_stop(1.0)
    med = {k: statistics.median(v) for k, v in results.items()}
    bases = [(name, med[name]) for name in work]
    print("gpu-aware metrics: prometheus_client against the former hand-written writer, %d rounds (median of means)"
          % args.rounds)
    print("baselines: " + ", ".join("%s %.0f us" % (name, value) for name, value in bases))
    print("%-20s %9s %9s %10s %15s %17s %19s" % ("", "hand us", "prom us", "prom/hand", "delta/POST 10",
                                                 "delta/decide 10", "delta/decide 1000"))
    for name in sides:
        h, p = med["%s/hand-written" % name], med["%s/prometheus_client" % name]
        if name.startswith("exporter"):     # another agent: gpu-aware's requests are no baseline of it
            print("%-20s %9.2f %9.2f %9.2fx %15s %17s %19s" % (name, h, p, p / h, "-", "-", "-"))
            continue
        print("%-20s %9.2f %9.2f %9.2fx %14.2f%% %16.2f%% %18.3f%%" % (
            (name, h, p, p / h) + tuple(100.0 * (p - h) / value for _name, value in bases)))
    print("exporter scrape: %d series of 16 GPUs and 64 VFs; 'hand' is exporter/render.py, 'prom' formats the same "
          "families" % exporter_series)
    print("scrape size: hand-written %d bytes, prometheus_client %d bytes (its _created series included)"
          % (len(scraped["hand-written"]), len(scraped["prometheus_client"])))
    rss = {side: statistics.median(rss_mib(side) for _run in range(3)) for side in ("blocked", "prom")}
    print("gpu-aware's RSS after import (median of 3): %.2f MiB with prometheus_client, %.2f MiB with it blocked "
          "(+%.2f MiB)" % (rss["prom"], rss["blocked"], rss["prom"] - rss["blocked"]))
    print("a scrape every 15 s costs prometheus_client %.4f%% of one core (hand-written %.4f%%)"
          % (med["scrape/prometheus_client"] / 15e6 * 100, med["scrape/hand-written"] / 15e6 * 100))
    return 0


if __name__ == "__main__":
    sys.exit(main())
