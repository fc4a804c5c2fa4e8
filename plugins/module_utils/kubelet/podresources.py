# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Which devices the kubelet has assigned to containers (pod-resources API v1).

The kubelet serves ``PodResourcesLister`` on
``/var/lib/kubelet/pod-resources/kubelet.sock``. gpu-device learns the
allocated devices from ``List`` only, never from its own Allocate calls (a
pod may fail to start, be deleted, or have been allocated before the plugin
restarted).
"""

from __future__ import annotations

import logging
from typing import Callable, Dict, FrozenSet, List, Optional, Tuple

from ..errors import MetaxGpuError
from ..names import RESOURCE_NAME
from . import constants as C
from .grpc_api import HAS_GRPC, grpc
from .grpc_api import pr_grpc as pb_grpc
from .grpc_api import pr_pb as pb

LOG = logging.getLogger("gpu-device.podresources")


class PodResourcesError(MetaxGpuError):
    """The pod-resources socket cannot be used."""


def allocated_from_response(response, resource_name: str = RESOURCE_NAME) -> Dict[str, Tuple[str, str, str]]:
    """device ID -> (namespace, pod, container) for ``resource_name`` in a ListPodResourcesResponse."""
    out: Dict[str, Tuple[str, str, str]] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                if devices.resource_name != resource_name:
                    continue
                for dev_id in devices.device_ids:
                    out[dev_id] = (pod.namespace, pod.name, container.name)
    return out


class PodResourcesClient:
    """A reusable channel to the kubelet's pod-resources socket."""

    def __init__(self, socket_path: str = C.POD_RESOURCES_SOCKET, timeout: float = 5.0) -> None:
        if not HAS_GRPC:
            raise PodResourcesError("grpcio and protobuf are required (requirements/agents.txt)")
        self.socket_path = socket_path
        self.timeout = timeout
        self._channel = None
        self._stub = None

    def _connect(self):
        if self._stub is None:
            self._channel = grpc.insecure_channel("unix://" + self.socket_path)
            self._stub = pb_grpc.PodResourcesListerStub(self._channel)
        return self._stub

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = self._stub = None

    def list_allocated(self, resource_name: str = RESOURCE_NAME) -> Dict[str, Tuple[str, str, str]]:
        """device ID -> (namespace, pod, container) of every assigned device of ``resource_name``."""
        try:
            response = self._connect().List(pb.ListPodResourcesRequest(), timeout=self.timeout)
        except grpc.RpcError as exc:
            self.close()   # the kubelet may have restarted: reconnect next time
            raise PodResourcesError("List on %s failed: %s: %s"
                                    % (self.socket_path, exc.code().name, exc.details()))
        return allocated_from_response(response, resource_name)

    def allocatable(self, resource_name: str = RESOURCE_NAME) -> Optional[List[str]]:
        """Device IDs the kubelet counts as allocatable (GetAllocatableResources); None if unsupported."""
        try:
            response = self._connect().GetAllocatableResources(pb.AllocatableResourcesRequest(),
                                                               timeout=self.timeout)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                return None
            self.close()
            raise PodResourcesError("GetAllocatableResources on %s failed: %s: %s"
                                    % (self.socket_path, exc.code().name, exc.details()))
        ids: List[str] = []
        for devices in response.devices:
            if devices.resource_name == resource_name:
                ids.extend(devices.device_ids)
        return ids


def allocated_ids(allocations: Dict[str, Tuple[str, str, str]]) -> FrozenSet[str]:
    return frozenset(allocations)


def holders(allocations: Dict[str, Tuple[str, str, str]]) -> List[str]:
    """``namespace/name`` of the pods that hold at least one of the devices, sorted, once each."""
    return sorted({"%s/%s" % (namespace, pod) for namespace, pod, _container in allocations.values()})


def gpu_holders(socket_path: str = C.POD_RESOURCES_SOCKET) -> Callable[[], List[str]]:
    """``namespace/name`` of the pods the kubelet has assigned this node's GPUs to, asked at each call
    (driver-manager's, which lists no pods). One channel, opened on the first call: a caller that
    never asks (a unit test, a benchmark's stand-in) never opens it."""
    client: List[PodResourcesClient] = []

    def ask() -> List[str]:
        if not client:
            client.append(PodResourcesClient(socket_path))
        return holders(client[0].list_allocated())

    return ask
