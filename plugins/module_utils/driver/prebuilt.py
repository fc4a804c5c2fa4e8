# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Payload files onto a node (:func:`copy_payload_file`), and the install and removal of a
prebuilt tree (MetaX's own layout: ``lib/modules/<release>/`` with the ``metax`` module,
``usr/bin/mx-smi``, a ``metax-driver.version`` declaration; ``backend.scan_src`` finds it):
its modules for the running kernel copied in, and removed again by its record."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from typing import List, Optional

from ..host import HostRoot
from .commands import NodeCommands
from .errors import DriverError
from .package import Package
from .records import PREBUILT_RECORD, read_record, unlink, write_record

# What a prebuilt tree's install copies from lib/modules/<release>/ (compressed modules too).
KERNEL_OBJECTS = (".ko", ".ko.xz", ".ko.zst", ".ko.gz")


def copy_payload_file(source: str, host: HostRoot, rel: str, mode: Optional[int] = None) -> None:
    """Copy one file of a payload (a local path) to ``rel`` under the node's root, atomically.

    The one place a payload's files are unpacked onto a node or into its cache
    (driver-manager's staging, the prebuilt install): an archive extraction
    replacing it later changes this function only.
    """
    # only a regular file, opened without following a link: a payload's link, FIFO or device node
    # would make root read (or block on) whatever it points at
    try:
        src_fd = os.open(source, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise DriverError("payload file %s refused: %s (only regular files are copied)" % (source, exc)) from exc
    with os.fdopen(src_fd, "rb") as src:
        if not stat.S_ISREG(os.fstat(src.fileno()).st_mode):
            raise DriverError("payload file %s refused: not a regular file" % source)
        _copy_payload_stream(src, host, rel, stat.S_IMODE(os.fstat(src.fileno()).st_mode) if mode is None else mode)


def _copy_payload_stream(src, host: HostRoot, rel: str, mode: int) -> None:
    dest = host.join(rel)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    # streamed (a vendor .run is hundreds of MB) into a temporary file beside it, then renamed
    handle, tmp = tempfile.mkstemp(prefix=".metax-copy-", dir=os.path.dirname(dest))
    try:
        with os.fdopen(handle, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
            out.flush()
            os.fsync(out.fileno())
        # never setuid/setgid/sticky from a payload (the archive routine's rule)
        os.chmod(tmp, mode & 0o777)
        os.replace(tmp, dest)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise


def install_prebuilt(host: HostRoot, cmds: NodeCommands, package: Package, kernel: Optional[str]) -> None:
    """Copy the tree's modules for the running kernel into ``lib/modules/<kernel>/`` (paths kept) and
    its tools (``usr/bin/mx-smi``) where the node has none, record the files, run ``depmod``."""
    if kernel is None or kernel not in package.kernels:
        raise DriverError("%s has no modules for the running kernel %s (it has %s)"
                          % (package.path, kernel or "?", ", ".join(package.kernels)))
    tree = host.join(package.path.strip("/"))
    files: List[str] = []
    modules = os.path.join(tree, "lib", "modules", kernel)
    for dirpath, _dirs, names in os.walk(modules):
        for name in sorted(names):
            source = os.path.join(dirpath, name)
            # kernel objects only: a tree's modules.dep & co. would replace the node's (depmod
            # writes those), and a recorded one would be deleted from the node on removal
            if os.path.islink(source) or not name.endswith(KERNEL_OBJECTS):
                continue
            rel = "lib/modules/%s/%s" % (kernel, os.path.relpath(source, modules))
            copy_payload_file(source, host, rel, 0o644)
            files.append(rel)
    tools = os.path.join(tree, "usr", "bin")
    for name in sorted(os.listdir(tools)) if os.path.isdir(tools) else ():
        rel = "usr/bin/" + name
        if not os.path.isfile(os.path.join(tools, name)) or os.path.islink(os.path.join(tools, name)):
            continue
        if os.path.lexists(host.join(rel)):
            continue                 # the node's own mx-smi (MXMACA's, the administrator's) is never replaced
        copy_payload_file(os.path.join(tools, name), host, rel, 0o755)
        files.append(rel)
    write_record(host, PREBUILT_RECORD, {"version": package.version, "driver_version": package.driver,
                                         "package": package.path, "kernel": kernel, "files": files})
    cmds.check(["depmod", "-a", kernel], "depmod for the modules of %s" % package.path)


def remove_prebuilt(host: HostRoot, cmds: NodeCommands) -> None:
    record = read_record(host, PREBUILT_RECORD) or {}
    for rel in record.get("files") or ():
        rel = str(rel).strip("/")
        if not (rel.startswith("lib/modules/") or rel.startswith("usr/bin/")) or ".." in rel.split("/"):
            continue                 # only what an install of ours could have written
        unlink(host, rel)
        parent = os.path.dirname(rel)
        kernel_dir = "lib/modules/%s" % record.get("kernel")
        while parent.startswith(kernel_dir + "/") and host.isdir(parent) and not host.listdir(parent):
            os.rmdir(host.join(parent))      # the directories the tree brought (extra/metax), not the kernel's
            parent = os.path.dirname(parent)
    if record.get("kernel"):
        cmds.check(["depmod", "-a", str(record["kernel"])], "depmod after removing the prebuilt driver")
    unlink(host, PREBUILT_RECORD)
