# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The node cache, the weights holder and the list+watch loop (fake and real client)."""
from __future__ import annotations

import logging
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.metax.gpu.plugins.module_utils.backoff import Backoff
from ansible_collections.metax.gpu.plugins.module_utils.extender import cache as kube
from ansible_collections.metax.gpu.plugins.module_utils.extender.cache import NodeCache, WeightsHolder
from ansible_collections.metax.gpu.plugins.module_utils.extender.cache import list_watch as ListWatch
from ansible_collections.metax.gpu.plugins.module_utils.kube.client import core_v1
from ansible_collections.metax.gpu.plugins.module_utils.kube.watch import Expired, RawSource
from ansible_collections.metax.gpu.plugins.module_utils.extender.metrics import ExtenderMetrics
from ansible_collections.metax.gpu.plugins.module_utils.extender.nodeinfo import StateCache
from ansible_collections.metax.gpu.plugins.module_utils.extender.policy import Weights
import polling
from extender_support import FakeApiServer, make_node

LOG = logging.getLogger("test")


def wait_for(predicate, timeout=60.0, what="condition"):
    polling.wait_until(predicate, timeout, what, interval=0.02)


def _cm(data, name="gpu-aware-plugin", namespace="ns"):
    return {"metadata": {"name": name, "namespace": namespace}, "data": data}


# ---------------------------------------------------------------- WeightsHolder

def test_weights_holder_applies_rejects_and_reverts(caplog):
    metrics = ExtenderMetrics()
    holder = WeightsHolder(Weights(1, 1, "flags"), metrics, LOG, "ns")
    holder.replace([])                                     # no ConfigMap: the flags
    assert holder.current == Weights(1, 1, "flags")
    holder.apply("ADDED", _cm({"scoreWeight": "4", "lossWeight": "0"}))
    assert (holder.current.score, holder.current.loss) == (4, 0)
    assert metrics.value("gpu_aware_weight", name="score") == 4 and metrics.value("gpu_aware_config_valid") == 1
    with caplog.at_level(logging.ERROR):
        holder.apply("MODIFIED", _cm({"scoreWeight": "lots", "lossWeight": "2"}))
    assert (holder.current.score, holder.current.loss) == (4, 0)        # last good kept
    assert metrics.value("gpu_aware_config_valid") == 0 and metrics.value("gpu_aware_config_errors_total") == 1
    assert "scoreWeight" in holder.last_error and "rejected" in caplog.text
    assert b"gpu_aware_config_valid 0" in metrics.exposition()
    holder.apply("MODIFIED", _cm({"scoreWeight": "2"}))                # lossWeight falls back to the flag
    assert (holder.current.score, holder.current.loss) == (2, 1) and metrics.value("gpu_aware_config_valid") == 1
    holder.apply("MODIFIED", _cm({"scoreWeight": "9"}, name="other"))  # not ours
    assert holder.current.score == 2
    holder.apply("DELETED", _cm({}))
    assert holder.current == Weights(1, 1, "flags")


# --------------------------------------------------------------- ListWatch, fake

class ScriptedSource:
    """A Source whose list/watch answers come from a script."""

    def __init__(self, lists, watches):
        self.lists = list(lists)
        self.watches = list(watches)
        self.calls = []

    def list(self, resource_version=None):
        self.calls.append("list")
        item = self.lists.pop(0) if self.lists else ([], "1")
        if isinstance(item, Exception):
            raise item  # pylint: disable=raising-bad-type
        return item

    def watch(self, version, timeout):
        self.calls.append("watch %s" % version)
        item = self.watches.pop(0) if self.watches else []
        if isinstance(item, Exception):
            raise item  # pylint: disable=raising-bad-type
        for event in item:
            if isinstance(event, Exception):
                raise event
            yield event
        if not self.watches:
            time.sleep(0.05)

    def close(self):
        pass


def _event(kind, name, version, devices_free=8):
    node = make_node(0, allocated=list(range(8 - devices_free)))
    node["metadata"]["name"] = name
    node["metadata"]["resourceVersion"] = version
    return {"type": kind, "object": node}


