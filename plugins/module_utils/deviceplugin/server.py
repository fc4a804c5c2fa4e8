# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The DevicePlugin gRPC service of gpu-device (kubelet API v1beta1).

``GetDevicePluginOptions``  GetPreferredAllocation available, no PreStartContainer needed
``ListAndWatch``            the advertised list (:mod:`.devices`), resent on every change
``GetPreferredAllocation``  the topology-aware allocator (``gpu.allocator``)
``Allocate``                in CDI mode the devices' CDI names (``cdi_devices``,
                            resolved by the runtime through the node's spec,
                            written first: :mod:`.cdi`); in devices mode
                            ``/dev/mxcd`` + each device's ``/dev/dri/cardN`` and
                            ``renderDN`` (host paths through ``HostRoot.host_path``),
                            the host's MXMACA read-only on ``/opt/maca`` and its
                            environment; either way environment naming the
                            devices. Unknown or unhealthy IDs are INVALID_ARGUMENT
``PreStartContainer``       accepted (nothing to prepare)

:class:`PluginServer` serves it on a unix socket in the device-plugin
directory.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from typing import Any, Dict, FrozenSet, Iterable, List, Optional, Tuple

from concurrent import futures

from ..cdi.mode import MODE_CDI, MODE_DEVICES
from ..cdi.spec import Maca, maca_env
from ..errors import MetaxGpuError
from ..gpu.allocator import AllocationError, preferred_allocation
from ..host import HostRoot
from ..kubelet.grpc_api import HAS_GRPC, REQUIRED, grpc
from ..kubelet.grpc_api import dp_grpc as pb_grpc
from ..kubelet.grpc_api import dp_pb as pb
from ..kubelet.pluginwatcher import remove_socket
from . import constants as C
from ..gpu.model import Device
from ..names import MACA_CONTAINER_PATH
from .cdi import SpecSync, qualified
from .devices import Advertised, DeviceState, Snapshot
from .metrics import DevicePluginMetrics

LOG = logging.getLogger("gpu-device.server")

# How often an idle ListAndWatch stream checks whether it should end.
STREAM_POLL_SECONDS = 1.0
# How long an Allocate waits for a mode decided after registration: past the Node read's own
# worst case (5 tries of 10 s plus 2 s pauses), so only a read that never returns is refused.
MODE_WAIT_SECONDS = 90.0


class RequestError(MetaxGpuError, ValueError):
    """A request the plugin refuses (answered with INVALID_ARGUMENT)."""


def require_grpc() -> None:
    if not HAS_GRPC:
        raise RuntimeError(REQUIRED)


# -- pure request handling (no gRPC objects) ---------------------------------

def preferred_ids(snapshot: Snapshot, available: Iterable[str], must_include: Iterable[str],
                  size: int) -> List[str]:
    """The allocator's choice for one container, as device IDs.

    ``available`` IDs the node no longer has (a GPU gone from the bus) are
    ignored; a ``must_include`` ID that is not available, or a size the
    available devices cannot meet, is a :class:`RequestError`.
    """
    available = list(available)
    must = list(must_include)
    if size <= 0:
        raise RequestError("allocation_size must be positive, got %d" % size)
    if len(set(available)) != len(available):
        raise RequestError("available_deviceIDs has duplicates")
    missing = [d for d in must if d not in available]
    if missing:
        raise RequestError("must_include_deviceIDs %s are not in available_deviceIDs" % ", ".join(missing))
    if size > len(available):
        raise RequestError("allocation_size %d exceeds the %d available devices" % (size, len(available)))
    inventory = snapshot.inventory
    known = snapshot.by_id()
    unknown = [d for d in available if d not in known]
    if unknown:
        raise RequestError("unknown device ID(s): %s" % ", ".join(unknown))
    if inventory is None:
        raise RequestError("the node's devices cannot be read right now")
    present = {dev.id for dev in inventory.devices}
    usable = [d for d in available if d in present]
    gone = [d for d in must if d not in present]
    if gone:
        raise RequestError("must-include device(s) %s are no longer on the node" % ", ".join(gone))
    if size > len(usable):
        raise RequestError("allocation_size %d exceeds the %d devices present" % (size, len(usable)))
    try:
        # the allocator's ID API maps kubelet IDs to indices and back (one path per ID)
        return preferred_allocation(inventory, usable, must, size)
    except AllocationError as exc:
        raise RequestError(str(exc))


