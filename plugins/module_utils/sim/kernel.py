# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Kernel reactions to attribute writes on a simulated node.

Runs as a separate process: the generator installs ``.metax-sim/kernel``
(see :func:`install_hook`) in every simulated root, and
:meth:`HostRoot.write_attribute` executes it instead of writing the file. So
code under test writes sysfs exactly as on a real node and sees the same
errors, while no module ever imports this file: writing ``sriov_numvfs``
creates or removes ``virtfn*`` VFs, a non-zero value cannot replace another
non-zero value (EBUSY), values above ``sriov_totalvfs`` give ERANGE, and
garbage or SR-IOV on a GPU without it gives EINVAL.

Hook protocol (docs/simulated-node.md): ``kernel write <node-path>``, value
on stdin; exit status 0 or the errno, reason on stderr.
"""

from __future__ import annotations

import errno
import os
import sys
from typing import List, Optional

from ..errors import MetaxGpuError
from ..host import SIM_KERNEL_HOOK, HostRoot
from . import generator


class KernelRefusal(MetaxGpuError):
    """The kernel's answer to a write: an errno."""

    def __init__(self, code: int) -> None:
        super().__init__(os.strerror(code))
        self.code = code


class SimulatedKernel:
    def __init__(self, host: HostRoot) -> None:
        self.host = host

    def write_attribute(self, rel: str, value: str) -> None:
        """Apply a write as the kernel would; raises KernelRefusal."""
        node_path = self.host.realpath(rel)
        if os.path.basename(node_path) == "sriov_numvfs":
            self._sriov_numvfs(node_path, value)
            return
        path = self.host.join(node_path)
        if not os.path.exists(path):
            raise KernelRefusal(errno.ENOENT)
        with open(path, "w") as handle:
            handle.write(value)

    def _sriov_numvfs(self, node_path: str, value: str) -> None:
        pf_dir = os.path.dirname(node_path).lstrip("/")
        try:
            wanted = int(value.strip(), 0)
        except ValueError:
            raise KernelRefusal(errno.EINVAL)
        total = self.host.read_int(pf_dir + "/sriov_totalvfs", default=0)
        current = self.host.read_int(pf_dir + "/sriov_numvfs", default=0)
        if wanted < 0 or wanted > total:
            raise KernelRefusal(errno.ERANGE if total else errno.EINVAL)
        if wanted == current:
            return
        if wanted and current:
            raise KernelRefusal(errno.EBUSY)
        if wanted and not self.host.exists("sys/module/metax"):
            # no PF driver bound: the kernel refuses to enable SR-IOV
            raise KernelRefusal(errno.ENOENT)
        generator.set_numvfs(self.host, pf_dir, wanted)


def _collections_dir() -> str:
    """The directory holding ``ansible_collections`` this code was imported from."""
    parts = os.path.abspath(__file__).split(os.sep)
    if "ansible_collections" not in parts:
        raise RuntimeError("the simulator must be imported as ansible_collections.metax.gpu")
    cut = len(parts) - 1 - parts[::-1].index("ansible_collections")
    return os.sep.join(parts[:cut]) or os.sep


HOOK_TEMPLATE = """#!/usr/bin/env python3
# Simulated kernel of a metax.gpu simulated node (written by sim.generator).
# HostRoot.write_attribute runs this instead of writing sysfs; see
# docs/simulated-node.md. Not present, and never consulted, on a real node.
import os
import sys

sys.path.insert(0, %(collections)r)
from ansible_collections.metax.gpu.plugins.module_utils.sim.kernel import main

sys.exit(main(sys.argv[1:], os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
"""


def install_hook(root: str) -> str:
    """Write the executable kernel hook into a simulated root; returns its path."""
    target = os.path.join(root, SIM_KERNEL_HOOK)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    tmp = target + ".tmp"
    with open(tmp, "w") as handle:
        handle.write(HOOK_TEMPLATE % {"collections": _collections_dir()})
    os.chmod(tmp, 0o755)
    os.replace(tmp, target)
    return target


def main(argv: List[str], root: Optional[str] = None) -> int:
    """Hook entry point: ``write <node-path>`` with the value on stdin."""
    if len(argv) != 2 or argv[0] != "write":
        sys.stderr.write("usage: kernel write <node-path>  (value on stdin)\n")
        return errno.EINVAL
    host = HostRoot(root or os.environ.get("METAX_HOST_ROOT", ""))
    value = sys.stdin.read()
    try:
        SimulatedKernel(host).write_attribute(argv[1], value)
    except KernelRefusal as refusal:
        sys.stderr.write("%s\n" % refusal)
        return refusal.code
    except generator.SimError as exc:
        sys.stderr.write("%s: %s\n" % (os.strerror(errno.EINVAL), exc))
        return errno.EINVAL
    return 0
