# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""A kubelet-side gRPC peer for protocol tests of gpu-device.

It does what the kubelet's device manager does over the wire: serves
``Registration`` on ``<dir>/kubelet.sock`` (cleaning the directory of
sockets first, as the kubelet does on start), validates Register requests
the way the kubelet does (version, extended resource name), dials the
plugin's endpoint, asks for its options and keeps a ListAndWatch stream
open, recording every device list it receives. It also serves the
pod-resources ``PodResourcesLister`` on a second socket with whatever
assignments the test sets.
"""

from __future__ import annotations

import os
import re
import stat
import threading
import time
from concurrent import futures

import grpc

from ansible_collections.metax.gpu.plugins.module_utils.deviceplugin.api import (
    deviceplugin_v1beta1_pb2 as pb, deviceplugin_v1beta1_pb2_grpc as pb_grpc,
    podresources_v1_pb2 as prpb, podresources_v1_pb2_grpc as prpb_grpc,
)

# kubelet: v1helper.IsExtendedResourceName -- a domain-prefixed name outside kubernetes.io
_EXTENDED = re.compile(r"^(?!kubernetes\.io/|requests\.)[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


class KubeletPeer:
    """The device manager side of the device-plugin API, in-process."""

    def __init__(self, directory: str) -> None:
        self.dir = directory
        self.socket = os.path.join(directory, "kubelet.sock")
        self._server = None
        self._lock = threading.Condition()
        self.registrations = []          # (monotonic time, RegisterRequest)
        self.updates = []                # (monotonic time, [(id, health, numa)])
        self.options = None
        self.channel = None
        self.stub = None
        self._stream = None
        self._stream_thread = None
        self.errors = []

    # -- lifecycle ------------------------------------------------------
    def start(self, clean: bool = True) -> None:
        os.makedirs(self.dir, exist_ok=True)
        if clean:     # the kubelet removes every socket in the directory on start
            for name in os.listdir(self.dir):
                path = os.path.join(self.dir, name)
                if stat.S_ISSOCK(os.lstat(path).st_mode):
                    os.unlink(path)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_RegistrationServicer_to_server(self, server)
        server.add_insecure_port("unix://" + self.socket)
        server.start()
        self._server = server

    def stop(self) -> None:
        """The kubelet stops: its socket goes away and so does its plugin client."""
        if self._server is not None:
            self._server.stop(0).wait(2)
            self._server = None
        if os.path.exists(self.socket):
            os.unlink(self.socket)
        self._close_client()

    def restart(self) -> float:
        """Stop and start again (a kubelet restart); returns the time it came back."""
        self.stop()
        time.sleep(0.2)
        self.start()
        return time.monotonic()

    def _close_client(self) -> None:
        if self._stream is not None:
            self._stream.cancel()
            self._stream = None
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        if self._stream_thread is not None:
            self._stream_thread.join(3)
            self._stream_thread = None

    # -- Registration service ------------------------------------------
    def Register(self, request, context):  # noqa: N802 (gRPC method name)
        if request.version != "v1beta1":
            context.abort(grpc.StatusCode.UNKNOWN, "invalid version %r" % request.version)
        if not _EXTENDED.match(request.resource_name):
            context.abort(grpc.StatusCode.UNKNOWN, "invalid resource name %r" % request.resource_name)
        endpoint = os.path.join(self.dir, request.endpoint)
        self._close_client()
        channel = grpc.insecure_channel("unix://" + endpoint)
        try:
            grpc.channel_ready_future(channel).result(timeout=5)
        except grpc.FutureTimeoutError:
            channel.close()
            context.abort(grpc.StatusCode.UNKNOWN, "cannot dial %s" % endpoint)
        self.channel = channel
        self.stub = pb_grpc.DevicePluginStub(channel)
        self.options = self.stub.GetDevicePluginOptions(pb.Empty(), timeout=5)
        self._stream = self.stub.ListAndWatch(pb.Empty())
        self._stream_thread = threading.Thread(target=self._consume, args=(self._stream,), daemon=True)
        self._stream_thread.start()
        with self._lock:
            self.registrations.append((time.monotonic(), request))
            self._lock.notify_all()
        return pb.Empty()

    def _consume(self, stream) -> None:
        try:
            for response in stream:
                devices = [(d.ID, d.health, [n.ID for n in d.topology.nodes]) for d in response.devices]
                with self._lock:
                    self.updates.append((time.monotonic(), devices))
                    self._lock.notify_all()
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                self.errors.append(exc)

    # -- waiting ----------------------------------------------------------
    def wait_for_registration(self, count: int = 1, timeout: float = 60.0):
        with self._lock:
            if not self._lock.wait_for(lambda: len(self.registrations) >= count, timeout):
                raise AssertionError("no registration #%d within %ss" % (count, timeout))
            return self.registrations[count - 1]

    def wait_for_devices(self, predicate, timeout: float = 60.0):
        """The first recorded device list (newest first) satisfying ``predicate``."""
        def found():
            return next((u for u in reversed(self.updates) if predicate(u[1])), None)
        with self._lock:
            if not self._lock.wait_for(lambda: found() is not None, timeout):
                raise AssertionError("no matching device list within %ss; last: %s"
                                     % (timeout, self.updates[-1][1] if self.updates else None))
            return found()

    def latest(self):
        with self._lock:
            return self.updates[-1][1] if self.updates else None


class PodResourcesPeer:
    """The kubelet's PodResourcesLister with assignments set by the test."""

    def __init__(self, socket_path: str) -> None:
        self.socket = socket_path
        self.assignments = []      # (namespace, pod, container, resource, [ids])
        self.calls = 0
        self._server = None

    def start(self) -> None:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        prpb_grpc.add_PodResourcesListerServicer_to_server(self, server)
        server.add_insecure_port("unix://" + self.socket)
        server.start()
        self._server = server

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(0).wait(2)
            self._server = None
        if os.path.exists(self.socket):
            os.unlink(self.socket)

    def List(self, request, context):  # noqa: N802
        self.calls += 1
        response = prpb.ListPodResourcesResponse()
        for namespace, pod, container, resource, ids in list(self.assignments):
            pres = response.pod_resources.add(name=pod, namespace=namespace)
            cres = pres.containers.add(name=container)
            cres.devices.add(resource_name=resource, device_ids=list(ids))
        return response

    def GetAllocatableResources(self, request, context):  # noqa: N802
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "not in this peer")

    def Get(self, request, context):  # noqa: N802
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "not in this peer")
