# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The two registries (plain HTTP and TLS + htpasswd) and the nodes' registry host config.

Both are Debian's docker-registry, listening on every address (the INPUT
chain drops their ports except on lo and the bridge). The nodes' containerd
reaches them on the bridge address by the names the images carry
(127.0.0.1:5000/..., localhost:5000/..., 127.0.0.1:5443/...).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .component import FileSpec, Host, Inputs, ProcessSpec, Write
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


def tls_commands(directory: str) -> list[list[str]]:
    """The TLS registry's self-signed EC P-256 certificate (names: loopback, the bridge address, localhost)."""
    return [["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-days", "3650", "-subj", TLS_SUBJECT, "-addext", tls_sans(), "-keyout", directory + "/tls.key",
             "-out", directory + "/tls.crt"]]


@dataclass(frozen=True)
class RegistriesComponent:
    """Both registries: their configs, the nodes' registry host config, the two processes."""

    settings: Settings
    inputs: Inputs
    name: str = "registries"

    def files(self) -> list[FileSpec]:
        a = auth(self.settings, self.inputs.registry_auth_secret)
        return [config_file(plain(self.settings, self.inputs.registry_secret)), config_file(a),
                *host_files(self.settings)]

    def processes(self) -> list[ProcessSpec]:
        return [process(plain(self.settings, "")), process(auth(self.settings, ""))]

    # ---------------------------------------------------------------- lifecycle
    def _inputs(self, host: Host) -> Inputs:
        """The secrets, password, htpasswd and TLS pair this component owns: made once, then kept."""
        s = self.settings
        p, a = plain(s, ""), auth(s, "")
        for path in (p.dir + "/secret", a.dir + "/secret", a.dir + "/password"):
            host.write(FileSpec(path, host.run(["openssl", "rand", "-hex", "16"]), 0o600, Write.IF_ABSENT))
        password = host.read(a.dir + "/password").strip()
        if not host.read(a.dir + "/htpasswd"):
            # the password on stdin, never on a command line
            line = host.run(["htpasswd", "-Bin", s.registry_user], stdin=password + "\n")
            host.write(FileSpec(a.dir + "/htpasswd", line, 0o644, Write.IF_ABSENT))
        if not host.read(a.dir + "/tls.crt"):
            for argv in tls_commands(a.dir):
                host.run(argv)
            host.write(FileSpec(a.dir + "/tls.key", host.read(a.dir + "/tls.key"), 0o600))
        return dataclasses.replace(self.inputs, registry_secret=host.read(p.dir + "/secret").strip(),
                                   registry_auth_secret=host.read(a.dir + "/secret").strip(),
                                   registry_password=password)

    def up(self, host: Host) -> None:
        made = dataclasses.replace(self, inputs=self._inputs(host))
        a = auth(self.settings, "")
        host.write(FileSpec("%s/certs.d/%s/ca.crt" % (a.dir, self.settings.registry_auth),
                            host.read(a.dir + "/tls.crt")))
        for spec in made.files():
            host.write(spec)
        for proc in self.processes():
            host.start(proc)

    def ready(self, host: Host) -> bool:
        a = auth(self.settings, "")
        password = host.read(a.dir + "/password").strip()
        return (host.http_status("http://%s/v2/" % self.settings.registry) == 200
                and host.http_status("https://%s/v2/" % self.settings.registry_auth, cafile=a.dir + "/tls.crt",
                                     user=self.settings.registry_user, password=password) == 200)

    def down(self, host: Host) -> None:
        for proc in self.processes():
            host.stop(proc.name)