def test_listwatch_lists_watches_resumes_and_relists():
    metrics = ExtenderMetrics()
    cache = NodeCache(StateCache(), metrics, LOG)
    a = _event("ADDED", "a", "5")["object"]
    source = ScriptedSource(
        lists=[([a], "5"), RuntimeError("apiserver down"), ([a], "20")],
        watches=[[_event("ADDED", "b", "6", 2), {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}}],
                 [_event("MODIFIED", "b", "10", 1), {"type": "ERROR", "object": {"code": 410}}],
                 [_event("DELETED", "a", "21")]])
    lw = ListWatch("nodes", source, cache, metrics, LOG, backoff=Backoff(0.01, 0.02))
    lw.start()
    try:
        wait_for(lambda: len(source.calls) >= 7, what="calls")
    finally:
        lw.stop()
    assert source.calls[:7] == ["list", "watch 5", "watch 9", "list", "list", "watch 20", "watch 21"]
    assert len(cache) == 0          # the relist replaced everything (only a), then a was deleted
    assert metrics.value("gpu_aware_watch_restarts_total", resource="nodes") == 1 and metrics.value("gpu_aware_relists_total", resource="nodes") == 2


def test_listwatch_handler_errors_do_not_stop_it():
    class Broken:
        def __init__(self):
            self.events = 0

        def replace(self, items):
            pass

        def apply(self, kind, obj):
            self.events += 1
            raise ValueError("bug")

    handler = Broken()
    source = ScriptedSource([([], "1")], [[_event("ADDED", "a", "2"), _event("ADDED", "b", "3")]])
    lw = ListWatch("nodes", source, handler, ExtenderMetrics(), LOG, backoff=Backoff(0.01, 0.02)).start()
    try:
        wait_for(lambda: handler.events == 2 and "watch 3" in source.calls, what="events")
    finally:
        lw.stop()


def test_listwatch_expired_list_and_watch_errors():
    metrics = ExtenderMetrics()
    source = ScriptedSource([Expired(), ([], "3")], [RuntimeError("connection reset")])
    cache = NodeCache(StateCache(), metrics, LOG)
    lw = ListWatch("nodes", source, cache, metrics, LOG, backoff=Backoff(0.01, 0.02)).start()
    try:
        wait_for(lambda: source.calls.count("watch 3") >= 2, what="re-watch from the same version")
    finally:
        lw.stop()
    assert cache.synced.is_set() and metrics.value("gpu_aware_watch_restarts_total", resource="nodes") == 1


def test_listwatch_resync_relists():
    source = ScriptedSource([], [])
    metrics = ExtenderMetrics()
    lw = ListWatch("nodes", source, NodeCache(StateCache(), metrics, LOG), metrics, LOG, resync_seconds=1,
                   backoff=Backoff(0.01, 0.02)).start()
    try:
        wait_for(lambda: source.calls.count("list") >= 2, what="resync")
    finally:
        lw.stop()


# ------------------------------------------------------ real client, fake server

@pytest.fixture
def fake_api(tmp_path):
    server = FakeApiServer().start()
    yield server
    server.stop()


@pytest.fixture
def api_client(fake_api, tmp_path):
    pytest.importorskip("kubernetes")
    from ansible_collections.metax.gpu.plugins.module_utils.kube.client import api_client
    return api_client(fake_api.kubeconfig(str(tmp_path / "kubeconfig")))


def test_kube_source_nodes_through_the_kubernetes_client(fake_api, api_client):
    metrics = ExtenderMetrics()
    cache = NodeCache(StateCache(), metrics, LOG)
    for i in range(3):
        fake_api.set("nodes", make_node(i, allocated=[]))
    lw = ListWatch("nodes", kube.node_source(api_client), cache, metrics, LOG, watch_seconds=2,
                   backoff=Backoff(0.05, 0.1)).start()
    try:
        wait_for(lambda: len(cache) == 3, what="initial list")
        fake_api.set("nodes", make_node(1, allocated=[0, 1, 2]))
        wait_for(lambda: cache.get("gpu-node-00001").free == 5, what="MODIFIED")
        fake_api.delete("nodes", "gpu-node-00002")
        wait_for(lambda: cache.get("gpu-node-00002") is None, what="DELETED")
        fake_api.compact()                                   # the watch gets 410: list again
        fake_api.set("nodes", make_node(7, allocated=[]), emit=False)   # only a list can see this one
        wait_for(lambda: cache.get("gpu-node-00007") is not None, what="relist after 410")
        fake_api.fail_next(2)                 # the next requests (the watch's reconnects) fail
        wait_for(lambda: metrics.value("gpu_aware_watch_restarts_total", resource="nodes") >= 2, what="failed reconnects")
        fake_api.set("nodes", make_node(8, allocated=[]))
        wait_for(lambda: cache.get("gpu-node-00008") is not None, what="reconnect")
    finally:
        lw.stop()


