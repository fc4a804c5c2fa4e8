# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The DRA node service (``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin``) and its registration.

Two unix sockets, both in the kubelet's directories (mounted into the pod at
the same paths, since the kubelet dials the endpoint it is told):

- ``<plugins dir>/gpu.metax-tech.com/dra.sock``: NodePrepareResources /
  NodeUnprepareResources, answered by :class:`prepare.Preparer`, and the
  kubelet's device-health stream (``v1alpha1.DRAResourceHealth``, KEP-4680,
  :mod:`.health`) when a health feed is given;
- ``<plugins registry>/gpu.metax-tech.com-reg.sock``: the plugin watcher's
  GetInfo (type DRAPlugin, the driver's name, the DRA socket, ``v1.DRAPlugin``).

Every claim of a request gets an entry in the response (an error string when
it failed): the kubelet calls again for the ones that failed.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Optional

from ..kubelet import constants as KC
from ..kubelet.grpc_api import HAS_GRPC, REQUIRED, dra_grpc, dra_pb, drahealth_grpc
from ..kubelet.pluginwatcher import RegistrationService, UnixServer
from ..names import DRA_DRIVER
from .health import HealthFeed, HealthService
from .prepare import ClaimRef, Preparer

LOG = logging.getLogger("gpu-dra.server")
DRA_SOCKET = "dra.sock"


def plugin_socket(plugins_dir: str = KC.PLUGINS_DIR) -> str:
    return os.path.join(plugins_dir, DRA_DRIVER, DRA_SOCKET)


def registration_socket(registry_dir: str = KC.PLUGINS_REGISTRY_DIR) -> str:
    return os.path.join(registry_dir, DRA_DRIVER + "-reg.sock")


class DraService:
    """The DRAPlugin servicer over a Preparer; counts and times the calls."""

    def __init__(self, preparer: Preparer) -> None:
        self.preparer = preparer
        self.prepare_seconds: list = []      # the last calls' durations (bounded), for RSS/latency figures
        self.calls = {"prepare": 0, "unprepare": 0}

    def _timed(self, started: float) -> None:
        self.prepare_seconds.append(time.monotonic() - started)
        del self.prepare_seconds[:-1000]

    def NodePrepareResources(self, request, context):  # noqa: N802 (the gRPC method's name)
        started = time.monotonic()
        self.calls["prepare"] += 1
        response = dra_pb.NodePrepareResourcesResponse()
        for claim in request.claims:
            outcome = self.preparer.prepare(ClaimRef(claim.namespace, claim.uid, claim.name))
            entry = response.claims[claim.uid]
            if outcome.error:
                LOG.warning("cannot prepare claim %s/%s: %s", claim.namespace, claim.name, outcome.error)
                entry.error = outcome.error
                continue
            for dev in outcome.devices:
                entry.devices.add(request_names=dev.request_names, pool_name=dev.pool_name,
                                  device_name=dev.device_name, cdi_device_ids=dev.cdi_device_ids)
        self._timed(started)
        return response

    def NodeUnprepareResources(self, request, context):  # noqa: N802
        self.calls["unprepare"] += 1
        response = dra_pb.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            error = self.preparer.unprepare(ClaimRef(claim.namespace, claim.uid, claim.name))
            entry = response.claims[claim.uid]
            if error:
                LOG.warning("cannot unprepare claim %s/%s: %s", claim.namespace, claim.name, error)
                entry.error = error
        return response


class DraPlugin:
    """Both sockets: the DRA service first, then the registration the kubelet finds."""

    def __init__(self, preparer: Preparer, plugins_dir: str = KC.PLUGINS_DIR,
                 registry_dir: str = KC.PLUGINS_REGISTRY_DIR, endpoint: Optional[str] = None,
                 health: Optional[HealthFeed] = None) -> None:
        if not HAS_GRPC:
            raise RuntimeError(REQUIRED)
        self.service = DraService(preparer)
        # the kubelet's health stream holds one worker for as long as it is open
        self.health = HealthService(health) if health is not None else None
        self.socket_path = plugin_socket(plugins_dir)
        # the path the kubelet dials: the same as ours when the pod mounts the kubelet's dirs at their paths
        self.registration = RegistrationService(KC.PLUGIN_TYPE_DRA, DRA_DRIVER, endpoint or self.socket_path,
                                                [KC.DRA_SERVICE_V1])
        self.dra_server = UnixServer(self.socket_path, self._add_services, workers=6, name="dra")
        self.reg_server = UnixServer(registration_socket(registry_dir), self.registration.add_to, workers=2,
                                     name="reg")

    def _add_services(self, server) -> None:
        dra_grpc.add_DRAPluginServicer_to_server(self.service, server)
        if self.health is not None:
            drahealth_grpc.add_DRAResourceHealthServicer_to_server(self.health, server)

    def start(self) -> None:
        if self.health is not None:
            self.health.restart()
        self.dra_server.start()
        LOG.info("serving the DRA node service on %s", self.dra_server.socket_path)
        self.reg_server.start()
        LOG.info("registration socket %s (the kubelet's plugin watcher finds it)", self.reg_server.socket_path)

    def sockets_present(self) -> bool:
        return self.dra_server.socket_present() and self.reg_server.socket_present()

    def stop(self) -> None:
        # registration first: the kubelet deregisters the plugin when that socket goes
        self.reg_server.stop()
        if self.health is not None:
            self.health.stop()
        self.dra_server.stop()