def container_allocation(host: HostRoot, snapshot: Snapshot, device_ids: Iterable[str],
                         mode: str = MODE_DEVICES, maca: Optional[Maca] = None) -> Dict[str, Any]:
    """What one container gets.

    Returns ``{"devices": [(container_path, host_path, permissions)],
    "mounts": [(container_path, host_path, read_only)], "envs": {...},
    "cdi_devices": [name]}``: in ``cdi`` mode only names and the environment
    naming the devices (the spec carries nodes, MACA and its environment); in
    ``devices`` mode the nodes, ``maca`` (when the host has it) mounted
    read-only with its environment, and the same device environment.
    Raises :class:`RequestError` for empty, duplicate, unknown or unhealthy IDs
    and for device nodes missing on the node.
    """
    ids = list(device_ids)
    if not ids:
        raise RequestError("no device IDs in the request")
    if len(set(ids)) != len(ids):
        raise RequestError("duplicate device IDs in the request: %s" % ", ".join(ids))
    known = snapshot.by_id()
    unknown = [d for d in ids if d not in known]
    if unknown:
        raise RequestError("unknown device ID(s): %s" % ", ".join(unknown))
    bad = [d for d in ids if not known[d].healthy or known[d].device is None]
    if bad:
        raise RequestError("unhealthy device(s): %s" % ", ".join(bad))
    # every device is present (checked above); pair it with its Advertised entry
    pairs: List[Tuple[Advertised, Device]] = []
    for d in ids:
        device = known[d].device
        if device is not None:
            pairs.append((known[d], device))
    chosen = sorted(pairs, key=lambda p: p[1].index)
    paths = [C.DEVICE_MXCD]
    for _adv, dev in chosen:
        if not dev.drm_card or not dev.drm_render:
            raise RequestError("device %s has no DRM nodes (card/renderD) on this node" % dev.id)
        paths.append("%s/%s" % (C.DRI_DIR, dev.drm_card))
        paths.append("%s/%s" % (C.DRI_DIR, dev.drm_render))
    specs = []
    for path in paths:
        if not host.exists(path):
            raise RequestError("%s is missing on the node (looked at %s)" % (path, host.join(path)))
        specs.append((path, host.host_path(path), C.DEVICE_PERMISSIONS))
    envs = {
        C.ENV_VISIBLE_DEVICES: ",".join(a.id for a, _dev in chosen),
        C.ENV_DEVICE_INDICES: ",".join(str(dev.index) for _a, dev in chosen),
    }
    uuids = [dev.uuid for _a, dev in chosen if dev.uuid]
    if len(uuids) == len(chosen):
        envs[C.ENV_DEVICE_UUIDS] = ",".join(uuids)
    if mode == MODE_CDI:
        return {"devices": [], "mounts": [], "envs": envs,
                "cdi_devices": [qualified(dev.index) for _a, dev in chosen]}
    mounts = []
    if maca is not None:
        mounts.append((MACA_CONTAINER_PATH, maca.host_path, True))
        for item in maca_env(maca):
            key, _sep, value = item.partition("=")
            envs[key] = value
    return {"devices": specs, "mounts": mounts, "envs": envs, "cdi_devices": []}


def device_messages(snapshot: Snapshot) -> list:
    """ListAndWatchResponse devices for a snapshot."""
    out = []
    for adv in snapshot.devices:
        topology = None
        if adv.numa_node is not None and adv.numa_node >= 0:
            topology = pb.TopologyInfo(nodes=[pb.NUMANode(ID=adv.numa_node)])
        out.append(pb.Device(ID=adv.id, health=C.HEALTHY if adv.healthy else C.UNHEALTHY, topology=topology))
    return out


# -- the gRPC services ---------------------------------------------------------

class PluginService:
    """What every DevicePlugin service of ours shares (gpu-device's, vfio-manager's :mod:`.vfio`): the
    stop and resume of its ListAndWatch streams, the options, the stream itself over a versioned state
    (:mod:`.versioned`) and PreStartContainer. A subclass gives :meth:`device_messages` and the stream's
    log lines, and answers GetPreferredAllocation and Allocate (method names are the RPC names)."""

    # GetDevicePluginOptions: whether the kubelet asks GetPreferredAllocation
    preferred_allocation = False
    log = LOG

    def __init__(self, state: Any) -> None:
        require_grpc()
        self.state = state
        self._stopping = threading.Event()

    def stop(self) -> None:
        """End every ListAndWatch stream."""
        self._stopping.set()
        self.state.wake()

    def resume(self) -> None:
        """Accept streams again (the server is restarting)."""
        self._stopping.clear()

    def device_messages(self, snapshot: Any) -> list:
        raise NotImplementedError

    def sending(self, snapshot: Any, changed: bool) -> str:
        """The stream's log line for ``snapshot`` (``changed``: after the first)."""
        raise NotImplementedError

    def stream(self, context: Any) -> Any:
        """ListAndWatch: the state's snapshot, then another at each change, until :meth:`stop` or the
        kubelet ends the stream."""
        snap = self.state.snapshot()
        self.log.info("ListAndWatch: %s", self.sending(snap, False))
        yield pb.ListAndWatchResponse(devices=self.device_messages(snap))
        version = snap.version
        while not self._stopping.is_set() and context.is_active():
            if self.state.wait_for_change(version, STREAM_POLL_SECONDS) == version:
                continue
            if self._stopping.is_set():
                break
            snap = self.state.snapshot()
            version = snap.version
            self.log.info("ListAndWatch: %s", self.sending(snap, True))
            yield pb.ListAndWatchResponse(devices=self.device_messages(snap))

    # pylint: disable=invalid-name,unused-argument
    def GetDevicePluginOptions(self, request, context):
        return pb.DevicePluginOptions(pre_start_required=False,
                                      get_preferred_allocation_available=self.preferred_allocation)

    def ListAndWatch(self, request, context):
        return self.stream(context)

    def PreStartContainer(self, request, context):
        return pb.PreStartContainerResponse()
    # pylint: enable=invalid-name,unused-argument


