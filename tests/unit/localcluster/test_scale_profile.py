# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The scale profile's pure parts: kwok's config and argv, the fake Node objects, the writer's patches."""

from __future__ import annotations

import threading

import pytest

from localcluster import fakenodes, kwok

PROFILES = [
    fakenodes.GpuProfile("8xC500", {"metax-tech.com/gpu.count": "8"}, {"metax-tech.com/gpu.devices": "[]"}, 8),
    fakenodes.GpuProfile("4xN100", {"metax-tech.com/gpu.count": "4"}, {"metax-tech.com/gpu.devices": "[]"}, 4),
]


def test_kwok_spec_paths_and_argv(settings):
    spec = kwok.spec(settings, fakenodes.SELECTOR)
    assert spec.binary == settings.cache_dir + "/kwok/v0.8.0/bin/kwok"
    assert spec.stages_dir == settings.cache_dir + "/kwok/v0.8.0/stages"
    argv = kwok.argv(spec)
    # only the fake nodes: the real nodes' kubelets keep theirs
    assert "--manage-all-nodes=false" in argv
    assert argv[argv.index("--manage-nodes-with-label-selector") + 1] == "type=kwok"
    assert argv[argv.index("--kubeconfig") + 1] == settings.admin_conf
    assert argv[argv.index("--config") + 1] == spec.config


def test_kwok_config_is_one_yaml_stream_of_the_stages():
    text = kwok.config_text(["kind: Stage\nmetadata: {name: a}\n", "kind: Stage\nmetadata: {name: b}"])
    assert text == "kind: Stage\nmetadata: {name: a}\n---\nkind: Stage\nmetadata: {name: b}\n"


def test_kwok_up_without_build_says_how(settings, tmp_path):
    spec = kwok.KwokSpec(bin_dir=str(tmp_path / "none"), kubeconfig="k", selector="type=kwok",
                         run_dir=str(tmp_path / "run"))
    with pytest.raises(kwok.KwokError, match="build-kwok.sh"):
        kwok.Kwok(spec).up()
    assert kwok.Kwok(spec).pid() is None


def test_plan_mixes_the_profiles_in_turn():
    nodes = fakenodes.plan(5, PROFILES)
    assert [n.name for n in nodes] == ["kwok-gpu-%05d" % i for i in range(5)]
    assert [n.profile.preset for n in nodes] == ["8xC500", "4xN100", "8xC500", "4xN100", "8xC500"]
    assert fakenodes.counts_by_preset(nodes) == {"8xC500": 3, "4xN100": 2}
    assert fakenodes.gpu_totals(nodes) == (5, 32)
    with pytest.raises(ValueError):
        fakenodes.plan(1, [])


def test_node_manifest_is_tainted_labelled_and_carries_the_agents_output():
    node = fakenodes.node_manifest(fakenodes.plan(1, PROFILES)[0])
    assert node["spec"]["taints"] == [{"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}]
    labels = node["metadata"]["labels"]
    assert labels["type"] == "kwok" and labels[fakenodes.PRESET_LABEL] == "8xC500"
    assert labels["metax-tech.com/gpu.count"] == "8"
    assert node["metadata"]["annotations"]["metax-tech.com/gpu.devices"] == "[]"
    assert node["status"]["capacity"]["metax-tech.com/gpu"] == "8"
    assert node["status"]["allocatable"] == node["status"]["capacity"]
    # the toleration the benchmark pods carry matches the taint
    tol = fakenodes.TOLERATION
    assert (tol["key"], tol["value"], tol["effect"]) == tuple(node["spec"]["taints"][0][k]
                                                              for k in ("key", "value", "effect"))


def test_owned_changes_touch_only_metax_keys():
    current = {"metax-tech.com/a": "1", "metax-tech.com/gone": "x", "kubernetes.io/os": "linux"}
    assert fakenodes.owned_changes(current, {"metax-tech.com/a": "1", "metax-tech.com/gone": "x"}) == {}
    expected = {"metax-tech.com/a": "2", "metax-tech.com/gone": None}
    assert fakenodes.owned_changes(current, {"metax-tech.com/a": "2"}) == expected


def _client_answering(monkeypatch, answers):
    """An ApiClient whose wire is a list of (status, body) answers, sent in turn; no pauses between retries."""
    monkeypatch.setattr(fakenodes, "TRANSIENT_PAUSES", (0.0,) * 5)
    client = fakenodes.ApiClient.__new__(fakenodes.ApiClient)
    client.requests = 0
    setattr(client, "_count_lock", threading.Lock())
    sent = []

    def send(method, path, data, headers):
        sent.append(method)
        return answers[len(sent) - 1]
    monkeypatch.setattr(client, "_send", send)
    return client, sent


ETCD_TIMEOUT = (500, b'{"kind":"Status","message":"etcdserver: request timed out","code":500}')


def test_an_etcd_timeout_is_sent_again_and_a_create_committed_anyway_is_a_conflict(monkeypatch):
    client, sent = _client_answering(monkeypatch, [ETCD_TIMEOUT, (429, b"{}"), (201, b'{"kind":"Node"}')])
    assert client.request("POST", "/api/v1/nodes", {}) == {"kind": "Node"}
    assert sent == ["POST"] * 3 and client.requests == 1
    client, sent = _client_answering(monkeypatch, [ETCD_TIMEOUT, (409, b'{"reason":"AlreadyExists"}')])
    with pytest.raises(fakenodes.ApiError) as err:
        client.request("POST", "/api/v1/nodes", {})
    assert err.value.status == 409        # what create() counts as "already there"


def test_other_errors_and_a_lasting_timeout_are_not_hidden(monkeypatch):
    client, sent = _client_answering(monkeypatch, [(500, b'{"message":"internal error"}')])
    with pytest.raises(fakenodes.ApiError):
        client.request("GET", "/api/v1/nodes")
    assert sent == ["GET"]
    client, sent = _client_answering(monkeypatch, [ETCD_TIMEOUT] * 5)
    with pytest.raises(fakenodes.ApiError) as err:
        client.request("GET", "/api/v1/nodes")
    assert err.value.status == 500 and len(sent) == 5
