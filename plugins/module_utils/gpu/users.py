# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Which processes hold device nodes open: the one /proc scan.

The driver's in-use check (``driver/inuse``: may the module be unloaded?)
and the vfnum change (``vfnum/backend``: would the change pull devices from
under a job?) ask the same question of different node sets, and word their
answers for their own reports; the scan itself is here, once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, List

from ..host import HostRoot, HostRootError


@dataclass(frozen=True)
class DeviceUser:
    """One process holding one device node open."""

    pid: str
    comm: str        # /proc/<pid>/comm, "?" when unreadable
    node: str        # the device node's path, e.g. /dev/dri/card0


def open_device_users(host: HostRoot, nodes: Collection[str]) -> List[DeviceUser]:
    """Processes under the host root's /proc holding any of ``nodes`` open, by pid then node."""
    users: List[DeviceUser] = []
    if not nodes:
        return users
    for pid in sorted((p for p in host.listdir("proc") if p.isdigit()), key=int):
        try:
            fds = host.listdir("proc/%s/fd" % pid)
        except HostRootError:
            continue     # the process ended, or is not ours to read
        held = sorted({t for t in (host.readlink("proc/%s/fd/%s" % (pid, fd)) for fd in fds) if t is not None and t in nodes})
        if held:
            comm = host.read_attribute("proc/%s/comm" % pid, default="?")
            users.extend(DeviceUser(pid, comm, node) for node in held)
    return users