class DevicePluginService(PluginService):
    """gpu-device's DevicePlugin service."""

    preferred_allocation = True

    def __init__(self, state: DeviceState, host: HostRoot, metrics: Optional[DevicePluginMetrics] = None,
                 mode: Optional[str] = MODE_DEVICES, spec_sync: Optional[SpecSync] = None) -> None:
        PluginService.__init__(self, state)
        self.state: DeviceState = state
        self.host = host
        self.spec_sync = spec_sync
        self.mode: Optional[str] = None
        self._mode_set = threading.Event()
        if mode is not None:
            self.set_mode(mode)
        self.metrics = metrics or DevicePluginMetrics()
        self.streams = 0
        self.allocations = 0
        self._lock = threading.Lock()

    def set_mode(self, mode: str) -> None:
        """How Allocate answers. None at construction: decided later (gpu-device reads the Node
        after it registered); only Allocate needs it, and waits for it."""
        if mode == MODE_CDI and self.spec_sync is None:
            raise ValueError("CDI mode needs a SpecSync: the names it hands out must be in the node's spec")
        self.mode = mode
        self._mode_set.set()

    def device_messages(self, snapshot: Snapshot) -> list:
        return device_messages(snapshot)

    def sending(self, snapshot: Snapshot, changed: bool) -> str:
        if changed:
            return "devices changed, sending %d (%d healthy)" % (len(snapshot.devices), len(snapshot.healthy_ids))
        return "sending %d devices (%d healthy)" % (len(snapshot.devices), len(snapshot.healthy_ids))

    # pylint: disable=invalid-name,unused-argument
    def ListAndWatch(self, request, context):
        with self._lock:
            self.streams += 1
        try:
            yield from self.stream(context)
        finally:
            with self._lock:
                self.streams -= 1

    def GetPreferredAllocation(self, request, context):
        start = time.monotonic()
        response = pb.PreferredAllocationResponse()
        snap = self.state.snapshot()
        try:
            if not request.container_requests:
                raise RequestError("no container_requests")
            for creq in request.container_requests:
                ids = preferred_ids(snap, creq.available_deviceIDs, creq.must_include_deviceIDs,
                                    creq.allocation_size)
                LOG.info("GetPreferredAllocation: %d of %s -> %s", creq.allocation_size,
                         ",".join(creq.available_deviceIDs), ",".join(ids))
                response.container_responses.add(deviceIDs=ids)
        except RequestError as exc:
            return self._refuse(context, "GetPreferredAllocation", exc, pb.PreferredAllocationResponse)
        finally:
            self.metrics.latency.labels("GetPreferredAllocation").observe(time.monotonic() - start)
        return response

    def Allocate(self, request, context):
        start = time.monotonic()
        response = pb.AllocateResponse()
        try:
            if not request.container_requests:
                raise RequestError("no container_requests")
            # the mode follows the Node read, bounded by its own retries (agents/common.node_runtime_version)
            if not self._mode_set.wait(MODE_WAIT_SECONDS):
                raise RequestError("the Allocate mode is not decided yet (the Node not read): try again")
            snap, defined = self._snapshot_and_spec()
            maca = self.spec_sync.maca() if self.spec_sync is not None and self.mode != MODE_CDI else None
            for creq in request.container_requests:
                result = container_allocation(self.host, snap, creq.devices_ids, self.mode, maca)
                missing = [n for n in result["cdi_devices"] if n not in defined]
                if missing:
                    raise RequestError("%s not in the node's CDI spec %s" % (", ".join(missing),
                                                                             self.spec_sync.path if self.spec_sync else ""))
                cresp = response.container_responses.add()
                for container_path, host_path, perms in result["devices"]:
                    cresp.devices.add(container_path=container_path, host_path=host_path, permissions=perms)
                for container_path, host_path, read_only in result["mounts"]:
                    cresp.mounts.add(container_path=container_path, host_path=host_path, read_only=read_only)
                for name in result["cdi_devices"]:
                    cresp.cdi_devices.add(name=name)
                cresp.envs.update(result["envs"])
                LOG.info("Allocate: %s", ",".join(creq.devices_ids),
                         extra={"fields": {"devices": list(creq.devices_ids), "mode": self.mode,
                                           "cdi_devices": result["cdi_devices"]}})
        except RequestError as exc:
            return self._refuse(context, "Allocate", exc, pb.AllocateResponse)
        finally:
            self.metrics.latency.labels("Allocate").observe(time.monotonic() - start)
        with self._lock:
            self.allocations += 1
        return response

    # pylint: enable=invalid-name,unused-argument

    def _snapshot_and_spec(self) -> Tuple[Snapshot, FrozenSet[str]]:
        """The snapshot to answer from and, in CDI mode, the names the node's spec defines for it.

        The spec is written from that very snapshot first, so no name is handed
        out before the spec that resolves it is on disk (HAMi#1903).
        """
        snap = self.state.snapshot()
        if self.mode != MODE_CDI or self.spec_sync is None:
            return snap, frozenset()
        try:
            for _attempt in range(5):
                result = self.spec_sync.sync(snap)
                if not result.stale:
                    return snap, frozenset(result.names)
                snap = self.state.snapshot()   # the health loop wrote a newer one meanwhile
        except OSError as exc:
            raise RequestError("cannot write the node's CDI spec %s: %s" % (self.spec_sync.path, exc))
        raise RequestError("the devices keep changing: try again")

    def _refuse(self, context, rpc: str, exc: Exception, response_type):
        LOG.warning("%s refused: %s", rpc, exc)
        self.metrics.errors.labels(rpc).inc()
        context.set_code(grpc.StatusCode.INVALID_ARGUMENT)
        context.set_details("%s: %s" % (rpc, exc))
        return response_type()


