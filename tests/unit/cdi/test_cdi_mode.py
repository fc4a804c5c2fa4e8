# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""gpu-device's Allocate mode per node: CDI names only where the runtime reads CDI (cdi/mode.py)."""

from __future__ import annotations

import os

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.cdi import mode as m

# a real node's config after MetaX's own operator rewrote it (default_runtime_name = "metax")
VENDOR_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures",
                             "containerd-config-after-vendor-runtime.toml")


@pytest.mark.parametrize("raw, enabled, expected", [
    ("containerd://2.4.0", None, m.MODE_CDI),          # 2.x: on by default (the local cluster)
    ("containerd://2.0.0", True, m.MODE_CDI),
    ("containerd://2.1.3", False, m.MODE_DEVICES),     # turned off in its config
    ("containerd://1.7.24", None, m.MODE_DEVICES),     # 1.7: off unless enabled
    ("containerd://1.7.24", True, m.MODE_CDI),         # ... e.g. by the container-runtime drop-in
    ("containerd://1.6.20~ds1", True, m.MODE_DEVICES),  # Debian 12's: no CDI at all
    ("cri-o://1.30.2", None, m.MODE_CDI),
    ("cri-o://1.22.0", None, m.MODE_DEVICES),
    ("docker://26.1.0", True, m.MODE_CDI),              # cri-dockerd, features.cdi
    ("docker://26.1.0", None, m.MODE_DEVICES),
    ("docker://20.10.24", True, m.MODE_DEVICES),        # Debian's docker.io: before CDI
    ("remote://1.0", True, m.MODE_DEVICES),             # unknown runtime: the safe answer
    ("containerd", None, m.MODE_DEVICES),               # unreadable version
    ("", None, m.MODE_DEVICES),
    (None, None, m.MODE_DEVICES),
])
def test_auto_picks_cdi_only_where_the_runtime_reads_it(raw, enabled, expected):
    decision = m.decide(m.MODE_AUTO, raw, enabled)
    assert decision.mode == expected
    assert decision.reason


@pytest.mark.parametrize("override", [m.MODE_CDI, m.MODE_DEVICES])
def test_an_override_wins_over_the_runtime(override):
    for raw in ("containerd://2.4.0", "containerd://1.6.20", None):
        assert m.decide(override, raw).mode == override


def test_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="cdi, devices"):
        m.decide("yes", "containerd://2.4.0")


def test_runtime_versions_parse_with_suffixes():
    raw = "containerd://1.7.24-0ubuntu1"
    assert m.parse_runtime(raw) == m.Runtime("containerd", (1, 7, 24), raw)
    assert m.parse_runtime("cri-o://v1.30").version == (1, 30, 0)
    assert m.parse_runtime("containerd://") is None


def test_containerd_setting_follows_load_order_and_ignores_comments():
    main = '[plugins."io.containerd.grpc.v1.cri"]\n  # enable_cdi = true\n  enable_cdi = false\n'
    dropin = '[plugins."io.containerd.grpc.v1.cri"]\n  enable_cdi = true  # metax.gpu\n'
    assert m.containerd_cdi_setting([main]) is False
    assert m.containerd_cdi_setting([main, dropin]) is True
    assert m.containerd_cdi_setting(["version = 2\n"]) is None


def test_the_vendor_rewritten_config_does_not_enable_cdi():
    with open(VENDOR_CONFIG, encoding="utf-8") as handle:
        text = handle.read()
    assert m.containerd_cdi_setting([text]) is None
    assert m.decide(m.MODE_AUTO, "containerd://1.7.24", m.containerd_cdi_setting([text])).mode == m.MODE_DEVICES


@pytest.mark.parametrize("text, expected", [
    ('{"features": {"cdi": true}}', True),
    ('{"features": {"cdi": false}, "log-driver": "json-file"}', False),
    ('{"features": {"cdi": "true"}}', None),   # dockerd wants a boolean
    ('{"log-driver": "json-file"}', None),
    ("not json", None),
    ("", None),
    (None, None),
])
def test_docker_setting(text, expected):
    assert m.docker_cdi_setting(text) is expected
