# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Register the device plugin with the kubelet (Registration service, v1beta1)."""

from __future__ import annotations

import logging
import os
import stat
from typing import Optional

from ..errors import MetaxGpuError
from ..names import RESOURCE_NAME
from . import constants as C
from .grpc_api import HAS_GRPC, grpc
from .grpc_api import dp_grpc as pb_grpc
from .grpc_api import dp_pb as pb

LOG = logging.getLogger("gpu-device.registration")


class RegistrationError(MetaxGpuError):
    """The kubelet could not be reached or refused the registration."""


def socket_identity(path: str) -> Optional[tuple]:
    """(device, inode, ctime) of a socket, None when it is absent or not a socket.

    A kubelet restart recreates its socket, which changes this identity.
    """
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISSOCK(st.st_mode):
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


def register(kubelet_socket: str, endpoint: str, resource_name: str = RESOURCE_NAME,
             preferred_allocation: bool = True, pre_start_required: bool = False,
             timeout: float = 5.0) -> None:
    """Call ``Registration/Register`` on the kubelet's socket.

    ``endpoint`` is our socket's file name inside the device-plugin directory.
    Raises :class:`RegistrationError` with the reason.
    """
    if not HAS_GRPC:
        raise RegistrationError("grpcio and protobuf are required (requirements/agents.txt)")
    if socket_identity(kubelet_socket) is None:
        raise RegistrationError("%s does not exist (is the kubelet running?)" % kubelet_socket)
    channel = grpc.insecure_channel("unix://" + kubelet_socket)
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout)
        stub = pb_grpc.RegistrationStub(channel)
        request = pb.RegisterRequest(
            version=C.API_VERSION, endpoint=endpoint, resource_name=resource_name,
            options=pb.DevicePluginOptions(pre_start_required=pre_start_required,
                                           get_preferred_allocation_available=preferred_allocation))
        stub.Register(request, timeout=timeout)
    except grpc.FutureTimeoutError:
        raise RegistrationError("cannot connect to %s within %.0fs" % (kubelet_socket, timeout))
    except grpc.RpcError as exc:
        raise RegistrationError("the kubelet refused the registration: %s: %s"
                                % (exc.code().name, exc.details()))
    finally:
        channel.close()
    LOG.info("registered %s with the kubelet (%s, endpoint %s)", resource_name, kubelet_socket, endpoint)
