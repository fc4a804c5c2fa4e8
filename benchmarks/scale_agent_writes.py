# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""gpu-label and gpu-device API writes per node per hour at steady state, projected to 5,000 nodes.

    flock -o /tmp/metax-cluster.lock env PYTHONPATH=.build/collections:tests \\
        .venv/bin/python benchmarks/scale_agent_writes.py [--nodes 30] [--window 120] [--speedup 10]

The agents' own loops, with their own classes, run in this process against
fake nodes of the scale profile (kwok), each node read through a simulated
root of its preset: gpu-label's ``Labeller`` + ``run_loop`` (interval 60 s)
and gpu-device's ``DeviceState`` health refresh (5 s) feeding its
``AnnotationPublisher`` (resync 300 s), both writing with the kubernetes
client as in their pods. The real nodes are left alone: other tests on the
shared cluster check their labels.

Time runs ``--speedup`` times faster (every interval divided by it), so a
``--window`` of 120 s covers 20 minutes of agent time. After a warm-up (the
first publish of each agent), the window counts

* the agents' own write counters (exact, what each agent sent),
* the apiserver's ``apiserver_request_total`` PATCH on nodes (no
  subresource) -- the whole cluster's, so other writers show up too,
* watch events on the fake nodes that changed a ``metax-tech.com/`` label or
  annotation (writes that changed something),

and projects writes per node per hour to 5,000 nodes. Target: 0 when
nothing changes.
"""

from __future__ import annotations

import http.client
import os
import re
import sys
import tempfile
import threading
import time
import urllib.parse
from typing import Dict, List

import scale_common  # noqa: E402  (first: puts the collection and tests/ on sys.path)

from ansible_collections.metax.gpu.plugins.module_utils.agents import gpu_label  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.agents.common import kube_api_client  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.deviceplugin.annotations import (  # noqa: E402
    AnnotationPublisher, kube_node_annotations, kube_node_patcher, node_annotations)
from ansible_collections.metax.gpu.plugins.module_utils.deviceplugin.devices import DeviceState  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.sim.spec import preset  # noqa: E402
from localcluster import fakenodes  # noqa: E402
from localcluster.settings import from_env  # noqa: E402
from scale import scheduling  # noqa: E402
from scale.profile import ScaleProfile  # noqa: E402

LABEL_INTERVAL = 60.0        # gpu-label's default
HEALTH_INTERVAL = 5.0        # gpu-device's default healthy interval
RESYNC = 300.0               # AnnotationPublisher's default resync
PROJECT_TO = 5000


def apiserver_patches(client: fakenodes.ApiClient) -> float:
    conn = http.client.HTTPSConnection(client.host, client.port, context=client.context, timeout=30)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    total = 0.0
    for match in re.finditer(r'^apiserver_request_total\{([^}]*)\}\s+(\S+)$', text, re.M):
        labels = match.group(1)
        if 'resource="nodes"' in labels and 'subresource=""' in labels and 'verb="PATCH"' in labels:
            total += float(match.group(2))
    return total


class OwnedChangeWatch(scheduling.Watch):
    """Counts fake-node events whose metax-tech.com/ labels or annotations changed."""

    def __init__(self, client: fakenodes.ApiClient) -> None:
        self.changes = 0
        self.known: Dict[str, tuple] = {}
        first = client.request("GET", "/api/v1/nodes?" + urllib.parse.urlencode(
            {"labelSelector": fakenodes.SELECTOR, "limit": "1"}))
        for node in client.list_pages("/api/v1/nodes", fakenodes.SELECTOR):
            self.known[node["metadata"]["name"]] = self._owned(node)
        super().__init__(client, "/api/v1/nodes", first["metadata"]["resourceVersion"],
                         {"labelSelector": fakenodes.SELECTOR})

    @staticmethod
    def _owned(node: dict) -> tuple:
        meta = node.get("metadata") or {}
        return tuple(sorted((k, v) for part in ("labels", "annotations") for k, v in (meta.get(part) or {}).items()
                            if k.startswith(fakenodes.OWNED_PREFIX)))

    def seen(self, line: bytes, event: dict) -> None:
        if event.get("type") != "MODIFIED":
            return
        obj = event.get("object") or {}
        name = obj["metadata"]["name"]
        owned = self._owned(obj)
        if self.known.get(name) != owned:
            self.changes += 1
            self.known[name] = owned


class Agents:
    """gpu-label and gpu-device's loops for each fake node (their classes, time sped up)."""

    def __init__(self, prof: ScaleProfile, speedup: float) -> None:
        self.stop = threading.Event()
        self.base = tempfile.mkdtemp(prefix="metax-scale-agents-")
        self.api = kube_api_client(prof.settings.admin_conf)
        hosts = {}
        states: Dict[str, DeviceState] = {}
        self.labellers: List[gpu_label.Labeller] = []
        self.publishers: Dict[str, List[AnnotationPublisher]] = {}
        self.threads: List[threading.Thread] = []
        for node in prof.nodes:
            name = node.profile.preset
            if name not in hosts:
                hosts[name] = generator.create(os.path.join(self.base, name), preset(name))
                states[name] = DeviceState(hosts[name])
                states[name].refresh()
            read, patch = gpu_label.kube_label_access(self.api, node.name)
            labeller = gpu_label.Labeller(hosts[name], "native", read, patch)
            self.labellers.append(labeller)
            self._thread(gpu_label.run_loop, labeller, LABEL_INTERVAL / speedup, self.stop)
            state = states[name]
            publisher = AnnotationPublisher(lambda s=state: node_annotations(s.snapshot(), frozenset()),
                                            kube_node_patcher(self.api, node.name), self.stop,
                                            resync=RESYNC / speedup, read=kube_node_annotations(self.api, node.name))
            self.publishers.setdefault(name, []).append(publisher)
            publisher.start()
        for name, state in states.items():
            self._thread(self._health_loop, state, self.publishers[name], HEALTH_INTERVAL / speedup)

    def _thread(self, target, *args) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        thread.start()
        self.threads.append(thread)

    def _health_loop(self, state: DeviceState, publishers: List[AnnotationPublisher], interval: float) -> None:
        while not self.stop.wait(interval):
            if state.refresh():
                for publisher in publishers:
                    publisher.trigger()

    def writes(self) -> Dict[str, int]:
        return {"gpu-label": sum(lab.writes for lab in self.labellers),
                "gpu-device": sum(p.writes for group in self.publishers.values() for p in group),
                "gpu-device resync reads": sum(p.resync_reads for group in self.publishers.values() for p in group)}

    def close(self) -> None:
        self.stop.set()
        for group in self.publishers.values():
            for publisher in group:
                publisher.join(2.0)


