"""Desired files for enabled/disabled, drift after a kubeadm upgrade, the existing --config."""
from __future__ import annotations

import pytest
import yaml

from ansible_collections.metax.gpu.plugins.module_utils.scheduler import config as cfg
from ansible_collections.metax.gpu.plugins.module_utils.scheduler import manifest as mf
from ansible_collections.metax.gpu.plugins.module_utils.scheduler import plan

from scheduler_support import CONFIG_PATH, EXISTING_CONFIG, EXISTING_CONFIG_PATH, URL, VERSIONS, manifest

OPTS = cfg.ExtenderOptions(url=URL)


def _files(**files):
    return files.get


@pytest.mark.parametrize("name,api", [("1.23", "v1beta3"), ("1.25", "v1"), ("1.28", "v1"), ("1.32", "v1")])
def test_enable_then_disable(name, api):
    original = manifest(name)
    want = plan.enabled(original, None, CONFIG_PATH, OPTS, _files())
    config = yaml.safe_load(want.config)
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/" + api
    assert config["clientConnection"] == {"kubeconfig": "/etc/kubernetes/scheduler.conf"}
    assert [e["urlPrefix"] for e in config["extenders"]] == [URL]
    assert mf.inspect(want.manifest).patched(CONFIG_PATH) and not want.drift
    again = plan.enabled(want.manifest, want.config, CONFIG_PATH, OPTS, _files())
    assert (again.manifest, again.config, again.drift) == (want.manifest, want.config, False)
    off = plan.disabled(want.manifest, want.config, CONFIG_PATH)
    assert off.manifest == original and off.config is None


def test_existing_config_merged_and_put_back():
    original = manifest("1.28-config")
    read = _files(**{EXISTING_CONFIG_PATH: EXISTING_CONFIG})
    want = plan.enabled(original, None, CONFIG_PATH, OPTS, read)
    config = yaml.safe_load(want.config)
    assert config["profiles"] == yaml.safe_load(EXISTING_CONFIG)["profiles"]
    assert [e["urlPrefix"] for e in config["extenders"]] == ["http://storage-extender.kube-system:8888", URL]
    assert want.previous_arg == '"--config=%s"' % EXISTING_CONFIG_PATH
    # re-run: the base is read again through the header, result identical
    again = plan.enabled(want.manifest, want.config, CONFIG_PATH, OPTS, read)
    assert (again.manifest, again.config) == (want.manifest, want.config)
    assert plan.disabled(want.manifest, want.config, CONFIG_PATH).manifest == original


def test_existing_config_unreadable_is_an_error():
    with pytest.raises(cfg.SchedulerConfigError, match="cannot be read"):
        plan.enabled(manifest("1.28-config"), None, CONFIG_PATH, OPTS, _files())


def test_refuses_old_kubernetes_before_touching_anything():
    old = manifest("1.23").replace("v1.23.17", "v1.22.17")
    with pytest.raises(cfg.SchedulerConfigError, match="1.23 or later"):
        plan.enabled(old, None, CONFIG_PATH, OPTS, _files())
    assert plan.enabled(old, None, CONFIG_PATH, OPTS, _files(), kubernetes_version="1.25").version == (1, 25)


@pytest.mark.parametrize("name", VERSIONS)
def test_drift_after_kubeadm_upgrade(name):
    """kubeadm upgrade rewrites the manifest without our patch; the file stays: drift, then repair."""
    original = manifest(name)
    want = plan.enabled(original, None, CONFIG_PATH, OPTS, _files())
    upgraded = original.replace("imagePullPolicy: IfNotPresent", "imagePullPolicy: IfNotPresent", 1)
    drifted = plan.enabled(upgraded, want.config, CONFIG_PATH, OPTS, _files())
    assert drifted.drift
    assert drifted.manifest == want.manifest and drifted.config == want.config


def test_manual_layout_is_adopted():
    """Enabled by hand (manual 2.1.5): the hand-written file is the base; disabling removes it all."""
    hand = cfg.render(cfg.merge(None, cfg.build_extender(OPTS), (1, 23)), None).split("\n", 3)[3]
    hand = hand.replace("weight: 500", "weight: 300")
    patched, _previous = mf.patch(manifest("1.23"), CONFIG_PATH)
    want = plan.enabled(patched, hand, CONFIG_PATH, OPTS, _files())
    assert want.manifest == patched
    assert [e["weight"] for e in yaml.safe_load(want.config)["extenders"]] == [500]
    assert plan.disabled(patched, hand, CONFIG_PATH).manifest == manifest("1.23")