def test_kube_source_lists_nodes_in_pages(fake_api, api_client):
    """A relist of many nodes is read page by page (each page one short decode), as one list."""
    metrics = ExtenderMetrics()
    cache = NodeCache(StateCache(), metrics, LOG)
    for i in range(7):
        fake_api.set("nodes", make_node(i, allocated=[]))
    source = RawSource(core_v1(api_client).list_node, page_size=3)
    lw = ListWatch("nodes", source, cache, metrics, LOG, watch_seconds=2, backoff=Backoff(0.05, 0.1)).start()
    try:
        wait_for(lambda: len(cache) == 7, what="paged list")
        assert fake_api.count("list nodes") == 3              # 3 + 3 + 1
        assert all(cache.get("gpu-node-%05d" % i) is not None for i in range(7))
        fake_api.set("nodes", make_node(9, allocated=[0]))  # the watch starts at the list's resourceVersion
        wait_for(lambda: cache.get("gpu-node-00009") is not None, what="watch after the paged list")
    finally:
        lw.stop()


def test_kube_source_configmap_through_the_kubernetes_client(fake_api, api_client):
    metrics = ExtenderMetrics()
    holder = WeightsHolder(Weights(1, 1, "flags"), metrics, LOG, "ns")
    fake_api.set("configmaps", _cm({"scoreWeight": "3"}, name="unrelated"))
    lw = ListWatch("configmap", kube.configmap_source(api_client, "ns", "gpu-aware-plugin"), holder, metrics,
                   LOG, watch_seconds=2, backoff=Backoff(0.05, 0.1)).start()
    try:
        wait_for(lambda: metrics.value("gpu_aware_relists_total", resource="configmap") >= 1, what="list")
        assert holder.current.source == "flags"
        fake_api.set("configmaps", _cm({"scoreWeight": "7", "lossWeight": "0.5"}))
        wait_for(lambda: holder.current.score == 7, what="ConfigMap added")
        fake_api.set("configmaps", _cm({"scoreWeight": "x"}))
        wait_for(lambda: metrics.value("gpu_aware_config_errors_total") == 1, what="rejection")
        assert holder.current.score == 7
        fake_api.delete("configmaps", "gpu-aware-plugin")
        wait_for(lambda: holder.current.source == "flags", what="deletion")
    finally:
        lw.stop()


# ------------------------------------------------- node cache indices (property)

def _gpu_node(name, devices, allocated, unhealthy=()):
    from extender_support import annotations
    gpu = annotations(devices, [i for i in allocated if i < devices], [i for i in unhealthy if i < devices])
    node = make_node(0, allocated=[], gpu_annotations=gpu)
    node["metadata"]["name"] = name
    node["status"]["capacity"]["metax-tech.com/gpu"] = str(devices)
    return node


node_strategy = st.builds(lambda name, devices, allocated, unhealthy: (name, devices, allocated, unhealthy),
                          st.sampled_from(["a", "b", "c", "d"]), st.sampled_from([2, 8, 70]),
                          st.sets(st.integers(0, 69), max_size=6), st.sets(st.integers(0, 69), max_size=2))


@settings(deadline=None, max_examples=40)
@given(st.lists(node_strategy, max_size=4),
       st.lists(st.tuples(st.sampled_from(["ADDED", "MODIFIED", "DELETED"]), node_strategy), max_size=8))
def test_node_cache_indices_follow_events(initial, events):
    from ansible_collections.metax.gpu.plugins.module_utils.extender.policy import (
        filter_nodes, prioritize, scores_from_tables)
    cache = NodeCache(StateCache(), ExtenderMetrics(), LOG)
    cache.replace([_gpu_node(*spec) for spec in initial])
    for kind, spec in events:
        cache.apply(kind, _gpu_node(*spec))
    names = ["a", "b", "c", "d", "zz"]
    states = cache.lookup(names)
    for demand in (0, 1, 2, 3, 5, 8, 64, 65, 70):
        outcome = filter_nodes(demand, names, states)
        assert [names[i] for i in outcome.passed] == [n for n, ok in zip(names, cache.fits(names, demand)) if ok]
        weights = Weights(1, 2)
        assert scores_from_tables(cache.tables(names, demand), weights) == prioritize(demand, states, weights) \
            or demand <= 0
