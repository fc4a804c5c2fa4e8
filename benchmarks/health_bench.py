# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""GPU health (issue 42, Measure): the cost of a reading, detection latency per signal, recovery to Allocatable.

    PYTHONPATH=.build/collections .venv/bin/python benchmarks/health_bench.py \\
        [--interval 5] [--reps 40] [--parallel 1] [--rows SIGNAL,...] [--readings 20] [--json OUT]
    .venv/bin/python benchmarks/health_bench.py --merge OUT1.json OUT2.json ...

On simulated 8xC500 nodes (plugins/module_utils/sim; the simulator's mx-smi is
a Python script, so its CPU is not a real mx-smi's: the runs are counted too).

1. **The cost of a reading** (``--readings`` of them, interleaved): one
   ``DeviceState.refresh`` without the monitor -- the four old checks, the
   baseline measured in the same run -- against one ``HealthMonitor.step``
   after it (ECC, PCI events, RAS, MetaXLink AER from ``mx-smi -j`` and
   ``--count-ecc``, EIDs from the kernel log, which gains 50 ordinary lines
   per reading). Wall time and CPU time: the process's
   (``time.process_time``) plus its children's (``RUSAGE_CHILDREN``: mx-smi
   is a subprocess); mx-smi runs counted per argument. Per reading, and per
   minute at ``--interval`` (the chart's ``gpuDevice.healthyInterval``, 5 s).
2. **Detection latency per row** of the policy's default table: a
   ``GpuDeviceAgent`` (``pod_resources_socket=None``, no kubelet, no API
   server) per round on a fresh node, its ``health_loop`` in a thread; each
   row's fault injected at a random moment within one interval after the
   loop started; the time until the agent's scan shows it: a finding of the
   row's action in the monitor's decision and, for ``device-unhealthy``
   rows, the GPU's devices Unhealthy in the state the kubelet is sent
   (``DeviceState.snapshot``). Timed at the return of the agent's
   ``apply_health_policy`` (wrapped, not replaced). Up to eight per-GPU rows
   share a round (one GPU each); ``driver-not-loaded`` and
   ``mx-smi-unresponsive`` concern the whole node and have a round of their
   own. The kubelet's part (ListAndWatch to the node's Allocatable, its
   node-status update) is not in this figure:
   tests/integration/test_gpu_health_cluster.py prints the cluster's
   ("health: <signal> detected in N s", "health: recovery to allocatable 8
   in N s").
3. **Recovery**: once a row was detected, its fault is undone at a random
   moment within the next interval (``sim recover``: counters zeroed as a
   driver reload does, the GPU back on the bus or available, the driver
   loaded or bound again, mx-smi answering); the time until the GPU is
   offered again (``device-unhealthy`` rows) or its finding is gone (the
   others). The rounds run with the policy's ``holdOffSeconds`` 0 (the
   shipped ``recoveryReadings`` 3 kept): with the shipped 300 s hold-off a
   counter row recovers ~300 s after its last bad reading, which is
   arithmetic, not worth a measurement. EIDs are events that age out of
   their row's window (600 s): no recovery measured.

