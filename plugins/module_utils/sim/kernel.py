# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Kernel reactions to attribute writes on a simulated node.

Reached only through :meth:`HostRoot.write_attribute`, so code under test
writes sysfs exactly as on a real node and sees the same errors: writing
``sriov_numvfs`` creates or removes ``virtfn*`` VFs, and a non-zero value
cannot replace another non-zero value (the kernel answers EBUSY).
"""

from __future__ import annotations

import errno
import os

from ..host import HostRoot, HostRootError
from . import generator


class SimulatedKernel:
    def __init__(self, host: HostRoot) -> None:
        self.host = host

    def write_attribute(self, rel: str, value: str) -> None:
        node_path = self.host.realpath(rel)
        if os.path.basename(node_path) == "sriov_numvfs":
            self._sriov_numvfs(node_path, value)
            return
        path = self.host.join(node_path)
        if not os.path.exists(path):
            raise HostRootError("cannot write %r to %s: %s" % (value, path, os.strerror(errno.ENOENT)))
        with open(path, "w") as handle:
            handle.write(value)

    def _fail(self, path: str, value: str, code: int) -> None:
        raise HostRootError("cannot write %r to %s: %s" % (value, self.host.join(path), os.strerror(code)))

    def _sriov_numvfs(self, node_path: str, value: str) -> None:
        pf_dir = os.path.dirname(node_path).lstrip("/")
        try:
            wanted = int(value.strip(), 0)
        except ValueError:
            self._fail(node_path, value, errno.EINVAL)
        total = self.host.read_int(pf_dir + "/sriov_totalvfs", default=0)
        current = self.host.read_int(pf_dir + "/sriov_numvfs", default=0)
        if wanted < 0 or wanted > total:
            self._fail(node_path, value, errno.ERANGE if total else errno.EINVAL)
        if wanted == current:
            return
        if wanted and current:
            self._fail(node_path, value, errno.EBUSY)
        if wanted and not self.host.exists("sys/module/metax"):
            # no PF driver bound: the kernel refuses to enable SR-IOV
            self._fail(node_path, value, errno.ENOENT)
        generator.set_numvfs(self.host, pf_dir, wanted)
