# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""etcd: one member on loopback, data in the cluster state (Debian's etcd-server)."""

from __future__ import annotations

from dataclasses import dataclass

from .component import FileSpec, Host, ProcessSpec
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


@dataclass(frozen=True)
class EtcdComponent:
    settings: Settings
    name: str = "etcd"

    def files(self) -> list[FileSpec]:
        return []  # all on its command line

    def up(self, host: Host) -> None:
        host.mkdir(self.settings.state_dir + "/etcd", 0o700)
        host.start(process(self.settings))

    def ready(self, host: Host) -> bool:
        return host.http_status(health_url(self.settings)) == 200

    def down(self, host: Host) -> None:
        host.stop("etcd")