``--json`` writes every sample; ``--merge`` prints the tables of several such
files (runs split by ``--rows`` to keep each short).
"""

from __future__ import annotations

import argparse
import heapq
import json
import logging
import os
import random
import resource
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
COLLECTIONS = os.path.join(REPO, ".build", "collections")
if COLLECTIONS not in sys.path:
    sys.path.insert(0, COLLECTIONS)

from ansible_collections.metax.gpu.plugins.module_utils.agents.gpu_device import GpuDeviceAgent  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.deviceplugin.containers import \
    discover_for_containers  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.deviceplugin.devices import DeviceState  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.health import policy as P  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.health.monitor import HealthMonitor  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.host import HostRoot  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.sim import signals as sim_signals  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.sim.spec import preset  # noqa: E402

PRESET = "8xC500"
GPUS = 8
CHART_INTERVAL = 5          # files/charts/metax-gpu-extensions/values.yaml gpuDevice.healthyInterval
LOG_LINES_PER_READING = 50
NODE_WIDE = ("driver-not-loaded", "mx-smi-unresponsive")
NO_RECOVERY = ("eid-driver", "eid-sdk")      # events: they age out of the row's window


# -- pure helpers (tests/unit/benchmarks/test_health_bench.py) -------------------------------
def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest rank: the smallest value with at least ``fraction`` of the values at or below it."""
    if not values:
        raise ValueError("no values")
    if not 0.0 <= fraction <= 1.0:
        raise ValueError("fraction %r is not within 0..1" % fraction)
    ordered = sorted(values)
    rank = max(1, -(-int(round(fraction * len(ordered) * 1e6)) // 1000000))   # ceil, robust to float noise
    return ordered[min(rank, len(ordered)) - 1]


@dataclass(frozen=True)
class Summary:
    n: int
    p50: float
    p99: float
    max: float


def summarize(values: Sequence[float]) -> Optional[Summary]:
    if not values:
        return None
    return Summary(len(values), percentile(values, 0.5), percentile(values, 0.99), max(values))


def per_minute(per_reading: float, interval: float, reading_seconds: float = 0.0) -> float:
    """A reading's cost times the readings in a minute: the loop waits ``interval`` after each reading."""
    if interval <= 0:
        raise ValueError("the interval must be positive")
    return per_reading * 60.0 / (interval + reading_seconds)


@dataclass(frozen=True)
class Row:
    """One row of the default table, as the benchmark injects it."""

    label: str
    signal: str
    action: str
    amount: int            # what is injected: the row's threshold or rate (1 for a state)
    node_wide: bool

    @property
    def recovers(self) -> bool:
        return self.signal not in NO_RECOVERY


def default_rows(rules: Sequence[P.Rule] = P.DEFAULT_RULES) -> Tuple[Row, ...]:
    """Every row of the shipped table; a signal with several rows gets its threshold/rate in the label."""
    per_signal: Dict[str, int] = {}
    for rule in rules:
        per_signal[rule.signal] = per_signal.get(rule.signal, 0) + 1
    rows = []
    for rule in rules:
        amount = int(rule.threshold if rule.threshold is not None else (rule.rate or 1))
        label = rule.signal
        if per_signal[rule.signal] > 1:
            label += " >=%d" % amount if rule.threshold is not None else " +%d" % amount
        rows.append(Row(label, rule.signal, rule.action, amount, rule.signal in NODE_WIDE))
    return tuple(rows)


def plan_rounds(rows: Sequence[Row], reps: int, rng: random.Random, gpus: int = GPUS) -> List[List[Row]]:
    """Rounds of trials: each per-GPU row ``reps`` times, up to ``gpus`` different rows per round (one GPU
    each); each node-wide row ``reps`` times, alone in its round."""
    rounds: List[List[Row]] = []
    per_gpu = [r for r in rows if not r.node_wide]
    pending = {r.label: reps for r in per_gpu}
    while any(pending.values()):
        # the rows with the most repetitions left first: the rounds stay full
        order = sorted(per_gpu, key=lambda r: (-pending[r.label], rng.random()))
        chosen = [r for r in order if pending[r.label] > 0][:gpus]
        for r in chosen:
            pending[r.label] -= 1
        rounds.append(chosen)
    rounds.extend([r] for r in rows if r.node_wide for _rep in range(reps))
    rng.shuffle(rounds)
    return rounds


# -- faults ------------------------------------------------------------------------------
_ECC = {"ecc-sram-correctable": "sram_correctable", "ecc-sram-uncorrectable": "sram_uncorrectable",
        "ecc-dram-correctable": "dram_correctable", "ecc-dram-uncorrectable": "dram_uncorrectable",
        "ecc-retired-pages": "retired_dbe"}
_PCI = {"pci-aer-ue": "aer_ue", "pci-aer-ce": "aer_ce", "pci-synfld": "synfld", "pci-dbe": "dbe", "pci-mmio": "mmio"}
_RAS = {"ras-uncorrected": "uncorrected", "ras-corrected": "corrected"}
BROKEN_MX_SMI = "#!/bin/sh\necho 'mx-smi: cannot open /dev/mxcd: no such device' >&2\nexit 1\n"


def inject(host: HostRoot, row: Row, index: int) -> None:
    signal, n = row.signal, row.amount
    if signal in _ECC:
        sim_signals.inject_signals(host, index, ecc={_ECC[signal]: n})
    elif signal in _PCI:
        sim_signals.inject_signals(host, index, pci_events={_PCI[signal]: n})
    elif signal in _RAS:
        sim_signals.inject_signals(host, index, ras={_RAS[signal]: n})
    elif signal in ("mxlk-aer-ue", "mxlk-aer-ce"):
        sim_signals.inject_signals(host, index, mxlk_aer={"0": {signal[-2:]: n}})
    elif signal in ("eid-driver", "eid-sdk"):
        for _eid in range(n):
            sim_signals.add_eid(host, index, 1021 if signal == "eid-driver" else 3005, sdk=signal == "eid-sdk")
    elif signal == "gpu-lost":
        generator.fail_gpu(host, index, "bus")
    elif signal == "gpu-not-available":
        generator.fail_gpu(host, index, "smi")
    elif signal == "driver-unbound":
        generator.unbind_metax(host, generator.load_state(host)["gpus"][index]["sysfs"])
    elif signal == "driver-not-loaded":
        generator.unload_driver(host)
    elif signal == "mx-smi-unresponsive":
        real = host.join(generator.MX_SMI_PATH)
        os.rename(real, real + ".real")
        with open(real, "w") as handle:
            handle.write(BROKEN_MX_SMI)
        os.chmod(real, 0o755)
    else:
        raise ValueError("no way to inject %s" % signal)


def restore(host: HostRoot, row: Row, index: int) -> None:
    signal = row.signal
    if signal in ("gpu-lost", "gpu-not-available"):
        generator.recover_gpu(host, index)
    elif signal == "driver-unbound":
        generator.bind_metax(host, generator.load_state(host)["gpus"][index]["sysfs"])
    elif signal == "driver-not-loaded":
        generator.load_driver(host)
    elif signal == "mx-smi-unresponsive":
        real = host.join(generator.MX_SMI_PATH)
        os.replace(real + ".real", real)
    else:
        sim_signals.clear_signals(host, index)      # what a driver reload does to the counters


# -- 1. the cost of a reading -------------------------------------------------------------
class CountingHost(HostRoot):
    """The node's host root, counting the mx-smi runs per argument (instrumentation: the run is real)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.runs: Dict[str, int] = {}
        self._lock = threading.Lock()

    def run(self, argv, timeout=30.0):
        key = " ".join(argv[1:]) or "(table)"
        with self._lock:
            self.runs[key] = self.runs.get(key, 0) + 1
        return super().run(argv, timeout)


def cpu_seconds() -> Tuple[float, float]:
    """(this process's CPU, that of its children waited for: mx-smi)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time(), children.ru_utime + children.ru_stime


def ordinary_kernel_lines(count: int, seq: int) -> str:
    return "".join("Nov 28 20:00:%02d sim-node kernel: [%12.6f] eth0: link up, 25Gbps (seq %d)\n"
                   % (i % 60, seq + i * 0.001, seq + i) for i in range(count))


@dataclass
class Cost:
    wall: List[float] = field(default_factory=list)
    cpu: List[float] = field(default_factory=list)          # the agent's and mx-smi's
    agent_cpu: List[float] = field(default_factory=list)    # the agent's alone (parsing, evaluating)
    runs: Dict[str, int] = field(default_factory=dict)


def measure_cost(work: str, readings: int) -> Tuple[Cost, Cost]:
    """(baseline: DeviceState.refresh alone, HealthMonitor.step after it), interleaved reading by reading."""
    host = CountingHost(generator.create(os.path.join(work, "cost-node"), preset(PRESET)).path)
    log = host.join(sim_signals.KERNEL_LOG)
    os.makedirs(os.path.dirname(log), exist_ok=True)
    with open(log, "a") as handle:
        handle.write(ordinary_kernel_lines(5000, 0))        # history, read from its end: not news
    state = DeviceState(host, check_health=True, discover_fn=discover_for_containers)
    state.refresh()                                          # the first, full scan (topology) is not a reading
    monitor = HealthMonitor(host)

    def step_once() -> None:
        assert state.latest is not None
        monitor.step(state.latest, state.lost_gpus())
    step_once()                                              # the reader's first reading: counters' baselines
    base, step = Cost(), Cost()
    for n in range(readings):
        with open(log, "a") as handle:
            handle.write(ordinary_kernel_lines(LOG_LINES_PER_READING, 10000 + n * LOG_LINES_PER_READING))
        for cost, action in ((base, state.refresh), (step, step_once)):
            before_runs = dict(host.runs)
            c0, t0 = cpu_seconds(), time.perf_counter()
            action()
            cost.wall.append(time.perf_counter() - t0)
            c1 = cpu_seconds()
            cost.cpu.append(c1[0] + c1[1] - c0[0] - c0[1])
            cost.agent_cpu.append(c1[0] - c0[0])
            for key, count in host.runs.items():
                cost.runs[key] = cost.runs.get(key, 0) + count - before_runs.get(key, 0)
    shutil.rmtree(host.path, ignore_errors=True)
    return base, step


# -- 2 and 3. detection and recovery ------------------------------------------------------
@dataclass
class Trial:
    row: Row
    index: int
    bdf: str
    device_ids: Tuple[str, ...] = ()
    inject_at: Optional[float] = None
    detected_at: Optional[float] = None
    detect_scan_started: Optional[float] = None
    restore_at: Optional[float] = None
    recovered_at: Optional[float] = None

    def shows_fault(self, decision, snapshot) -> bool:
        if decision is None:
            return False
        finding = any(f.bdf == self.bdf and f.signal == self.row.signal and f.rule.action == self.row.action
                      for f in decision.findings)
        if not finding or self.row.action not in (P.DEVICE_UNHEALTHY, P.QUARANTINE):
            return finding
        devices = [d for d in snapshot.devices if d.gpu_bdf == self.bdf]
        return bool(devices) and not any(d.healthy for d in devices)

    def cleared(self, decision, snapshot) -> bool:
        if decision is None or any(f.bdf == self.bdf and f.signal == self.row.signal for f in decision.findings):
            return False
        if self.row.action in (P.DEVICE_UNHEALTHY, P.QUARANTINE):
            devices = [d for d in snapshot.devices if d.gpu_bdf == self.bdf]
            return len(devices) >= 1 and all(d.healthy for d in devices)
        return True


def run_round(work: str, rows: Sequence[Row], interval: int, policy_path: str, rng: random.Random,
              timeout: float, recovery: bool = True) -> List[Trial]:
    root = tempfile.mkdtemp(prefix="round-", dir=work)
    host = HostRoot(generator.create(os.path.join(root, "node"), preset(PRESET)).path)
    gpus = generator.load_state(host)["gpus"]
    indexes = rng.sample(range(len(gpus)), len(rows))
    trials = [Trial(row, i, gpus[i]["bdf"]) for row, i in zip(rows, indexes)]
    agent = GpuDeviceAgent(host, host.join("dp"), healthy_interval=interval, pod_resources_socket=None,
                           health_policy=policy_path)
    agent.first_scan()
    cond = threading.Condition()
    real_refresh, real_apply = agent.state.refresh, agent.apply_health_policy
    scan_started = [0.0]

    def refresh() -> bool:
        scan_started[0] = time.monotonic()
        return real_refresh()

    def apply() -> bool:
        changed = real_apply()
        now = time.monotonic()
        decision, snap = agent.health_monitor.last if agent.health_monitor else None, agent.state.snapshot()
        with cond:
            for t in trials:
                if t.inject_at is not None and t.detected_at is None and t.shows_fault(decision, snap):
                    t.detected_at, t.detect_scan_started = now, scan_started[0]
                elif t.restore_at is not None and t.recovered_at is None and t.cleared(decision, snap):
                    t.recovered_at = now
            cond.notify_all()
        return changed

    agent.state.refresh = refresh            # type: ignore[method-assign]
    agent.apply_health_policy = apply        # type: ignore[method-assign]
    thread = threading.Thread(target=agent.health_loop, name="health", daemon=True)
    thread.start()
    started = time.monotonic()
    events: List[Tuple[float, int, str]] = [(started + rng.uniform(0, interval), k, "inject")
                                            for k in range(len(trials))]
    heapq.heapify(events)
    deadline = started + timeout
    try:
        while time.monotonic() < deadline:
            with cond:
                for k, t in enumerate(trials):        # each detected fault is undone within the next interval
                    if recovery and t.detected_at is not None and t.row.recovers and t.restore_at is None \
                            and not any(e[1] == k and e[2] == "restore" for e in events):
                        heapq.heappush(events, (t.detected_at + rng.uniform(0, interval), k, "restore"))
                if all((t.recovered_at is not None) if recovery and t.row.recovers else (t.detected_at is not None)
                       for t in trials):
                    break
                if not events or events[0][0] > time.monotonic():
                    wait = (events[0][0] if events else deadline) - time.monotonic()
                    cond.wait(max(0.0, min(wait, deadline - time.monotonic())))
                    continue
                _at, k, what = heapq.heappop(events)
                t = trials[k]
                # the moment the fault begins (or ends) is stamped before the simulator writes it
                if what == "inject":
                    t.inject_at = time.monotonic()
                else:
                    t.restore_at = time.monotonic()
            # outside the lock: the agent's scan is not held up by the simulator's write
            (inject if what == "inject" else restore)(host, t.row, t.index)
    finally:
        agent.stop.set()
        thread.join(timeout + 30)
        shutil.rmtree(root, ignore_errors=True)
    return trials


def samples_of(trials: Sequence[Trial]) -> List[dict]:
    out = []
    for t in trials:
        out.append({"row": t.row.label, "action": t.row.action,
                    "detect": None if t.detected_at is None or t.inject_at is None else t.detected_at - t.inject_at,
                    "scan": None if t.detected_at is None or t.detect_scan_started is None
                    else t.detected_at - t.detect_scan_started,
                    "recover": None if t.recovered_at is None or t.restore_at is None
                    else t.recovered_at - t.restore_at})
    return out


# -- output ----------------------------------------------------------------------------------
def cost_table(base: Cost, step: Cost, interval: int) -> List[str]:
    readings = len(base.wall)
    b_wall, s_wall = statistics.median(base.wall), statistics.median(step.wall)
    b_cpu, s_cpu = statistics.median(base.cpu), statistics.median(step.cpu)
    both_runs = {k: base.runs.get(k, 0) + step.runs.get(k, 0) for k in set(base.runs) | set(step.runs)}
    lines = ["1. the cost of a reading, 8 GPUs, %d readings (median; CPU = process + mx-smi children)" % readings,
             "%-40s %9s %9s %12s %14s" % ("", "wall ms", "CPU ms", "mx-smi runs", "CPU s / min"),
             "%-40s %9.1f %9.1f %12.1f %14.2f" % ("four old checks (refresh, baseline)", b_wall * 1e3, b_cpu * 1e3,
                                                  sum(base.runs.values()) / readings,
                                                  per_minute(b_cpu, interval, b_wall)),
             "%-40s %9.1f %9.1f %12.1f %14.2f" % ("HealthMonitor.step (the new signals)", s_wall * 1e3, s_cpu * 1e3,
                                                  sum(step.runs.values()) / readings,
                                                  per_minute(s_cpu, interval, s_wall)),
             "%-40s %9.1f %9.1f %12.1f %14.2f" % ("a reading now (both)", (b_wall + s_wall) * 1e3,
                                                  (b_cpu + s_cpu) * 1e3,
                                                  (sum(base.runs.values()) + sum(step.runs.values())) / readings,
                                                  per_minute(b_cpu + s_cpu, interval, b_wall + s_wall)),
             "of which the agent's own CPU (parsing, evaluating; not mx-smi): baseline %.1f ms, step %.1f ms"
             % (statistics.median(base.agent_cpu) * 1e3, statistics.median(step.agent_cpu) * 1e3),
             "ratios: step / baseline wall %.2fx, CPU %.2fx; a reading now / before: CPU %.2fx"
             % (s_wall / b_wall, s_cpu / b_cpu, (b_cpu + s_cpu) / b_cpu),
             "mx-smi runs per minute at a %d s interval: %.0f before, %.0f now (%s)"
             % (interval, per_minute(sum(base.runs.values()) / readings, interval, b_wall),
                per_minute((sum(base.runs.values()) + sum(step.runs.values())) / readings, interval, b_wall + s_wall),
                ", ".join("%s %.1f" % (k, v / readings) for k, v in sorted(both_runs.items()) if v)
                + " per reading")]
    return lines


def latency_table(samples: Sequence[dict], interval: float) -> List[str]:
    order = [r.label for r in default_rows()]
    by_row: Dict[str, List[dict]] = {}
    for s in samples:
        by_row.setdefault(s["row"], []).append(s)
    fmt = "%-30s %-17s %4s %7s %7s %7s %9s %5s %7s %7s"
    lines = ["2/3. detection and recovery per row, interval %g s (seconds; scan = the detecting reading's own time)"
             % interval,
             fmt % ("row", "action", "n", "p50", "p99", "max", "scan p50", "n", "rec p50", "rec p99")]
    everything = []
    for label in sorted(by_row, key=lambda l: order.index(l) if l in order else len(order)):
        rows = by_row[label]
        det = summarize([s["detect"] for s in rows if s["detect"] is not None])
        scan = summarize([s["scan"] for s in rows if s["scan"] is not None])
        rec = summarize([s["recover"] for s in rows if s["recover"] is not None])
        missed = sum(1 for s in rows if s["detect"] is None)
        everything += [s["detect"] for s in rows if s["detect"] is not None]
        lines.append(fmt % (label, rows[0]["action"], det.n if det else 0,
                            "%.2f" % det.p50 if det else "-", "%.2f" % det.p99 if det else "-",
                            "%.2f" % det.max if det else "-", "%.3f" % scan.p50 if scan else "-",
                            rec.n if rec else 0, "%.2f" % rec.p50 if rec else "-", "%.2f" % rec.p99 if rec else "-")
                     + ("  (%d not detected)" % missed if missed else ""))
    total = summarize(everything)
    if total:
        lines.append("all rows: n %d, p50 %.2f s, p99 %.2f s, max %.2f s (the interval alone: p50 %.2f, p99 %.2f)"
                     % (total.n, total.p50, total.p99, total.max, interval / 2, interval * 0.99))
    return lines


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=int, default=CHART_INTERVAL,
                        help="gpu-device's --healthy-interval (default: the chart's, %(default)s s)")
    parser.add_argument("--reps", type=int, default=40, help="trials per row (default %(default)s)")
    parser.add_argument("--parallel", type=int, default=1, help="rounds (nodes and agents) at once")
    parser.add_argument("--rows", default="", help="only these rows (labels or signals, comma-separated)")
    parser.add_argument("--readings", type=int, default=20, help="readings for the cost (0: skip it)")
    parser.add_argument("--no-recovery", action="store_true", help="detection only: a round ends at its detections")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--json", default="", help="write every sample here")
    parser.add_argument("--merge", nargs="*", help="print the tables of earlier --json files and stop")
    args = parser.parse_args(argv)
    samples: List[dict] = []
    errors: List[str] = []
    if args.merge:
        intervals = set()
        for path in args.merge:
            with open(path) as handle:
                doc = json.load(handle)
            samples += doc["samples"]
            intervals.add(doc["interval"])
            for line in doc.get("cost", []):
                print(line)
        if len(intervals) != 1:
            raise SystemExit("the files are of different intervals: %s" % sorted(intervals))
        print("\n".join(latency_table(samples, intervals.pop())))
        return 0
    logging.disable(logging.CRITICAL)       # the agent's log lines are not the subject (and not free)
    rng = random.Random(args.seed)
    work = tempfile.mkdtemp(prefix="health-bench-")
    print("GPU health benchmark: simulated %s, interval %d s, %d vCPU, load average %s"
          % (PRESET, args.interval, os.cpu_count() or 0, " ".join("%.2f" % v for v in os.getloadavg())))
    cost: List[str] = []
    if args.readings:
        cost = cost_table(*measure_cost(work, args.readings), interval=args.interval)
        print("\n".join(cost))
    wanted = {w.strip() for w in args.rows.split(",") if w.strip()}
    rows = [r for r in default_rows() if not wanted or r.label in wanted or r.signal in wanted]
    if rows and args.reps:
        policy_path = os.path.join(work, "policy.json")
        with open(policy_path, "w") as handle:
            json.dump({"holdOffSeconds": 0}, handle)
        rounds = plan_rounds(rows, args.reps, rng)
        timeout = 10.0 * args.interval + 20
        seeds = [rng.randrange(1 << 30) for _r in rounds]
        lock = threading.Lock()
        todo = list(zip(rounds, seeds))
        t0 = time.monotonic()

        def worker() -> None:
            while True:
                with lock:
                    if not todo:
                        return
                    round_rows, seed = todo.pop()
                try:
                    trials = run_round(work, round_rows, args.interval, policy_path, random.Random(seed), timeout,
                                       not args.no_recovery)
                except Exception as exc:  # pylint: disable=broad-except  # reported below: no silent gaps
                    with lock:
                        errors.append("round %s: %r" % ([r.label for r in round_rows], exc))
                    continue
                with lock:
                    samples.extend(samples_of(trials))

        workers = [threading.Thread(target=worker) for _w in range(max(1, args.parallel))]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        print("%d rounds (%d at once) in %.0f s; load average now %s" % (
            len(rounds), args.parallel, time.monotonic() - t0, " ".join("%.2f" % v for v in os.getloadavg())))
        print("\n".join(latency_table(samples, args.interval)))
        for error in errors:
            print("FAILED %s" % error)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"interval": args.interval, "cost": cost, "samples": samples,
                       "loadavg": os.getloadavg()}, handle, indent=1)
    shutil.rmtree(work, ignore_errors=True)
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
