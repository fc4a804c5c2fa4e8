"""KubeSchedulerConfiguration: extender entry, apiVersion table, validation, merge, header."""
from __future__ import annotations

import pytest
import yaml

from ansible_collections.metax.gpu.plugins.module_utils.errors import MetaxGpuError
from ansible_collections.metax.gpu.plugins.module_utils.names import RESOURCE_NAME
from ansible_collections.metax.gpu.plugins.module_utils.scheduler import config as cfg

from scheduler_support import EXISTING_CONFIG, URL


@pytest.mark.parametrize("text,expected", [
    ("1.23", (1, 23)), ("v1.28.3", (1, 28)), ("registry.k8s.io/kube-scheduler:v1.32.0", (1, 32)),
    ("k8s.gcr.io/kube-scheduler:v1.23.17", (1, 23)), ("1.30.1-eks-abc", (1, 30)), ("v1.36.0-rc.1", (1, 36)),
])
def test_parse_version(text, expected):
    assert cfg.parse_version(text) == expected


def test_parse_version_unreadable_says_what_to_set():
    with pytest.raises(cfg.SchedulerConfigError, match="kubernetes_version"):
        cfg.parse_version("registry.local/kube-scheduler:latest")


@pytest.mark.parametrize("minor", range(23, 37))
def test_api_version_table(minor):
    expected = "kubescheduler.config.k8s.io/" + ("v1beta3" if minor < 25 else "v1")
    assert cfg.api_version_for((1, minor)) == expected
    # what we write is always a version that scheduler still loads
    assert expected in cfg.api_versions_accepted((1, minor))


def test_v1beta3_gone_from_1_29_and_v1_from_1_25():
    assert "kubescheduler.config.k8s.io/v1beta3" in cfg.api_versions_accepted((1, 28))
    assert "kubescheduler.config.k8s.io/v1beta3" not in cfg.api_versions_accepted((1, 29))
    assert "kubescheduler.config.k8s.io/v1" not in cfg.api_versions_accepted((1, 24))
    assert cfg.api_versions_accepted((1, 36)) == ("kubescheduler.config.k8s.io/v1",)


@pytest.mark.parametrize("version", [(1, 22), (1, 18), (0, 99)])
def test_refuses_before_1_23(version):
    with pytest.raises(MetaxGpuError, match="needs 1.23 or later"):
        cfg.api_version_for(version)


def test_extender_entry_is_the_manuals_plus_managed_resources():
    entry = cfg.build_extender(cfg.ExtenderOptions(url=URL))
    assert entry == {
        "urlPrefix": URL, "enableHTTPS": False, "filterVerb": "filter", "prioritizeVerb": "prioritize",
        "nodeCacheCapable": False, "ignorable": False, "weight": 500,
        "managedResources": [{"name": RESOURCE_NAME, "ignoredByScheduler": False}],
    }


def test_extender_entry_optional_fields():
    entry = cfg.build_extender(cfg.ExtenderOptions(
        url="https://gpu-aware:8443", enable_https=True, tls_config={"insecure": False, "caFile": "/ca.pem"},
        http_timeout="30s", node_cache_capable=True, ignorable=True, weight=7, managed_resources=[]))
    assert entry["tlsConfig"] == {"insecure": False, "caFile": "/ca.pem"}
    assert entry["httpTimeout"] == "30s"
    assert entry["nodeCacheCapable"] is True and entry["ignorable"] is True
    assert "managedResources" not in entry


@pytest.mark.parametrize("opts,message", [
    (dict(weight=0), "greater than 0 when prioritizeVerb"),
    (dict(weight=-5), "greater than 0 when prioritizeVerb"),
    (dict(weight=2 ** 62), "overflows"),
    (dict(url=""), "urlPrefix is empty"),
    (dict(managed_resources=["gpu"]), "domain prefix"),
    (dict(managed_resources=["kubernetes.io/gpu"]), "domain prefix"),
    (dict(managed_resources=["Bad_Domain/gpu"]), "DNS subdomain"),
    (dict(managed_resources=["metax-tech.com/" + "g" * 64]), "qualified name"),
    (dict(managed_resources=[RESOURCE_NAME, RESOURCE_NAME]), "already managed"),
    (dict(http_timeout="5 seconds"), "not a duration"),
    (dict(http_timeout="-1s"), "negative"),
])
def test_validation_as_the_scheduler_does(opts, message):
    base = dict(url=URL)
    base.update(opts)
    with pytest.raises(cfg.SchedulerConfigError, match=message):
        cfg.build_extender(cfg.ExtenderOptions(**base))


