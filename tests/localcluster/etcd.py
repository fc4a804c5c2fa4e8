# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""etcd: one member on loopback, data in the cluster state (Debian's etcd-server)."""

from __future__ import annotations

from .component import ProcessSpec
from .settings import Settings

BINARY = "/usr/bin/etcd"


def process(settings: Settings) -> ProcessSpec:
    client = "http://127.0.0.1:%d" % settings.etcd_port
    peer = "http://127.0.0.1:%d" % settings.etcd_peer_port
    return ProcessSpec("etcd", (
        BINARY, "--name", "metax", "--data-dir", settings.state_dir + "/etcd",
        "--listen-client-urls", client, "--advertise-client-urls", client,
        "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
        "--initial-cluster", "metax=" + peer,
        "--initial-cluster-state", "new", "--snapshot-count", "10000", "--log-level", "warn"))


def health_url(settings: Settings) -> str:
    return "http://127.0.0.1:%d/health" % settings.etcd_port
