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
from typing import Optional

from ..host import HostRoot

MACA_LINK = "opt/maca"
MARKER_LIBRARY = "lib/libmxc-runtime64.so"
PRODUCT_FILE = "share/metax-gpu/product"   # which payload the tree came from (the payload images)


def maca_dir(version: str) -> str:
    return "opt/maca-%s" % version


def write_tree(path: str, version: str, product: Optional[str] = None) -> None:
    """The MXMACA tree of ``version`` at ``path`` (idempotent): a node's install, or a payload image's /opt/maca."""
    for sub in ("bin", "lib", "mxgpu_llvm/lib", "mxgpu_llvm/bin"):
        os.makedirs(os.path.join(path, sub), exist_ok=True)
    with open(os.path.join(path, "Version.txt"), "w") as handle:
        handle.write("Version:%s\n" % version)
    with open(os.path.join(path, MARKER_LIBRARY), "w") as handle:
        handle.write("simulated MXMACA %s runtime\n" % version)
    if product:
        os.makedirs(os.path.dirname(os.path.join(path, PRODUCT_FILE)), exist_ok=True)
        with open(os.path.join(path, PRODUCT_FILE), "w") as handle:
            handle.write(product + "\n")


def install_maca(host: HostRoot, version: str, activate: bool = True) -> str:
    """Write MACA ``version`` (idempotent); with ``activate``, point ``opt/maca`` at it. Returns its node path."""
    rel = maca_dir(version)
    write_tree(host.join(rel), version)
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
