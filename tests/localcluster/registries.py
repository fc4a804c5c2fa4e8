# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The two registries (plain HTTP and TLS + htpasswd) and the nodes' registry host config.

Both are Debian's docker-registry, listening on every address (the INPUT
chain drops their ports except on lo and the bridge). The nodes' containerd
reaches them on the bridge address by the names the images carry
(127.0.0.1:5000/..., localhost:5000/..., 127.0.0.1:5443/...).
"""

from __future__ import annotations

from dataclasses import dataclass

from .component import FileSpec, ProcessSpec
from .settings import CHAIN_IN, HOST_IP, Settings

REALM = "metax-gpu-registry"
TLS_SUBJECT = "/CN=metax-gpu local registry"
BINARY = "/usr/bin/docker-registry"


@dataclass(frozen=True)
class RegistryConfig:
    dir: str
    port: int
    secret: str
    tls: bool  # TLS + htpasswd (the auth registry)


def plain(settings: Settings, secret: str) -> RegistryConfig:
    return RegistryConfig(settings.state_dir + "/registry", settings.registry_port, secret, False)


def auth(settings: Settings, secret: str) -> RegistryConfig:
    return RegistryConfig(settings.state_dir + "/registry-auth", settings.registry_auth_port, secret, True)


def render(c: RegistryConfig) -> str:
    head = ("version: 0.1\n"
            "log:\n"
            "  level: warn\n"
            "  accesslog:\n"
            "    disabled: true\n"
            "storage:\n"
            "  filesystem:\n"
            "    rootdirectory: %s/data\n"
            "  delete:\n"
            "    enabled: true\n"
            "http:\n") % c.dir
    if not c.tls:
        return head + ("  # loopback for the host, the bridge address for the nodes' containerd\n"
                       "  # (other interfaces: dropped by the %s chain)\n"
                       "  addr: :%d\n"
                       "  secret: %s\n") % (CHAIN_IN, c.port, c.secret)
    return head + ("  addr: :%d\n"
                   "  secret: %s\n"
                   "  tls:\n"
                   "    certificate: %s/tls.crt\n"
                   "    key: %s/tls.key\n"
                   "auth:\n"
                   "  htpasswd:\n"
                   "    realm: %s\n"
                   "    path: %s/htpasswd\n") % (c.port, c.secret, c.dir, c.dir, REALM, c.dir)


def config_file(c: RegistryConfig) -> FileSpec:
    return FileSpec(c.dir + "/config.yml", render(c), 0o600)


def process(c: RegistryConfig) -> ProcessSpec:
    watched = (c.dir + "/config.yml",) + ((c.dir + "/htpasswd", c.dir + "/tls.crt") if c.tls else ())
    return ProcessSpec("registry-auth" if c.tls else "registry", (BINARY, "serve", c.dir + "/config.yml"),
                       config_files=watched)


def tls_sans() -> str:
    return "subjectAltName=IP:127.0.0.1,IP:%s,DNS:localhost" % HOST_IP


def hosts_toml(server: str, ca: str = "") -> str:
    return ('server = "%s"\n'
            '[host."%s"]\n'
            '  capabilities = ["pull", "resolve"]\n'
            '%s') % (server, server, '  ca = "%s"\n' % ca if ca else "")


def host_files(settings: Settings) -> list[FileSpec]:
    """containerd's config_path tree, shared by every node."""
    d = settings.state_dir + "/containerd-certs.d"
    plain_server = "http://%s:%d" % (HOST_IP, settings.registry_port)
    tls_server = "https://%s:%d" % (HOST_IP, settings.registry_auth_port)
    ca = settings.state_dir + "/registry-auth/tls.crt"
    out = [FileSpec("%s/%s/hosts.toml" % (d, h), hosts_toml(plain_server))
           for h in (settings.registry, "localhost:%d" % settings.registry_port,
                     "%s:%d" % (HOST_IP, settings.registry_port))]
    out += [FileSpec("%s/%s/hosts.toml" % (d, h), hosts_toml(tls_server, ca))
            for h in (settings.registry_auth, "%s:%d" % (HOST_IP, settings.registry_auth_port))]
    return out
