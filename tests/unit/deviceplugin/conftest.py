# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Fixtures for gpu-device protocol tests: short socket directories, a running agent."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

import pytest

grpc = pytest.importorskip("grpc")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from kubelet_peer import KubeletPeer, PodResourcesPeer  # noqa: E402
from running_agent import RunningAgent  # noqa: E402

from ansible_collections.metax.gpu.plugins.module_utils.agents.gpu_device import GpuDeviceAgent  # noqa: E402


@pytest.fixture
def sockdir():
    """A short directory for unix sockets (paths are limited to 107 bytes)."""
    path = tempfile.mkdtemp(prefix="mxdp-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def kubelet(sockdir):
    peer = KubeletPeer(os.path.join(sockdir, "device-plugins"))
    peer.start()
    yield peer
    peer.stop()


@pytest.fixture
def pod_resources(sockdir):
    peer = PodResourcesPeer(os.path.join(sockdir, "pod-resources.sock"))
    peer.start()
    yield peer
    peer.stop()


@pytest.fixture
def run_agent(sockdir):
    """run_agent(host, **kwargs) -> context manager running a GpuDeviceAgent in a thread."""
    def _run(host, **kwargs):
        kwargs.setdefault("healthy_interval", 1)
        kwargs.setdefault("pod_resources_socket", None)
        agent = GpuDeviceAgent(host, os.path.join(sockdir, "device-plugins"), **kwargs)
        return RunningAgent(agent)
    return _run