def main() -> int:
    parser = scale_common.arguments(__doc__, sizes=False)
    parser.add_argument("--nodes", type=int, default=30, help="fake nodes running the agents (default %(default)s)")
    parser.add_argument("--window", type=float, default=120.0, help="measured seconds (default %(default)s)")
    parser.add_argument("--speedup", type=float, default=10.0, help="agent time / wall time (default %(default)s)")
    args = parser.parse_args()
    settings = from_env(os.environ)
    with ScaleProfile(settings) as prof:
        prof.grow(args.nodes)
        assert prof.writer is not None
        prof.writer.stop()      # the agents themselves write here
        agents = Agents(prof, args.speedup)
        try:
            warmup = max(LABEL_INTERVAL, HEALTH_INTERVAL * 2) / args.speedup + 5
            time.sleep(warmup)
            before_agents = agents.writes()
            before_api = apiserver_patches(prof.client)
            watch = OwnedChangeWatch(prof.client)
            time.sleep(args.window)
            after_agents = agents.writes()
            after_api = apiserver_patches(prof.client)
            watch.stop()
        finally:
            agents.close()
    agent_hours = args.window * args.speedup / 3600.0
    print("%d fake nodes %s, window %.0f s wall = %.1f min of agent time (speedup x%g), warm-up %.0f s" % (
        args.nodes, fakenodes.counts_by_preset(prof.nodes), args.window, agent_hours * 60, args.speedup, warmup))
    print("%-40s %10s %16s %22s" % ("writer", "writes", "per node per h", "at %d nodes per h" % PROJECT_TO))
    rows = [("gpu-label (agent counter)", after_agents["gpu-label"] - before_agents["gpu-label"]),
            ("gpu-device (agent counter)", after_agents["gpu-device"] - before_agents["gpu-device"]),
            ("gpu-device resync GETs (agent counter)",
             after_agents["gpu-device resync reads"] - before_agents["gpu-device resync reads"]),
            ("apiserver PATCH nodes (cluster)", after_api - before_api),
            ("metax-tech.com/ changes (watch)", watch.changes)]
    for what, count in rows:
        per_node_hour = count / args.nodes / agent_hours
        print("%-40s %10.0f %16.2f %22.0f" % (what, count, per_node_hour, per_node_hour * PROJECT_TO))
    steady_zero = rows[0][1] == 0 and rows[1][1] == 0
    print("steady state writes 0: %s" % ("yes" if steady_zero else "NO"))
    return 0 if steady_zero else 1


if __name__ == "__main__":
    sys.exit(main())
