# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Offline driver packages: kinds, file names, versions (pure functions).

Three kinds, as MetaX ships the kernel driver: ``deb`` (dpkg nodes), ``rpm``
(rpm nodes) and the vendor's self-extracting ``.run`` (any node). A package's
version is read from its file name, whose shape each format fixes
(``name_version_arch.deb``, ``name-version-release.arch.rpm``,
``name-version-arch.run``); reading it from the file instead would need the
package tools on the machine that plans, which a check-mode run from a bastion
does not have.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, List, Optional, Tuple

from ..errors import MetaxGpuError

KINDS = ("deb", "rpm", "run")
SUFFIXES = {".deb": "deb", ".rpm": "rpm", ".run": "run"}
_VERSION = re.compile(r"(\d+(?:\.\d+)+)")


class DriverPackageError(MetaxGpuError):
    """A package file that cannot be used (unknown kind, no version in its name)."""


@dataclass(frozen=True)
class Package:
    path: str          # as the node sees it
    kind: str
    version: str


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


def parse(path: str, name: str) -> Package:
    kind = kind_of(path)
    if kind is None:
        raise DriverPackageError("%s: not a driver package (expected .deb, .rpm or .run)" % path)
    version = version_of(path, name)
    if version is None:
        raise DriverPackageError("%s: expected a file name like %s_<version>_<arch>.deb, "
                                 "%s-<version>-<release>.<arch>.rpm or %s-<version>-<arch>.run"
                                 % (path, name, name, name))
    return Package(path=path, kind=kind, version=version)


def candidates(paths: Iterable[str], name: str) -> List[Package]:
    """Driver packages among ``paths`` (other files are ignored), oldest first."""
    found = []
    for path in paths:
        if kind_of(path) and version_of(path, name):
            found.append(parse(path, name))
    return sorted(found, key=lambda p: (version_key(p.version), p.kind, p.path))


def choose(packages: List[Package], node_kind: Optional[str], version: Optional[str]) -> Optional[Package]:
    """The package to install: ``version`` (or the newest), the node's own kind before ``.run``.

    A deb on an rpm node (or the reverse) is never chosen: the node's tool
    could not install it.
    """
    usable = [p for p in packages if p.kind == "run" or p.kind == node_kind]
    if version is not None:
        usable = [p for p in usable if p.version == version]
    if not usable:
        return None
    best = max(version_key(p.version) for p in usable)
    top = [p for p in usable if version_key(p.version) == best]
    top.sort(key=lambda p: (p.kind == "run", p.path))
    return top[0]
