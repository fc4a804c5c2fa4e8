# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The one shape every component has: its files (pure), its process, up/ready/down.

A component is a frozen configuration dataclass. What it writes is computed by
``files()`` from that configuration alone -- no I/O, so it is unit-tested and
compared with the running cluster's files. A component that runs a process
also says how (``process()``: argv, namespace wrapper, the files whose change
restarts it). ``up``/``ready``/``down`` take a ``Host`` -- the one object that
does I/O (writes files, starts processes, runs ip/iptables) -- so the
components stay testable with a real host in a temporary root
(``host.LocalHost`` is that object; ``up.py`` and ``teardown.py`` call the
three verbs in order).
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass, field
from typing import Protocol, Sequence, runtime_checkable


class Write(enum.Enum):
    """When `up` writes a file (the semantics cluster.sh has for it)."""

    ALWAYS = "always"          # rewritten on every up (a config the process is restarted for on change)
    IF_ABSENT = "if_absent"    # kept once there: certificates, kubeconfigs, the scheduler manifest others patch
    IF_CHANGED = "if_changed"  # only when the content differs: kube-proxy exits when its config file is written


@dataclass(frozen=True)
class FileSpec:
    """One file a component writes: where, what, with which mode and when."""

    path: str
    content: str
    mode: int = 0o644
    write: Write = Write.ALWAYS


@dataclass(frozen=True)
class ProcessSpec:
    """How a component's process runs (cluster.sh's `start NAME BIN ARGS`).

    wrap: the command it runs under (nsenter into a node's namespaces);
    config_files: a change of these restarts it (START_CONFIG).
    """

    name: str
    argv: tuple[str, ...]
    wrap: tuple[str, ...] = ()
    config_files: tuple[str, ...] = ()


def start_hash(spec: ProcessSpec, config_contents: Sequence[bytes]) -> str:
    """What `up` records in <pids>/NAME.hash: a running process whose hash is unchanged is kept, any other
    is restarted. sha256 of the wrapper (one line, empty when none), the binary as given and each argument,
    one per line, then the config files' contents."""
    lines = [" ".join(spec.wrap), spec.argv[0], *spec.argv[1:]]
    digest = hashlib.sha256("".join(line + "\n" for line in lines).encode())
    for content in config_contents:
        digest.update(content)
    return digest.hexdigest()


@runtime_checkable
class Files(Protocol):
    """The pure half: every component has it."""

    @property
    def name(self) -> str:
        ...

    def files(self) -> Sequence[FileSpec]:
        ...


class Host(Protocol):
    """The I/O edge (host.LocalHost): writes FileSpecs, starts/stops ProcessSpecs, runs commands, asks URLs."""

    logs: str  # the processes' log dir (<logs>/NAME.log)

    def write(self, spec: FileSpec) -> bool:
        ...

    def read(self, path: str) -> str:
        ...

    def mkdir(self, path: str, mode: int = 0o755) -> None:
        ...

    def remove(self, path: str) -> None:
        ...

    def start(self, spec: ProcessSpec) -> int:
        ...

    def stop(self, name: str) -> None:
        ...

    def running(self, name: str) -> bool:
        ...

    def run(self, argv: Sequence[str], stdin: str = "") -> str:
        ...

    def ok(self, argv: Sequence[str]) -> bool:
        ...

    def http_status(self, url: str, cafile: str = "", user: str = "", password: str = "",
                    cert: tuple[str, str] = ("", ""), insecure: bool = False) -> int:
        ...

    def recorded(self, name: str) -> bool:
        ...

    def exited(self, name: str) -> bool:
        ...

    def pid(self, name: str) -> int:
        ...


class Component(Files, Protocol):
    """A component with a lifecycle: up starts it, ready polls it, down undoes up."""

    def up(self, host: Host) -> None:
        ...

    def ready(self, host: Host) -> bool:
        ...

    def down(self, host: Host) -> None:
        ...


@dataclass(frozen=True)
class Inputs:
    """What generated files embed but no configuration can compute: secrets and
    certificates made at `up` (read from the state dir at the edge)."""

    ca_crt: bytes = b""
    certs: dict[str, tuple[bytes, bytes]] = field(default_factory=dict)  # name -> (crt, key) PEM
    registry_secret: str = ""
    registry_auth_secret: str = ""
    registry_password: str = ""
    runc: str = "/usr/sbin/runc"