def test_weight_zero_allowed_without_prioritize():
    entry = cfg.build_extender(cfg.ExtenderOptions(url=URL, prioritize_verb="", weight=0))
    assert "prioritizeVerb" not in entry and entry["weight"] == 0


@pytest.mark.parametrize("text,seconds", [("0", 0.0), ("5s", 5.0), ("1m30s", 90.0), ("500ms", 0.5),
                                          ("1h", 3600.0), ("1.5s", 1.5), ("250us", 0.00025)])
def test_parse_duration(text, seconds):
    assert cfg.parse_duration(text) == pytest.approx(seconds)


def test_merge_without_base_is_the_manuals_file():
    entry = cfg.build_extender(cfg.ExtenderOptions(url=URL))
    merged = cfg.merge(None, entry, (1, 23))
    assert merged == {"apiVersion": "kubescheduler.config.k8s.io/v1beta3", "kind": "KubeSchedulerConfiguration",
                      "clientConnection": {"kubeconfig": "/etc/kubernetes/scheduler.conf"}, "extenders": [entry]}
    assert cfg.merge(None, entry, (1, 28), kubeconfig="/k.conf")["clientConnection"] == {"kubeconfig": "/k.conf"}


def test_merge_keeps_everything_else():
    base = cfg.parse_config(EXISTING_CONFIG, "existing")
    entry = cfg.build_extender(cfg.ExtenderOptions(url=URL))
    merged = cfg.merge(base, entry, (1, 28))
    assert merged["profiles"] == base["profiles"]
    assert merged["leaderElection"] == base["leaderElection"]
    assert merged["clientConnection"] == {"kubeconfig": "/etc/kubernetes/scheduler.conf", "qps": 100}
    assert merged["extenders"] == [base["extenders"][0], entry]
    assert base["extenders"] == yaml.safe_load(EXISTING_CONFIG)["extenders"]      # input untouched
    # merging again (new Service address) replaces our entry in place, never duplicates it
    moved = cfg.build_extender(cfg.ExtenderOptions(url="http://10.96.0.99:8080"))
    again = cfg.merge(merged, moved, (1, 28))
    assert again["extenders"] == [base["extenders"][0], moved]


def test_merge_refuses_a_version_the_scheduler_no_longer_loads():
    base = cfg.parse_config(EXISTING_CONFIG.replace("/v1\n", "/v1beta3\n"), "existing")
    entry = cfg.build_extender(cfg.ExtenderOptions(url=URL))
    assert cfg.merge(base, entry, (1, 28))["apiVersion"].endswith("v1beta3")
    with pytest.raises(cfg.SchedulerConfigError, match="does not load"):
        cfg.merge(base, entry, (1, 29))


def test_merge_refuses_a_second_manager_of_the_gpu_resource():
    base = cfg.parse_config(EXISTING_CONFIG.replace("example.com/fast-disk", "example.com/x"), "existing")
    base["extenders"].append({"urlPrefix": "http://other:1", "weight": 1, "prioritizeVerb": "p",
                              "managedResources": [{"name": "example.com/x"}]})
    with pytest.raises(cfg.SchedulerConfigError, match="already managed"):
        cfg.merge(base, cfg.build_extender(cfg.ExtenderOptions(url=URL)), (1, 28))


@pytest.mark.parametrize("text,message", [
    ("a: [", "not valid YAML"), ("- 1", "not a mapping"), ("", "not a mapping"),
    ("apiVersion: v1\nkind: Pod\n", "not a KubeSchedulerConfiguration"),
])
def test_parse_config_errors(text, message):
    with pytest.raises(cfg.SchedulerConfigError, match=message):
        cfg.parse_config(text, "/etc/x.yaml")


@pytest.mark.parametrize("previous", [None, "--config=/etc/kubernetes/s.yaml", '"--config=/a b.yaml"'])
def test_render_round_trips_the_header(previous):
    entry = cfg.build_extender(cfg.ExtenderOptions(url=URL))
    text = cfg.render(cfg.merge(None, entry, (1, 28)), previous)
    assert cfg.previous_arg_of(text) == (True, previous)
    assert yaml.safe_load(text)["extenders"] == [entry]


def test_previous_arg_of_a_hand_written_file():
    assert cfg.previous_arg_of("apiVersion: x\n") == (False, None)
    with pytest.raises(cfg.SchedulerConfigError, match="damaged"):
        cfg.previous_arg_of(cfg.HEADER_MARK + "{oops\n")
