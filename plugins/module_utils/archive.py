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
Standard library only, Python 3.8: this runs on nodes.
"""

from __future__ import annotations

import errno
import gzip
import lzma
import os
import re
import shutil
import stat
import tarfile
from dataclasses import dataclass
from typing import IO, Any, Callable, Iterator, List, Optional

from .errors import MetaxGpuError

try:
    import bz2
except ImportError:  # pragma: no cover - a Python built without it
    bz2 = None  # type: ignore[assignment]

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
GZIP_MAGIC = b"\x1f\x8b"
XZ_MAGIC = b"\xfd7zXZ\x00"
BZIP2_MAGIC = b"BZh"
WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
MAX_NAME = 4096          # PATH_MAX: a longer member name is not a path a node can have
MAX_DEPTH = 128          # path components of one member (the merge recurses per directory level)
MAX_HEADER_CHAIN = 8     # extended headers before one member (pax + GNU long name + long link is 3)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_EXTENDED = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE,
             tarfile.SOLARIS_XHDTYPE)
_COPY = 1 << 20


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
        if info.size < 0:  # base-256 sizes can be negative: tarfile would seek backwards, or loop on a seekable file
            raise ArchiveError("%s: a negative size (%d); refused" % (self._where(info.name), info.size))
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


def _bounded_info(limits: Limits) -> Any:
    """A TarInfo class that refuses an oversized extended header before ``tarfile`` reads it into memory,
    and a chain of them (each is one level of recursion in ``tarfile``)."""

    class BoundedInfo(tarfile.TarInfo):
        def _proc_member(self, tar):  # tarfile's hook for each header
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


def member_parts(name: str) -> List[str]:
    """The path components of a member name; ArchiveError for an absolute name, ``..``, or an absurd path."""
    if name.startswith("/"):
        raise ArchiveError("member %s: an absolute name; refused" % name)
    if len(name) > MAX_NAME:
        raise ArchiveError("member %s...: a name of %d characters; refused" % (name[:80], len(name)))
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ArchiveError("member %s: a name with '..'; refused" % name)
    if len(parts) > MAX_DEPTH:
        raise ArchiveError("member %s: %d levels deep (at most %d); refused" % (name[:200], len(parts), MAX_DEPTH))
    return parts


def _lstat_at(dir_fd: int, name: str) -> Optional[os.stat_result]:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _rmtree_at(dir_fd: int, name: str) -> None:
    """Remove ``name`` under ``dir_fd`` and, for a real directory, everything in it; links are removed,
    never followed."""
    st = _lstat_at(dir_fd, name)
    if st is None:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=dir_fd)
        return
    fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    try:
        for entry in os.listdir(fd):
            _rmtree_at(fd, entry)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dir_fd)


def _clear_at(dir_fd: int, name: str, keep_dir: bool = False) -> Optional[os.stat_result]:
    """Make room for a new entry ``name``: whatever is there goes (a real directory only when not
    ``keep_dir``); returns what stays."""
    st = _lstat_at(dir_fd, name)
    if st is None:
        return None
    if stat.S_ISDIR(st.st_mode):
        if keep_dir:
            return st
        _rmtree_at(dir_fd, name)
    else:
        os.unlink(name, dir_fd=dir_fd)
    return None


def _open_dir_at(dir_fd: int, name: str, shown: str, create: bool) -> int:
    """The directory ``name`` under ``dir_fd``, created when missing (``create``); never through a link."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        if not create:
            raise
        os.mkdir(name, 0o755, dir_fd=dir_fd)
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
            raise
        st = _lstat_at(dir_fd, name)
        if st is not None and stat.S_ISLNK(st.st_mode):
            raise ArchiveError("%s is a symbolic link: nothing is written through it" % shown) from None
        raise ArchiveError("%s is not a directory" % shown) from None


