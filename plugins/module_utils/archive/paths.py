# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Member names made paths, and the ``openat`` steps every write of the archive code takes:
each directory opened with ``O_NOFOLLOW|O_DIRECTORY`` relative to its parent's descriptor,
so that a symbolic link is never followed."""

from __future__ import annotations

import errno
import os
import stat
from typing import List, Optional

from .limits import ArchiveError

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
MAX_NAME = 4096          # PATH_MAX: a longer member name is not a path a node can have
MAX_DEPTH = 128          # path components of one member (the merge recurses per directory level)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_COPY = 1 << 20


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
