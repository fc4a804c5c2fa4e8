# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Unpack archives without leaving the destination, and within bounds (issue 39; docs/security.md).

The one routine for every archive the collection unpacks on a node or on the
bastion: tar (plain, gzip, bzip2, xz), image layers with their whiteouts
(``.wh.NAME`` removes NAME from the layers below, ``.wh..wh..opq`` empties
its directory), and a tree copied from a read-only image volume.

Every member is resolved against the destination one path component at a
time, each directory opened with ``O_NOFOLLOW|O_DIRECTORY`` relative to its
parent's descriptor (``openat``): a symbolic link an earlier member made is
never followed. A later member whose path passes through one is refused;
a directory, file or link entry of the same name replaces it (the link, not
what it points at). Hard links may only name a regular file already
extracted into the same tree. Modes lose setuid, setgid and sticky (nothing
in an SDK needs them on the host) and are set through the descriptor of
what was created (``fchmod``), never through a path; group and others never
get write: the tree is loaded by every container on the node. Device nodes and FIFOs
are skipped: an SDK ships none, and ``mknod`` as root is what an attacker
would want.

Bounds (:class:`Limits`, which an administrator can raise): member count,
the size of one member, the bytes an archive expands to and the bytes
written from it, and the size of one extended header. Headers are not kept:
``tarfile`` remembers every member it read (200,000 members were
+110 to +190 MiB), so :func:`members` empties that list as it goes.

