# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Driver payloads: layouts, file names, versions (pure functions).

One interface, :class:`Package`, for the four layouts the kernel driver comes in
(docs/day-two.md "Driver payloads" says where each is detected):

* ``deb`` (dpkg nodes), ``rpm`` (rpm nodes) and the vendor's self-extracting
  ``.run`` (any node): one file, whose version is read from its name, whose
  shape each format fixes (``name_version_arch.deb``,
  ``name-version-release.arch.rpm``, ``name-version-arch.run``); reading it
  from the file instead would need the package tools on the machine that
  plans, which a check-mode run from a bastion does not have;
* ``prebuilt``: what MetaX's own driver image ships, a directory tree with
  kernel modules built for given kernels
  (``lib/modules/<kernel release>/**/metax.ko``), ``usr/bin/mx-smi`` and the
  declaration ``<name>.version`` at its top; usable on a node only when it
  has modules for the node's running kernel.

A payload's own version is not always the kernel driver's: MetaX's payload
``2.29.0.13`` installs the module ``2.12.13`` (what ``sys/module/metax/version``
and the node's ``gpu.driver.*`` labels say). A declaration file says which
(:func:`parse_declaration`); without one, both are the same (our own
payloads). Whether a node is on target is always :func:`driver_matches` of the
loaded module against the declared kernel-driver version, never against the
payload's own version.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ..errors import MetaxGpuError

KINDS = ("deb", "rpm", "run", "prebuilt")
SUFFIXES = {".deb": "deb", ".rpm": "rpm", ".run": "run"}
PREBUILT = "prebuilt"
# The declaration's suffix: <name>.version at the top of a prebuilt tree or a
# payload, <name>-<anything>.version beside packages (one per payload version).
DECLARATION_SUFFIX = ".version"
# The module file a prebuilt tree carries under lib/modules/<kernel release>/ (compressed too).
MODULE_FILES = ("metax.ko", "metax.ko.xz", "metax.ko.zst", "metax.ko.gz")
_VERSION = re.compile(r"(\d+(?:\.\d+)+)")
_DOTTED = re.compile(r"^\d+(?:\.\d+)+$")
# What a payload version may be before it becomes part of a node path (the cache
# directory that a new staging removes first): the operator chart's schema has
# the same pattern for driver.payload.version.
PAYLOAD_VERSION = re.compile(r"^[0-9]+(\.[0-9]+)*(-[A-Za-z0-9._-]+)?$")


class DriverPackageError(MetaxGpuError):
    """A package file that cannot be used (unknown kind, no version in its name, bad declaration)."""


def check_payload_version(version: str) -> str:
    """``version`` when it is a payload version (digits and dots, an optional ``-suffix``), else an error:
    it names a directory on the node that is removed and written as root."""
    if not PAYLOAD_VERSION.match(version or "") or ".." in version:
        raise DriverPackageError("%r is not a driver payload version (digits and dots with an optional "
                                 "-suffix, such as 2.29.0.13 or 2.12.13-1)" % (version,))
    return version


@dataclass(frozen=True)
class Package:
    """One installable driver payload, whatever its layout."""

    path: str                                 # as the node sees it (a file; a directory for prebuilt)
    kind: str                                 # deb | rpm | run | prebuilt
    version: str                              # the payload's own version (package database, file name)
    driver_version: Optional[str] = None      # the kernel driver it installs, as declared; None: = version
    kernels: Tuple[str, ...] = ()             # prebuilt: the kernel releases it has modules for

    @property
    def driver(self) -> str:
        """The kernel-driver version this payload installs (what the loaded module will say)."""
        return kernel_driver_version(self.version, self.driver_version)


def kernel_driver_version(payload_version: str, declared: Optional[str]) -> str:
    """The kernel driver a payload of ``payload_version`` installs: the declared one, else the same."""
    return declared or payload_version


@dataclass(frozen=True)
class Declaration:
    """A payload's declaration file: its own version and the kernel driver it installs."""

    version: str
    driver: Optional[str] = None

    @property
    def driver_version(self) -> str:
        return kernel_driver_version(self.version, self.driver)


def parse_declaration(text: str, where: str = "declaration") -> Declaration:
    """``KEY=value`` lines (``#`` comments), as /etc/os-release: ``version`` (the payload's own,
    required) and ``driver`` (the kernel driver it installs; omitted: the same)."""
    fields: Dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise DriverPackageError("%s: %r is not KEY=value" % (where, line))
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        fields[key.strip()] = value
    version = fields.get("version", "")
    driver = fields.get("driver") or None
    for key, found in (("version", version), ("driver", driver)):
        if found is not None and not _DOTTED.match(found):
            raise DriverPackageError("%s: %s=%r is not a dotted version (e.g. 2.12.13)" % (where, key, found))
    return Declaration(version=version, driver=driver)


def format_declaration(version: str, driver: Optional[str] = None) -> str:
    """The declaration file's text (what the simulator and the payload builders write)."""
    lines = ["# metax.gpu driver payload: its own version, and the kernel driver it installs",
             "version=%s" % version]
    if driver:
        lines.append("driver=%s" % driver)
    return "\n".join(lines) + "\n"


def is_declaration(filename: str, name: str) -> bool:
    base = filename.rsplit("/", 1)[-1]
    return base.endswith(DECLARATION_SUFFIX) and (
        base == name + DECLARATION_SUFFIX or base.startswith(name + "-"))


def declared_drivers(declarations: Iterable[Declaration]) -> Dict[str, str]:
    """payload version -> kernel-driver version, for the declarations that say something."""
    return {d.version: d.driver for d in declarations if d.driver}


def version_parts(version: Optional[str]) -> Tuple[int, ...]:
    """The numbers of a version, in order ("2.12.13" -> (2, 12, 13)); () for none."""
    return tuple(int(p) for p in re.findall(r"\d+", str(version or "")))


def driver_matches(have: Optional[str], want: Optional[str]) -> bool:
    """Whether the kernel driver ``have`` is ``want`` as far as both say: the one comparison of
    "is the node on target" (backend verify and plan, driver-manager, the rollout planner, the
    playbook's validation).

    ``have`` is the loaded module's version (``sys/module/metax/version``) or the
    node's ``gpu.driver.major/minor/patch`` labels (three parts); ``want`` is
    the kernel-driver version the payload declares (:attr:`Package.driver`),
    never the payload's own version when it declares another. The shorter
    of the two decides how many parts count, so labels (2.12.13) match a
    module that says more (2.12.13.4).
    """
    a, b = version_parts(have), version_parts(want)
    if not a or not b:
        return False
    width = min(len(a), len(b))
    return a[:width] == b[:width]


def kind_of(path: str) -> Optional[str]:
    for suffix, kind in SUFFIXES.items():
        if path.endswith(suffix):
            return kind
    return None


def version_of(filename: str, name: str) -> Optional[str]:
    """The version in a package file name, or None when the name is not ``name``'s."""
    base = filename.rsplit("/", 1)[-1]
    kind = kind_of(base)
    if kind is None or not base.startswith(name):
        return None
    rest = base[len(name):]
    if not rest or rest[0] not in "_-":
        return None
    match = _VERSION.search(rest[1:])
    if match is None or match.start() != 0:
        return None
    return match.group(1)


def version_key(version: str) -> Tuple[int, ...]:
    """Numeric order of dotted versions ("2.10.0" > "2.9.1"); non-digits sort as 0."""
    return tuple(int(p) if p.isdigit() else 0 for p in re.split(r"[.\-]", version))


def parse(path: str, name: str, drivers: Optional[Mapping[str, str]] = None) -> Package:
    """A package file; ``drivers`` (payload version -> kernel driver) from the declarations beside it."""
    kind = kind_of(path)
    if kind is None:
        raise DriverPackageError("%s: not a driver package (expected .deb, .rpm or .run, or a prebuilt "
                                 "directory with %s%s and lib/modules)" % (path, name, DECLARATION_SUFFIX))
    version = version_of(path, name)
    if version is None:
        raise DriverPackageError("%s: expected a file name like %s_<version>_<arch>.deb, "
                                 "%s-<version>-<release>.<arch>.rpm or %s-<version>-<arch>.run"
                                 % (path, name, name, name))
    return Package(path=path, kind=kind, version=version, driver_version=(drivers or {}).get(version))


def prebuilt(path: str, declaration: Declaration, kernels: Sequence[str]) -> Package:
    """A prebuilt tree at ``path`` (node path) with its declaration and the kernels it has modules for."""
    if not declaration.version:
        raise DriverPackageError("%s: its declaration says no version= (the payload's own version)" % path)
    if not kernels:
        raise DriverPackageError("%s: a prebuilt payload without lib/modules/<kernel release>/.../metax.ko" % path)
    return Package(path=path, kind=PREBUILT, version=declaration.version, driver_version=declaration.driver,
                   kernels=tuple(sorted(kernels)))


def candidates(paths: Iterable[str], name: str, drivers: Optional[Mapping[str, str]] = None,
               trees: Iterable[Package] = ()) -> List[Package]:
    """Driver packages among ``paths`` (other files are ignored) and the prebuilt ``trees``, oldest first."""
    found = list(trees)
    for path in paths:
        if kind_of(path) and version_of(path, name):
            found.append(parse(path, name, drivers))
    return sorted(found, key=lambda p: (version_key(p.version), p.kind, p.path))


def usable(package: Package, node_kind: Optional[str], kernel: Optional[str]) -> bool:
    """Whether the node can install ``package``: its own tool's kind, a ``.run``, or a prebuilt
    tree with modules for its running kernel. A deb on an rpm node (or the reverse) never: the
    node's tool could not install it."""
    if package.kind == PREBUILT:
        return kernel is not None and kernel in package.kernels
    return package.kind == "run" or package.kind == node_kind


# the layouts a node prefers, for one version: its package database's, then a
# prebuilt tree (nothing to build, but no package database), then the .run
_PREFERENCE = {"deb": 0, "rpm": 0, PREBUILT: 1, "run": 2}


def choose(packages: List[Package], node_kind: Optional[str], version: Optional[str],
           kernel: Optional[str] = None) -> Optional[Package]:
    """The package to install: ``version`` (or the newest), the node's own kind first, then a prebuilt
    tree built for ``kernel`` (the node's running kernel release), then ``.run``."""
    fits = [p for p in packages if usable(p, node_kind, kernel)]
    if version is not None:
        fits = [p for p in fits if p.version == version]
    if not fits:
        return None
    best = max(version_key(p.version) for p in fits)
    top = [p for p in fits if version_key(p.version) == best]
    top.sort(key=lambda p: (_PREFERENCE.get(p.kind, 3), p.path))
    return top[0]
