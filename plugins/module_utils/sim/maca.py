# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""A stand-in MXMACA install on a simulated node: what containers get from the host.

``opt/maca-<version>/`` with the directories MXMACA has (``bin``, ``lib``,
``mxgpu_llvm/lib``), a version file and a marker library, and ``opt/maca``
as a symlink to it, switched atomically (a new link renamed over the old),
as a host install with several versions side by side keeps it. No MetaX
binary: a container proves it got the host's MACA by reading the files.
"""

from __future__ import annotations

import os

from ..host import HostRoot

MACA_LINK = "opt/maca"
MARKER_LIBRARY = "lib/libmxc-runtime64.so"


def maca_dir(version: str) -> str:
    return "opt/maca-%s" % version


def install_maca(host: HostRoot, version: str, activate: bool = True) -> str:
    """Write MACA ``version`` (idempotent); with ``activate``, point ``opt/maca`` at it. Returns its node path."""
    rel = maca_dir(version)
    for sub in ("bin", "lib", "mxgpu_llvm/lib", "mxgpu_llvm/bin"):
        os.makedirs(host.join("%s/%s" % (rel, sub)), exist_ok=True)
    with open(host.join(rel + "/Version.txt"), "w") as handle:
        handle.write("Version:%s\n" % version)
    with open(host.join("%s/%s" % (rel, MARKER_LIBRARY)), "w") as handle:
        handle.write("simulated MXMACA %s runtime\n" % version)
    if activate:
        activate_maca(host, version)
    return "/" + rel


def activate_maca(host: HostRoot, version: str) -> None:
    link = host.join(MACA_LINK)
    tmp = link + ".new"
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(os.path.basename(maca_dir(version)), tmp)
    os.replace(tmp, link)
