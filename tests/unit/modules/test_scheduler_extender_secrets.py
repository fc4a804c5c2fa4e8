"""scheduler_extender's private key (tls_config.keyData): masked in every layout a configuration may have it in,
absent from check-mode and real diffs, and 0600 on disk (issue 39, finding 9)."""
from __future__ import annotations

import os
import stat
import sys

import pytest

from ansible_collections.metax.gpu.plugins.modules import scheduler_extender
from ansible_collections.metax.gpu.plugins.module_utils.scheduler import config as cfg

from module_runner import run_module

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scheduler"))
from scheduler_support import URL, manifest  # noqa: E402

KEY = "LS0tLS1CRUdJTiBQUklWQVRFIEtFWS0tLS0tCk1JSUV2Z0lCQURBTkJna3Foa2lHOXcwQkFRRUZBQVNDQktnd2dnU2tBZ0VBQW9JQkFRQzcK"


@pytest.mark.parametrize("text", [
    "extenders:\n- urlPrefix: https://x\n  tlsConfig:\n    keyData: %s\n    serverName: x\n" % KEY,
    "extenders:\n- tlsConfig:\n    keyData: '%s'\n" % KEY,
    'extenders:\n- tlsConfig: {keyData: "%s", serverName: x}\n' % KEY,
    "extenders:\n- tlsConfig:\n    keyData: |\n      %s\n      %s\n    serverName: x\n" % (KEY[:40], KEY[40:]),
    "extenders:\n- tlsConfig:\n    keyData:\n      %s\n    serverName: x\n" % KEY,
    '{"extenders": [{"tlsConfig": {"keyData": "%s", "serverName": "x"}}]}' % KEY,
])
def test_every_layout_of_the_key_is_masked(text):
    masked = cfg.mask_secrets(text)
    assert KEY not in masked and KEY[:40] not in masked and KEY[40:] not in masked
    assert "******** (masked; sha256" in masked
    assert ("serverName" in masked) == ("serverName" in text)      # the rest stays, for the diff


def test_the_fingerprint_shows_a_changed_key():
    one = cfg.mask_secrets("keyData: %s\n" % KEY)
    other = cfg.mask_secrets("keyData: %s\n" % KEY[::-1])
    assert one != other and cfg.mask_secrets("keyData: '%s'\n" % KEY) == one


def test_text_without_a_key_is_untouched():
    text = "extenders:\n- urlPrefix: http://x\n  tlsConfig:\n    caData: abc\n"
    assert cfg.mask_secrets(text) == text and cfg.mask_secrets(None) is None


@pytest.fixture
def root(tmp_path):
    os.makedirs(str(tmp_path / "etc/kubernetes/manifests"))
    (tmp_path / "etc/kubernetes/manifests/kube-scheduler.yaml").write_text(manifest("1.28"))
    return str(tmp_path)


def _args(root, key=KEY):
    return {"host_root": root, "url": URL.replace("http:", "https:"), "enable_https": True, "wait": False,
            "tls_config": {"keyData": key, "caData": "Y2E="}}


def test_check_mode_then_real_then_a_new_key(root):
    failed, planned = run_module(scheduler_extender, _args(root), check_mode=True, diff=True)
    assert not failed and planned["changed"] and KEY not in str(planned)
    failed, done = run_module(scheduler_extender, _args(root), diff=True)
    assert not failed and KEY not in str(done)
    path = os.path.join(root, "etc/metax/extender.yaml")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with open(path) as handle:
        written = handle.read()
    assert KEY in written and "caData: Y2E=" in written and "certFile" not in written   # options not given: absent
    # a new key: the diff says the key changed, and shows neither
    failed, again = run_module(scheduler_extender, _args(root, KEY[::-1]), diff=True)
    assert not failed and again["changed"]
    before, after = again["diff"][1]["before"], again["diff"][1]["after"]
    assert KEY not in str(again) and KEY[::-1] not in str(again) and before != after
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_an_existing_world_readable_config_is_tightened_when_it_gets_a_key(root):
    path = os.path.join(root, "etc/metax/extender.yaml")
    failed, _result = run_module(scheduler_extender, {"host_root": root, "url": URL, "wait": False})
    assert not failed
    os.chmod(path, 0o644)
    failed, _result = run_module(scheduler_extender, _args(root))
    assert not failed and stat.S_IMODE(os.stat(path).st_mode) == 0o600
