# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The plugin-registration side a kubelet plugin offers (pluginregistration/v1).

Unlike the device-plugin API, where the plugin calls the kubelet, the
kubelet's plugin watcher finds a socket in ``/var/lib/kubelet/plugins_registry``,
calls ``GetInfo`` on it (type, name, service endpoint, versions) and then
``NotifyRegistrationStatus`` with the outcome. A restarted kubelet finds the
socket again by itself; a plugin re-registers by recreating its socket.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from concurrent import futures
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from .grpc_api import HAS_GRPC, REQUIRED, grpc, reg_grpc, reg_pb

LOG = logging.getLogger("kubelet.pluginwatcher")


def remove_socket(path: str) -> None:
    """Remove a stale socket (or file) at ``path``; a directory there is an error."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        raise OSError("%s is a directory, not a socket" % path)
    os.unlink(path)


class UnixServer:
    """A gRPC server on one unix socket path (created afresh; removed on stop)."""

    def __init__(self, socket_path: str, add: Callable[[object], None], workers: int = 4, name: str = "grpc") -> None:
        if not HAS_GRPC:
            raise RuntimeError(REQUIRED)
        self.socket_path = socket_path
        self._add = add
        self._workers = workers
        self._name = name
        self._server = None
        self.inode: Optional[int] = None

    def start(self) -> None:
        self.stop()
        os.makedirs(os.path.dirname(self.socket_path) or ".", exist_ok=True)
        remove_socket(self.socket_path)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=self._workers, thread_name_prefix=self._name))
        self._add(server)
        if server.add_insecure_port("unix://" + self.socket_path) == 0:
            raise OSError("cannot listen on %s" % self.socket_path)
        server.start()
        self._server = server
        try:
            self.inode = os.stat(self.socket_path).st_ino
        except FileNotFoundError:
            # removed between the listen and this look (a kubelet cleaning its directory, on a loaded
            # node): no inode, so socket_present() is False and the owner serves it again, instead of
            # its serving thread dying here
            self.inode = None

    @property
    def running(self) -> bool:
        return self._server is not None

    def socket_present(self) -> bool:
        """False when our socket was removed or replaced (a kubelet cleaning its directories)."""
        try:
            return self.inode is not None and os.stat(self.socket_path).st_ino == self.inode
        except OSError:
            return False

    def stop(self, grace: float = 1.0) -> None:
        if self._server is None:
            return
        self._server.stop(grace).wait(grace + 1.0)
        self._server = None
        try:
            if self.inode is not None and os.stat(self.socket_path).st_ino == self.inode:
                os.unlink(self.socket_path)
        except OSError:
            pass
        self.inode = None


@dataclass
class RegistrationState:
    """What the kubelet said last: registered, and its error if not."""

    calls: int = 0
    registered: bool = False
    error: str = ""


class RegistrationService:
    """``pluginregistration.Registration``: answers GetInfo, records NotifyRegistrationStatus."""

    def __init__(self, plugin_type: str, name: str, endpoint: str, versions: Sequence[str]) -> None:
        self.info = (plugin_type, name, endpoint, tuple(versions))
        self.state = RegistrationState()
        self._cond = threading.Condition()

    def GetInfo(self, request, context):  # noqa: N802 (the gRPC method's name)
        plugin_type, name, endpoint, versions = self.info
        return reg_pb.PluginInfo(type=plugin_type, name=name, endpoint=endpoint, supported_versions=list(versions))

    def NotifyRegistrationStatus(self, request, context):  # noqa: N802
        with self._cond:
            self.state = RegistrationState(self.state.calls + 1, bool(request.plugin_registered), request.error)
            self._cond.notify_all()
        if request.plugin_registered:
            LOG.info("the kubelet registered %s (%s)", self.info[1], self.info[2])
        else:
            LOG.warning("the kubelet refused %s: %s", self.info[1], request.error)
        return reg_pb.RegistrationStatusResponse()

    def wait_registered(self, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.state.registered, timeout=timeout)

    def add_to(self, server) -> None:
        reg_grpc.add_RegistrationServicer_to_server(self, server)