def _mode(mode: int) -> int:
    # no setuid, setgid, sticky, and no write for group and others: what is unpacked as root is a tree
    # every container on the node loads (an SDK's libraries), so root alone may change it
    return mode & 0o755


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
            raise ArchiveError("%s: %s" % (path, exc)) from exc
        os.chmod(stage, 0o755)
        os.rename(stage, dest)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return skipped


# ---------------------------------------------------------------------------------------------
# image layers: each staged on its own, then applied in order (whiteouts)

def merge_layer(stage: str, dest: str) -> None:
    """Apply the extracted layer ``stage`` over the tree ``dest`` (whiteouts as in the OCI image spec),
    moving its entries; ``stage`` is consumed.

    A layer directory over a symbolic link of a lower layer is refused: it
    would write (or, opaque, empty) wherever the link points.
    """
    src_fd = os.open(stage, _DIR_FLAGS)
    try:
        dst_fd = os.open(dest, _DIR_FLAGS)
        try:
            _merge_at(src_fd, dst_fd, "")
        finally:
            os.close(dst_fd)
    finally:
        os.close(src_fd)


def _whiteout_target(name: str, shown: str) -> str:
    gone = name[len(WHITEOUT):]
    if gone in ("", ".", "..") or "/" in gone:
        raise ArchiveError("layer entry %s: a whiteout of %r; refused" % (shown, gone))
    return gone


