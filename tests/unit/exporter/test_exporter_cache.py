# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""One reading per interval shared by concurrent scrapers; a slow reading never holds a scrape."""

from __future__ import annotations

import os
import sys
import threading
import time
import urllib.request

from ansible_collections.metax.gpu.plugins.module_utils.exporter.cache import SharedReading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "agents"))
from agent_process import agent_env  # noqa: E402

GUARD = 60.0     # a join that needs this long means a hung scrape: the test fails, it does not time anything


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class Reader:
    """Counts readings; ``gate`` (when set) holds each reading until the test opens it."""

    def __init__(self, gate=None):
        self.calls = 0
        self.gate = gate
        self.entered = threading.Event()
        self._lock = threading.Lock()

    def __call__(self):
        with self._lock:
            self.calls += 1
            number = self.calls
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(GUARD)
        return "reading-%d" % number


def scrape_all(cache, count):
    results = [None] * count
    start = threading.Barrier(count)

    def one(i):
        start.wait(GUARD)
        results[i] = cache.get()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(GUARD)
        assert not thread.is_alive(), "a scrape hung"
    return results


def test_concurrent_scrapes_share_one_reading_per_interval():
    clock, reader = Clock(), Reader()
    cache = SharedReading(reader, interval=15.0, wait=GUARD, clock=clock)
    assert scrape_all(cache, 20) == ["reading-1"] * 20
    assert reader.calls == 1
    clock.now += 14.9
    assert scrape_all(cache, 20) == ["reading-1"] * 20 and reader.calls == 1
    clock.now += 0.2
    assert scrape_all(cache, 20) == ["reading-2"] * 20 and reader.calls == 2
    assert cache.started == 2 and cache.age() == 0.0


def test_at_most_one_reading_per_interval_whatever_the_scrape_rate():
    clock, reader = Clock(), Reader()
    cache = SharedReading(reader, interval=10.0, wait=GUARD, clock=clock)
    for _step in range(600):            # ten scrapers every simulated second for a minute
        clock.now += 1.0 / 10
        cache.get()
    assert reader.calls == 6


def test_no_scrapes_no_readings():
    clock, reader = Clock(), Reader()
    SharedReading(reader, interval=1.0, wait=1.0, clock=clock)
    clock.now += 100
    assert reader.calls == 0


def test_a_slow_reading_serves_the_previous_one_and_starts_no_other():
    clock, gate = Clock(), threading.Event()
    reader = Reader()
    cache = SharedReading(reader, interval=15.0, wait=0.05, clock=clock)
    assert cache.get() == "reading-1"
    reader.gate = gate                  # the next mx-smi hangs
    reader.entered.clear()
    clock.now += 20
    assert scrape_all(cache, 10) == ["reading-1"] * 10
    assert reader.entered.wait(GUARD) and cache.running
    clock.now += 20                     # still hanging an interval later: no second reading piles up
    assert scrape_all(cache, 10) == ["reading-1"] * 10
    assert reader.calls == 2
    assert cache.age() == 40.0
    gate.set()
    deadline = time.monotonic() + GUARD
    while cache.running and time.monotonic() < deadline:
        threading.Event().wait(0.01)
    assert cache.get() == "reading-2"


def test_a_failing_reader_keeps_the_last_reading_and_is_retried_next_interval():
    clock = Clock()
    calls = []

    def read():
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("parser bug")
        return "reading-%d" % len(calls)

    cache = SharedReading(read, interval=5.0, wait=GUARD, clock=clock)
    assert cache.get() == "reading-1"
    clock.now += 5
    assert cache.get() == "reading-1" and cache.failed == 1
    clock.now += 5
    assert cache.get() == "reading-3"


def test_agent_process_ten_scrapers_one_mx_smi_reading(make_node):
    """The real agent over HTTP: ten concurrent scrapers, mx-smi run once (json + table) per interval."""
    import socket
    import subprocess

    host = make_node("8xC500")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "ansible_collections.metax.gpu.plugins.module_utils.agents.gpu_exporter",
         "--host-root", host.path, "--port", str(port), "--address", "127.0.0.1", "--interval", "600",
         "--node-name", "n1", "--pod-resources-socket", "", "--log-format", "text"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=agent_env())
    try:
        url = "http://127.0.0.1:%d/metrics" % port
        deadline = time.monotonic() + 120       # the process's start: generous for a loaded CI machine
        while True:
            try:
                urllib.request.urlopen("http://127.0.0.1:%d/healthz" % port, timeout=GUARD).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    break
                threading.Event().wait(0.1)
        scrapers = 10
        bodies = [None] * scrapers

        def one(i):
            bodies[i] = urllib.request.urlopen(url, timeout=GUARD).read().decode()

        for _round in range(3):
            threads = [threading.Thread(target=one, args=(i,)) for i in range(scrapers)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(GUARD)
        for body in bodies:
            assert body is not None and 'metax_gpu_exporter_readings_total{node="n1"} 1' in body
            assert 'metax_gpu_exporter_mx_smi_runs_total{node="n1",command="table",result="ok"} 1' in body
            assert body.count("metax_gpu_healthy{") == 8
        assert 'metax_gpu_exporter_scrapes_total{node="n1"} 30' in "".join(bodies)
    finally:
        proc.terminate()
        out = proc.communicate(timeout=GUARD)[0]
    assert proc.returncode == 0, out.decode()
