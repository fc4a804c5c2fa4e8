# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""An image layer merged onto the layers below (whiteouts applied), and a tree copied from a
read-only image volume, both under the rules and bounds of the archive code."""

from __future__ import annotations

import errno
import os
import stat
import tarfile
from typing import List

from .limits import DEFAULT_LIMITS, ArchiveError, Budget, Limits
from .paths import (_COPY, _DIR_FLAGS, MAX_DEPTH, OPAQUE, WHITEOUT, _clear_at, _lstat_at, _mode, _open_dir_at,
                    _rmtree_at)


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