def remove_stale_sockets(directory: str, prefix: str = C.PLUGIN_SOCKET_PREFIX) -> List[str]:
    """Remove our sockets nobody listens on any more (left by an agent that died)."""
    removed: List[str] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        if not (name.startswith(prefix) and name.endswith(".sock")):
            continue
        path = os.path.join(directory, name)
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except ConnectionRefusedError:
            try:
                os.unlink(path)
                removed.append(path)
            except OSError:
                pass
        except OSError:
            pass
        finally:
            probe.close()
    return removed


class PluginServer:
    """The DevicePlugin service on a unix socket; start/stop as often as needed.

    Every start listens on a new name (``metax-gpu-<random>.sock``): gRPC
    unlinks a unix socket's path when its server shuts down, which happens
    asynchronously, so reusing one name could let the old server remove the
    new server's socket; and a replacement agent (a DaemonSet update) never
    collides with the one it replaces.
    """

    def __init__(self, service: PluginService, directory: str, workers: int = 8) -> None:
        require_grpc()
        self.service = service
        self.directory = directory
        self.workers = workers
        self._server = None
        self.endpoint: Optional[str] = None       # socket file name, registered with the kubelet
        self.socket_path: Optional[str] = None
        self.inode: Optional[int] = None

    def start(self) -> None:
        self.stop()
        self.service.resume()
        for stale in remove_stale_sockets(self.directory):
            LOG.info("removed stale socket %s", stale)
        self.endpoint = "%s%s.sock" % (C.PLUGIN_SOCKET_PREFIX, secrets.token_hex(4))
        self.socket_path = os.path.join(self.directory, self.endpoint)
        remove_socket(self.socket_path)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="dp"))
        pb_grpc.add_DevicePluginServicer_to_server(self.service, server)
        if server.add_insecure_port("unix://" + self.socket_path) == 0:
            raise OSError("cannot listen on %s" % self.socket_path)
        server.start()
        self._server = server
        self.inode = os.stat(self.socket_path).st_ino
        LOG.info("serving the device plugin API on %s", self.socket_path)

    def socket_present(self) -> bool:
        """False when our socket was removed or replaced (the kubelet cleans the directory on start)."""
        if self.socket_path is None:
            return False
        try:
            return os.stat(self.socket_path).st_ino == self.inode
        except OSError:
            return False

    @property
    def running(self) -> bool:
        return self._server is not None

    def stop(self, grace: float = 1.0) -> None:
        if self._server is None:
            return
        self.service.stop()
        self._server.stop(grace).wait(grace + 1.0)
        self._server = None
        try:
            if self.inode is not None and os.stat(self.socket_path).st_ino == self.inode:
                os.unlink(self.socket_path)
        except OSError:
            pass
        self.inode = None
        self.endpoint = self.socket_path = None
