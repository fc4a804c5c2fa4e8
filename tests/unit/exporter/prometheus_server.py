# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Debian's prometheus (requirements/system.txt) scraping one gpu-exporter, for tests."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request

import yaml
from ports import free_port

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
CHART_FILES = os.path.join(REPO, "files", "charts", "metax-gpu-extensions", "files")
RULES = os.path.join(CHART_FILES, "gpu-exporter-rules.yaml")
DASHBOARD = os.path.join(CHART_FILES, "gpu-exporter-dashboard.json")
OUTPUT = os.path.join(REPO, "tests", "output")


def wait(predicate, timeout, what, interval=0.5):
    deadline = time.monotonic() + timeout
    while True:
        found = predicate()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError("timed out after %ss waiting for %s" % (timeout, what))
        time.sleep(interval)


class Prometheus:
    """prometheus on 127.0.0.1, scraping ``target`` every second (job gpu-exporter) with the chart's rules."""

    def __init__(self, target):
        binary = shutil.which("prometheus")
        assert binary, "prometheus is missing: Debian's prometheus package (requirements/system.txt; scripts/deps.sh)"
        self.dir = tempfile.mkdtemp(prefix="metax-prometheus-")
        self.started = time.monotonic()
        self.port = free_port()
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [RULES],
            "scrape_configs": [{"job_name": "gpu-exporter", "honor_labels": True,
                                "static_configs": [{"targets": [target]}]}],
        }
        path = os.path.join(self.dir, "prometheus.yml")
        with open(path, "w") as handle:
            yaml.safe_dump(config, handle)
        self.log_path = os.path.join(self.dir, "prometheus.log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [binary, "--config.file=" + path, "--storage.tsdb.path=" + os.path.join(self.dir, "data"),
             "--web.listen-address=127.0.0.1:%d" % self.port, "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT)
        try:
            wait(self.ready, 120, "prometheus ready")      # generous: a loaded CI machine starts it slowly
        except AssertionError:
            self.stop()
            raise

    def ready(self):
        if self.proc.poll() is not None:
            with open(self.log_path) as handle:
                raise AssertionError("prometheus exited %s: %s" % (self.proc.returncode, handle.read()[-2000:]))
        try:
            return urllib.request.urlopen("http://127.0.0.1:%d/-/ready" % self.port, timeout=30).status == 200
        except OSError:
            return False

    def age(self):
        return time.monotonic() - self.started

    def query(self, promql):
        url = "http://127.0.0.1:%d/api/v1/query?%s" % (self.port, urllib.parse.urlencode({"query": promql}))
        body = json.loads(urllib.request.urlopen(url, timeout=60).read().decode())
        assert body["status"] == "success", body
        return body["data"]["result"]

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def values(result):
    """{bdf: value} of a query result."""
    return {r["metric"].get("bdf", ""): float(r["value"][1]) for r in result}
