# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The plugin sockets' server: a socket removed by the kubelet at any moment is served again."""

from __future__ import annotations

import os

import pytest

grpc = pytest.importorskip("grpc")

from ansible_collections.metax.gpu.plugins.module_utils.kubelet import pluginwatcher  # noqa: E402


def test_a_socket_removed_before_its_inode_is_read_is_reported_gone_and_served_again(tmp_path, monkeypatch):
    """CI saw it under load: the kubelet's clean-up came between the listen and the stat, and the
    agent's serving thread died on FileNotFoundError instead of serving the socket again."""
    path = str(tmp_path / "reg.sock")
    server = pluginwatcher.UnixServer(path, lambda s: None, name="test")
    real_stat = os.stat
    removed = []

    def stat_after_removal(target, *args, **kwargs):
        if target == path and not removed:
            os.unlink(path)                      # the kubelet, right after the listen
            removed.append(path)
        return real_stat(target, *args, **kwargs)

    monkeypatch.setattr(pluginwatcher.os, "stat", stat_after_removal)
    try:
        server.start()                           # no exception
        assert removed == [path] and server.running
        assert server.inode is None and not server.socket_present()
        server.start()                           # what the owner does when the socket is gone
        assert server.socket_present() and os.path.exists(path)
    finally:
        server.stop()
    assert not os.path.exists(path)
