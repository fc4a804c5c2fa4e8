# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The node's own tools, as the driver code runs them, and its package database's answer.

A bare name (``dpkg``, ``modprobe``) is the node's own tool. With ``host_root``
``/`` it runs as is; on a simulated root it is the executable the root carries
(sim.pkgtool); under any other root (a node mounted at ``/host``) it runs
through ``chroot``. A command whose first word is a path runs as given: that is
how tests and special nodes replace the load command.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple

from ..host import HostRoot
from .errors import DriverCommandError, DriverError

TOOL_DIRS = ("usr/bin", "bin", "usr/sbin", "sbin", "usr/local/bin", "usr/local/sbin")

Runner = Callable[[List[str]], Tuple[int, str, str]]


class NodeCommands:
    """Runs the node's own tools (see the module docstring for how names resolve)."""

    def __init__(self, host: HostRoot, runner: Optional[Runner] = None) -> None:
        self.host = host
        self.runner = runner or (lambda argv: host.run(argv, timeout=900))

    def has_tool(self, name: str) -> bool:
        return self.host.which(name, TOOL_DIRS) is not None

    def resolve(self, argv: Sequence[str]) -> List[str]:
        argv = list(argv)
        if "/" in argv[0] or self.host.path == "/":
            return argv
        if self.host.is_simulated():
            local = self.host.which(argv[0], TOOL_DIRS)
            if local is None:
                raise DriverError("%s: no such tool on the node (%s)" % (argv[0], self.host.path))
            return [local] + argv[1:]
        return ["chroot", self.host.path] + argv

    def node_file(self, node_path: str) -> str:
        """A node path as the command that receives it must see it."""
        if self.host.path == "/" or self.host.is_simulated():
            return self.host.join(node_path.lstrip("/"))
        return node_path      # chroot: the node's own view

    def run(self, argv: Sequence[str]) -> Tuple[int, str, str]:
        return self.runner(self.resolve(argv))

    def check(self, argv: Sequence[str], what: str) -> str:
        rc, out, err = self.run(argv)
        if rc != 0:
            raise DriverCommandError("%s failed (rc=%d): %s: %s" % (
                what, rc, " ".join(argv), (err or out).strip()[-400:]))
        return out


def node_kind(cmds: NodeCommands) -> Optional[str]:
    if cmds.has_tool("dpkg-query") and cmds.has_tool("dpkg"):
        return "deb"
    if cmds.has_tool("rpm"):
        return "rpm"
    return None


def query_package(cmds: NodeCommands, kind: Optional[str], name: str) -> Optional[str]:
    if kind == "deb":
        rc, out, _err = cmds.run(["dpkg-query", "-W", "-f=${Status}\t${Version}", name])
        if rc == 0 and "\t" in out:
            status, version = out.strip().split("\t", 1)
            if status.endswith(" installed") and version:
                return version.split("-", 1)[0]      # upstream version; the file name has no revision
        return None
    if kind == "rpm":
        rc, out, _err = cmds.run(["rpm", "-q", "--qf", "%{VERSION}", name])
        if rc == 0 and out.strip() and "not installed" not in out:
            return out.strip()
    return None