A refusal names the member; callers extract into a staging directory next to
the destination and rename it into place only when complete (:func:`extract`
does both), so a refused archive leaves nothing half-written.
Standard library only, Python 3.8: this runs on nodes. Split by job: the bounds
(``limits.py``), member paths and the ``openat`` steps (``paths.py``), layer merge and
tree copy (``tree.py``); every name is importable from here.
"""

from __future__ import annotations

import gzip
import lzma
import os
import shutil
import stat
import tarfile
from typing import IO, Any, Callable, Iterator, List, Optional

try:
    import bz2
except ImportError:  # pragma: no cover - a Python built without it
    bz2 = None  # type: ignore[assignment]

# split by job: the bounds (limits.py), member paths and the openat steps (paths.py), layer merge and
# tree copy (tree.py); this module reads and extracts tars, and every name callers use stays here (archive.X)
from .limits import (CHART_LIMITS, DEFAULT_LIMITS, GiB, KiB, MiB, ArchiveError, Budget, Limits,  # noqa: F401  pylint: disable=unused-import
                     limits_from, parse_size)
from .paths import (_COPY, _DIR_FLAGS, MAX_DEPTH, MAX_NAME, OPAQUE, WHITEOUT, _clear_at, _lstat_at,  # noqa: F401  pylint: disable=unused-import
                    _mode, _open_dir_at, member_parts)
from .tree import copy_files, copy_tree, merge_layer  # noqa: F401  pylint: disable=unused-import

GZIP_MAGIC = b"\x1f\x8b"
XZ_MAGIC = b"\xfd7zXZ\x00"
BZIP2_MAGIC = b"BZh"
MAX_HEADER_CHAIN = 8     # extended headers before one member (pax + GNU long name + long link is 3)
_EXTENDED = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE,
             tarfile.SOLARIS_XHDTYPE)


def _bounded_info(limits: Limits) -> Any:
    """A TarInfo class that refuses an oversized extended header before ``tarfile`` reads it into memory,
    and a chain of them (each is one level of recursion in ``tarfile``)."""

    class BoundedInfo(tarfile.TarInfo):
        def _proc_member(self, tar):  # pylint: disable=arguments-renamed  # tarfile's hook for each header
            # Base-256 sizes can be negative. Refused here, before tarfile's own check: Pythons with the
            # fix for negative offsets (CPython gh-130577, Debian's 3.11.2-6+deb12u8) raise ReadError for
            # a first member and end the archive quietly at a later one; the others seek backwards, or
            # loop on a seekable file.
            if self.size < 0:
                raise ArchiveError("member %s: a negative size (%d); refused" % (self.name, self.size))
            if self.type in _EXTENDED:
                depth = getattr(tar, "_metax_chain", 0) + 1
                setattr(tar, "_metax_chain", depth)
                if self.size > limits.max_header_size:
                    raise ArchiveError("an extended tar header of %d bytes at offset %d is above max_header_size (%d); "
                                       "refused" % (self.size, self.offset, limits.max_header_size))
                if depth > MAX_HEADER_CHAIN:
                    raise ArchiveError("%d extended tar headers in a row at offset %d; refused" % (depth, self.offset))
            return super()._proc_member(tar)

    return BoundedInfo


class Prefixed:
    """A stream with the bytes already read from it (to tell what it is) put back in front."""

    def __init__(self, head: bytes, rest: IO[bytes]) -> None:
        self.head = head
        self.rest = rest

    def read(self, amount: int = -1) -> bytes:
        if not self.head:
            return self.rest.read(amount)
        if amount is None or amount < 0:
            data, self.head = self.head + self.rest.read(), b""
            return data
        data, self.head = self.head[:amount], self.head[amount:]
        return data

    def readable(self) -> bool:
        return True


def decompressed(fileobj: IO[bytes]) -> Any:
    """``fileobj`` decompressed by its magic (gzip, xz, bzip2; else as it is), a bounded amount per read.

    Not tarfile's own ``r|*``: it hands each compressed chunk to the decompressor whole, so 37 KiB of xz
    became some 240 MiB in one call. The standard library's file classes decompress at most what is asked.
    """
    head = fileobj.read(len(XZ_MAGIC))
    stream: Any = Prefixed(head, fileobj)
    if head.startswith(GZIP_MAGIC):
        return gzip.GzipFile(fileobj=stream, mode="rb")
    if head.startswith(XZ_MAGIC):
        return lzma.LZMAFile(stream)
    if head.startswith(BZIP2_MAGIC):
        if bz2 is None:  # pragma: no cover - a Python built without bz2
            raise ArchiveError("a bzip2-compressed archive needs Python's bz2 module")
        return bz2.BZ2File(stream)
    return stream


def open_stream(fileobj: IO[bytes], limits: Limits = DEFAULT_LIMITS) -> tarfile.TarFile:
    """A tar read forward only, compressed or not (gzip, xz, bzip2: by their magic)."""
    return tarfile.open(fileobj=decompressed(fileobj), mode="r|", tarinfo=_bounded_info(limits), bufsize=_COPY)


def open_seekable(fileobj: IO[bytes], limits: Limits = DEFAULT_LIMITS) -> tarfile.TarFile:
    """An uncompressed tar that may be seeked (member offsets stay valid: the registry pushes slices)."""
    return tarfile.open(fileobj=fileobj, mode="r:", tarinfo=_bounded_info(limits))


def members(tar: tarfile.TarFile, budget: Budget, container: bool = False) -> Iterator[tarfile.TarInfo]:
    """Each member once, counted against ``budget`` (``container``: see :meth:`Budget.member`);
    none is kept by ``tar``."""
    while True:
        setattr(tar, "_metax_chain", 0)
        info = tar.next()
        # tarfile appends every header to tar.members (getmembers, and extractfile's link lookups);
        # nothing here needs them, and 200k members were +110 to +190 MiB
        tar.members = []  # type: ignore[attr-defined]
        if info is None:
            return
        budget.member(info, container)
        yield info


class Extractor:
    """Members into the directory ``root`` (which exists), each resolved component by component."""

    def __init__(self, root: str, budget: Budget) -> None:
        self.root = root
        self.budget = budget
        self.root_fd = os.open(root, _DIR_FLAGS)
        self.skipped: List[str] = []

    def close(self) -> None:
        if self.root_fd >= 0:
            os.close(self.root_fd)
            self.root_fd = -1

    def __enter__(self) -> "Extractor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _parent(self, parts: List[str], member: str, create: bool = True) -> int:
        fd = os.dup(self.root_fd)
        try:
            for i, part in enumerate(parts[:-1]):
                shown = "member %s: %s" % (member, "/".join(parts[:i + 1]))
                new = _open_dir_at(fd, part, shown, create)
                os.close(fd)
                fd = new
        except BaseException:
            os.close(fd)
            raise
        return fd

    def add(self, tar: tarfile.TarFile, info: tarfile.TarInfo, parts: Optional[List[str]] = None,
            link_parts: Optional[List[str]] = None) -> bool:
        """Extract ``info`` at ``parts`` (default: its own name); False when skipped (a device, a FIFO).

        ``link_parts``: where a hard link's target is in this tree (default: its linkname).
        """
        if parts is None:
            parts = member_parts(info.name)
        if not parts:  # the archive's root ("./"): the destination's mode is the caller's
            return True
        if not (info.isdir() or info.isreg() or info.issym() or info.islnk()):
            self.skipped.append(info.name)
            return False
        try:
            parent = self._parent(parts, info.name)
        except FileNotFoundError as exc:  # pragma: no cover - create=True makes every parent
            raise ArchiveError("member %s: %s" % (info.name, exc)) from exc
        name = parts[-1]
        try:
            if info.isdir():
                self._dir(parent, name, info)
            elif info.isreg():
                self._file(parent, name, info, tar)
            elif info.issym():
                _clear_at(parent, name)
                os.symlink(info.linkname, name, dir_fd=parent)
            else:
                self._hardlink(parent, name, info, parts,
                               link_parts if link_parts is not None else member_parts(info.linkname))
        finally:
            os.close(parent)
        return True

    def _dir(self, parent: int, name: str, info: tarfile.TarInfo) -> None:
        # a link (or file) of this name is replaced by a real directory: never chmod what a link names
        if _clear_at(parent, name, keep_dir=True) is None:
            os.mkdir(name, 0o700, dir_fd=parent)
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
        try:
            os.fchmod(fd, _mode(info.mode) | 0o700)  # the owner keeps the right to finish and to clean up
        finally:
            os.close(fd)

    def _file(self, parent: int, name: str, info: tarfile.TarInfo, tar: tarfile.TarFile) -> None:
        self.budget.file(info)
        source = tar.extractfile(info)
        _clear_at(parent, name)
        # O_EXCL|O_NOFOLLOW: a new inode, even if something raced a link in
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600,
                     dir_fd=parent)
        with os.fdopen(fd, "wb") as out:
            if source is not None:
                while True:
                    block = source.read(_COPY)
                    if not block:
                        break
                    self.budget.write(info.name, len(block))
                    out.write(block)
            os.fchmod(out.fileno(), _mode(info.mode))
            out.flush()
            try:
                os.utime(out.fileno(), (info.mtime, info.mtime))
            except (OverflowError, ValueError, OSError):  # a nonsense time is not worth refusing the archive
                pass

    def _hardlink(self, parent: int, name: str, info: tarfile.TarInfo, parts: List[str], target: List[str]) -> None:
        if not target:
            raise ArchiveError("member %s: a hard link to the archive's root; refused" % info.name)
        if target == parts:
            return
        try:
            tparent = self._parent(target, info.name, create=False)
        except FileNotFoundError:
            raise ArchiveError("member %s: a hard link to %s, which is not in the tree; refused"
                               % (info.name, info.linkname)) from None
        try:
            st = _lstat_at(tparent, target[-1])
            if st is None or not stat.S_ISREG(st.st_mode):
                raise ArchiveError("member %s: a hard link to %s, which is not a regular file extracted before it; "
                                   "refused" % (info.name, info.linkname))
            _clear_at(parent, name)
            os.link(target[-1], name, src_dir_fd=tparent, dst_dir_fd=parent, follow_symlinks=False)
        finally:
            os.close(tparent)


def extract_members(tar: tarfile.TarFile, root: str, budget: Budget,
                    select: Optional[Callable[[str], Optional[List[str]]]] = None) -> List[str]:
    """Every member of ``tar`` (or those ``select`` maps to a path in ``root``) into ``root``;
    the names of the members skipped (devices, FIFOs)."""
    with Extractor(root, budget) as out:
        for info in members(tar, budget):
            parts = member_parts(info.name)
            if select is not None:
                mapped = select("/".join(parts))
                if mapped is None:
                    continue
                parts = mapped
            link_parts = None
            if info.islnk():
                try:
                    link_parts = member_parts(info.linkname)
                except ArchiveError:
                    raise ArchiveError("member %s: a hard link to %s, outside the archive; refused"
                                       % (info.name, info.linkname)) from None
                if select is not None:
                    link_parts = select("/".join(link_parts))
                    if link_parts is None:
                        # its data is outside what is extracted: a copy would read what we refused to write
                        out.skipped.append(info.name)
                        continue
            out.add(tar, info, parts, link_parts)
        return out.skipped


def staging_for(dest: str) -> str:
    """A staging directory beside ``dest``: the same file system, so the final rename is atomic."""
    parent, base = os.path.split(os.path.abspath(dest))
    return os.path.join(parent, ".%s.%d.tmp" % (base, os.getpid()))


def extract(path: str, dest: str, limits: Limits = DEFAULT_LIMITS,
            select: Optional[Callable[[str], Optional[List[str]]]] = None) -> List[str]:
    """The tar ``path`` (plain, gzip, bzip2 or xz) into the new directory ``dest``: whole or absent.

    Extracted beside ``dest`` and renamed into place when complete; on any
    failure the staging directory is removed and ``dest`` was never created.
    Returns the members skipped (devices, FIFOs).
    """
    if os.path.lexists(dest):
        raise ArchiveError("%s exists: an archive is extracted into a new directory" % dest)
    stage = staging_for(dest)
    shutil.rmtree(stage, ignore_errors=True)
    os.mkdir(stage, 0o700)
    budget = Budget(limits)
    try:
        try:
            with open(path, "rb") as raw, open_stream(raw, limits) as tar:
                skipped = extract_members(tar, stage, budget, select)
        except (tarfile.TarError, EOFError, OSError, lzma.LZMAError) as exc:
            raise ArchiveError("%s: cannot extract (%s)" % (path, exc)) from exc
        except ArchiveError as exc:
            raise ArchiveError("%s: %s" % (path, exc)) from exc  # pylint: disable=bad-exception-cause
        os.chmod(stage, 0o755)
        os.rename(stage, dest)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return skipped


# ---------------------------------------------------------------------------------------------
# image layers: each staged on its own, then applied in order (whiteouts)