def _merge_at(src_fd: int, dst_fd: int, rel: str) -> None:
    names = sorted(os.listdir(src_fd))
    if OPAQUE in names:  # the lower layers' content of this directory is hidden: before this layer's own
        for old in os.listdir(dst_fd):
            _rmtree_at(dst_fd, old)
    for name in names:
        shown = rel + name
        if name == OPAQUE:
            continue
        if name.startswith(WHITEOUT):
            _rmtree_at(dst_fd, _whiteout_target(name, shown))
            continue
        st = os.stat(name, dir_fd=src_fd, follow_symlinks=False)
        if not stat.S_ISDIR(st.st_mode):
            _clear_at(dst_fd, name)
            os.rename(name, name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
            continue
        there = _lstat_at(dst_fd, name)
        if there is not None and stat.S_ISLNK(there.st_mode):
            raise ArchiveError("layer entry %s/: a lower layer made %s a symbolic link; nothing is written "
                               "through it" % (shown, shown))
        if there is not None and not stat.S_ISDIR(there.st_mode):
            os.unlink(name, dir_fd=dst_fd)
            there = None
        if there is None:
            os.mkdir(name, 0o700, dir_fd=dst_fd)
        sub_src = os.open(name, _DIR_FLAGS, dir_fd=src_fd)
        try:
            sub_dst = _open_dir_at(dst_fd, name, "layer entry " + shown, create=False)
            try:
                _merge_at(sub_src, sub_dst, shown + "/")
                os.fchmod(sub_dst, stat.S_IMODE(st.st_mode))
            finally:
                os.close(sub_dst)
        finally:
            os.close(sub_src)


# ---------------------------------------------------------------------------------------------
# a tree (an image volume, read-only) copied as an archive would be extracted

def copy_tree(src: str, dest: str, limits: Limits = DEFAULT_LIMITS) -> None:
    """The directory ``src`` into the new directory ``dest``, with the same rules as an archive: links
    copied as links (never followed, on either side), devices and FIFOs skipped, modes without
    setuid/setgid/sticky, the same bounds. File data goes through ``sendfile`` (no user-space buffer
    for a multi-GB tree)."""
    budget = Budget(limits, src)
    src_fd = os.open(src, _DIR_FLAGS)
    try:
        os.mkdir(dest, 0o700)
        dst_fd = os.open(dest, _DIR_FLAGS)
        try:
            _copy_at(src_fd, dst_fd, "", budget, 0)
            os.fchmod(dst_fd, _mode(os.fstat(src_fd).st_mode) | 0o700)
        finally:
            os.close(dst_fd)
    finally:
        os.close(src_fd)


def copy_files(src: str, dest: str, budget: Budget) -> List[str]:
    """The regular files directly in ``src`` into the existing directory ``dest`` (a payload's package
    directory into a node's cache); links, directories, devices and FIFOs in ``src`` are skipped, a link
    in ``dest`` is replaced, never written through. Returns the names copied, sorted."""
    copied = []
    src_fd = os.open(src, _DIR_FLAGS)
    try:
        dst_fd = os.open(dest, _DIR_FLAGS)
        try:
            for name in sorted(os.listdir(src_fd)):
                st = os.stat(name, dir_fd=src_fd, follow_symlinks=False)
                if not stat.S_ISREG(st.st_mode):
                    continue
                info = tarfile.TarInfo(name)
                info.size = st.st_size
                budget.member(info)
                budget.file(info)
                _clear_at(dst_fd, name)
                _copy_file_at(src_fd, dst_fd, name, st, budget, name)
                copied.append(name)
        finally:
            os.close(dst_fd)
    finally:
        os.close(src_fd)
    return copied


def _copy_at(src_fd: int, dst_fd: int, rel: str, budget: Budget, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise ArchiveError("%s: %s is more than %d levels deep; refused" % (budget.origin, rel, MAX_DEPTH))
    for name in sorted(os.listdir(src_fd)):
        shown = rel + name
        st = os.stat(name, dir_fd=src_fd, follow_symlinks=False)
        info = tarfile.TarInfo(shown)
        info.size = st.st_size if stat.S_ISREG(st.st_mode) else 0
        info.type = tarfile.REGTYPE if stat.S_ISREG(st.st_mode) else \
            tarfile.SYMTYPE if stat.S_ISLNK(st.st_mode) else tarfile.DIRTYPE
        budget.member(info)
        if stat.S_ISLNK(st.st_mode):
            os.symlink(os.readlink(name, dir_fd=src_fd), name, dir_fd=dst_fd)
        elif stat.S_ISDIR(st.st_mode):
            os.mkdir(name, 0o700, dir_fd=dst_fd)
            sub_src = os.open(name, _DIR_FLAGS, dir_fd=src_fd)
            try:
                sub_dst = os.open(name, _DIR_FLAGS, dir_fd=dst_fd)
                try:
                    _copy_at(sub_src, sub_dst, shown + "/", budget, depth + 1)
                    os.fchmod(sub_dst, _mode(st.st_mode) | 0o700)
                finally:
                    os.close(sub_dst)
            finally:
                os.close(sub_src)
        elif stat.S_ISREG(st.st_mode):
            budget.file(info)
            _copy_file_at(src_fd, dst_fd, name, st, budget, shown)
        # devices, FIFOs, sockets: skipped (a FIFO would block the copy, /dev/zero's twin fill the disk)


def _copy_file_at(src_fd: int, dst_fd: int, name: str, st: os.stat_result, budget: Budget, shown: str) -> None:
    infd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), dir_fd=src_fd)
    try:
        outfd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0),
                        0o600, dir_fd=dst_fd)
        try:
            left = st.st_size   # what lstat said: a file that grows meanwhile is not copied past it
            offset = 0
            while left > 0:
                try:
                    sent = os.sendfile(outfd, infd, offset, min(left, 1 << 30))
                except OSError as exc:  # pragma: no cover - a file system without sendfile between files
                    if exc.errno not in (errno.EINVAL, errno.ENOSYS):
                        raise
                    os.lseek(infd, offset, os.SEEK_SET)
                    sent = os.write(outfd, os.read(infd, min(left, _COPY)))
                if sent == 0:
                    break
                budget.write(shown, sent)
                offset += sent
                left -= sent
            os.fchmod(outfd, _mode(st.st_mode))
            os.utime(outfd, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(outfd)
    finally:
        os.close(infd)
