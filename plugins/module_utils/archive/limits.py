# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""How much one archive may hold (:class:`Limits`), and what has been spent of it (:class:`Budget`)."""

from __future__ import annotations

import re
import tarfile
from dataclasses import dataclass

from ..errors import MetaxGpuError

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


class ArchiveError(MetaxGpuError):
    """A member that cannot be unpacked safely, or a bound exceeded (the message names the member)."""


@dataclass(frozen=True)
class Limits:
    """How much one archive may hold. The defaults fit a real MXMACA payload (a 5-9.5 GB ``/opt/maca``
    layer, tens of thousands of files) with room to spare; raise them for a larger one."""
    max_members: int = 1000000          # members, counted at every level (an image archive and its layers)
    max_member_size: int = 32 * GiB     # one regular file
    max_total_size: int = 128 * GiB     # what the archive expands to, and what is written from it
    max_header_size: int = 1 * MiB      # one pax / GNU long-name header (they are read into memory)

    def __post_init__(self) -> None:
        for name in ("max_members", "max_member_size", "max_total_size", "max_header_size"):
            if getattr(self, name) < 1:
                raise ArchiveError("%s must be at least 1, not %r" % (name, getattr(self, name)))


DEFAULT_LIMITS = Limits()
# a Helm chart: Helm's own bounds for a chart archive (100 MiB decompressed, 5 MiB per file)
CHART_LIMITS = Limits(max_members=100000, max_member_size=5 * MiB, max_total_size=100 * MiB, max_header_size=64 * KiB)

_SIZE = re.compile(r"^\s*(\d+)\s*([kmgtp]?)(i?b?)\s*$", re.IGNORECASE)


def parse_size(value) -> int:
    """Bytes of ``value``: an int, or ``"64GiB"``, ``"64G"``, ``"512MiB"``, ``"1000000"`` (binary units)."""
    if isinstance(value, bool):
        raise ArchiveError("%r is not a size" % (value,))
    if isinstance(value, int):
        number = value
    else:
        match = _SIZE.match(str(value))
        if not match or (match.group(3) and not match.group(2) and match.group(3).lower() != "b"):
            raise ArchiveError("%r is not a size (bytes, or a number with K, M, G, T or P: 64GiB)" % (value,))
        number = int(match.group(1)) << (10 * " kmgtp".index(match.group(2).lower() or " "))
    if number < 1:
        raise ArchiveError("%r is not a positive size" % (value,))
    return number


def limits_from(max_members=None, max_member_size=None, max_total_size=None) -> Limits:
    """Limits from an administrator's options (sizes as ``parse_size`` reads them); None keeps the default."""
    default = DEFAULT_LIMITS
    return Limits(max_members=default.max_members if max_members is None else int(max_members),
                  max_member_size=default.max_member_size if max_member_size is None else parse_size(max_member_size),
                  max_total_size=default.max_total_size if max_total_size is None else parse_size(max_total_size),
                  max_header_size=default.max_header_size)


class Budget:
    """What has been spent of :class:`Limits` so far (one per archive, shared by its layers)."""

    def __init__(self, limits: Limits = DEFAULT_LIMITS, origin: str = "") -> None:
        self.limits = limits
        self.origin = origin
        self.members = 0
        self.expanded = 0       # declared sizes of a container's members (an image archive's layers)
        self.written = 0        # bytes written to the destination

    def _where(self, name: str) -> str:
        return "%s: member %s" % (self.origin, name) if self.origin else "member %s" % name

    def member(self, info: tarfile.TarInfo, container: bool = False) -> None:
        """One more member read; ``container``: of an archive whose members are archives (not written
        themselves), so their sizes count as what the archive expands to."""
        self.members += 1
        # a negative size (base-256) is refused where tarfile reads the header (archive._bounded_info):
        # here would be too late on Pythons whose tarfile ends the archive at such a header
        if self.members > self.limits.max_members:
            raise ArchiveError("%s: more than %d members (max_members); refused"
                               % (self._where(info.name), self.limits.max_members))
        if container and info.isreg():
            self.expanded += info.size
            if self.expanded > self.limits.max_total_size:
                raise ArchiveError("%s: the archive expands to more than max_total_size (%d bytes); refused"
                                   % (self._where(info.name), self.limits.max_total_size))

    def file(self, info: tarfile.TarInfo) -> None:
        """A regular member about to be written: refused before a byte is, when too large."""
        if info.size > self.limits.max_member_size:
            raise ArchiveError("%s is %d bytes, above max_member_size (%d); refused"
                               % (self._where(info.name), info.size, self.limits.max_member_size))
        if self.written + info.size > self.limits.max_total_size:
            raise ArchiveError("%s: the archive expands to more than max_total_size (%d bytes); refused"
                               % (self._where(info.name), self.limits.max_total_size))

    def write(self, name: str, amount: int) -> None:
        self.written += amount
        if self.written > self.limits.max_total_size:
            raise ArchiveError("%s: more than max_total_size (%d bytes) written; refused"
                               % (self._where(name), self.limits.max_total_size))
