# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Device health to the kubelet, and through it to the pods holding the devices (KEP-4680).

The kubelet of 1.36 (feature gate ``ResourceHealthStatus``, beta, on by
default) opens ``/v1alpha1.DRAResourceHealth/NodeWatchResources`` on the
plugin's DRA socket once the plugin is registered, and retries every 5 s
while it is not served. Each response is the driver's complete device list;
the kubelet writes a device's health into
``status.containerStatuses[].allocatedResourcesStatus`` of the pods whose
claims hold it (resource ID: the device's first CDI name), and counts a
device not reported within its timeout (30 s unless the plugin says) as
``Unknown``.

The health is the one that taints the devices: :class:`HealthFeed` is fed the
pool's devices as gpu-dra publishes them (agents/gpu_dra.py); a device is
UNHEALTHY while it carries the taint ``gpu.metax-tech.com/unhealthy``, with the
taint's reason as the message. A stream sends the list at once, on every
change, and every ``resend`` seconds so that the kubelet's timeout never
turns a known health into ``Unknown``; the time it states is the last run of
the checks, so checks that stop running do lapse to ``Unknown``.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Iterator, Mapping, Optional, Sequence, Tuple

from ..deviceplugin.versioned import Versioned
from ..kubelet.grpc_api import drahealth_pb
from .slices import REASON_GONE, tainted

LOG = logging.getLogger("gpu-dra.health")

HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
MESSAGES = {REASON_GONE: "the GPU is gone from the PCI bus (gpu-dra's health checks)"}
CHECKS_FAILED = "failed gpu-dra's health checks (the GPU on the bus, bound to the driver, mx-smi): %s"
# seconds between full lists when nothing changed; the timeout we give the kubelet is three of them
RESEND_SECONDS = 10.0
STREAM_POLL_SECONDS = 1.0


@dataclass(frozen=True)
class DeviceHealth:
    """One device's health as the kubelet receives it."""

    pool: str
    device: str
    health: str                 # HEALTHY or UNHEALTHY
    message: str = ""


def device_health(pool: str, devices: Iterable[Mapping[str, Any]]) -> Tuple[DeviceHealth, ...]:
    """The pool's devices (slices.build_devices' entries) as health entries: unhealthy while tainted."""
    entries = [dict(d) for d in devices]
    reasons = dict(tainted(entries))
    out = []
    for dev in entries:
        name = str(dev["name"])
        if name in reasons:
            reason = reasons[name] or UNHEALTHY
            message = MESSAGES.get(reason, CHECKS_FAILED % reason)
            out.append(DeviceHealth(pool, name, UNHEALTHY, message))
        else:
            out.append(DeviceHealth(pool, name, HEALTHY))
    return tuple(sorted(out, key=lambda h: h.device))


class HealthFeed(Versioned):
    """The pool's current device health; a new version on every change (streams wait on it).

    ``checked_at`` is when the health checks last ran (:meth:`checked`): the time the kubelet is
    told the health was determined, so checks that hang (mx-smi stuck) let it lapse to Unknown
    after the timeout instead of being vouched for. None: no periodic checks, the health is as of
    each send. ``check_interval`` is their period: the timeout given to the kubelet covers it.
    """

    def __init__(self, pool: str, check_interval: float = 0.0) -> None:
        super().__init__()
        self.pool = pool
        self.check_interval = check_interval
        self.checked_at: Optional[float] = None
        self._health: Tuple[DeviceHealth, ...] = ()
        self.known = False              # nothing is reported before the first update

    def checked(self, when: float) -> None:
        self.checked_at = when

    def update(self, devices: Sequence[Mapping[str, Any]]) -> bool:
        """Take the pool's devices as published; True when a device's health changed."""
        health = device_health(self.pool, devices)
        with self._cond:
            changed = health != self._health or not self.known
            if changed:
                self._health = health
                self.known = True
                self._version += 1
                self._cond.notify_all()
        return changed

    def snapshot(self) -> Tuple[int, Tuple[DeviceHealth, ...]]:
        with self._cond:
            return self._version, self._health


def response(health: Sequence[DeviceHealth], now: float, timeout_seconds: int) -> Any:
    """A NodeWatchResourcesResponse carrying every device."""
    pb = drahealth_pb
    status = {HEALTHY: pb.HEALTHY, UNHEALTHY: pb.UNHEALTHY}
    out = pb.NodeWatchResourcesResponse()
    for entry in health:
        out.devices.add(device=pb.DeviceIdentifier(pool_name=entry.pool, device_name=entry.device),
                        health=status.get(entry.health, pb.UNKNOWN), last_updated_time=int(now),
                        health_check_timeout_seconds=timeout_seconds, message=entry.message[:1024])
    return out


class HealthService:
    """The DRAResourceHealth servicer over a :class:`HealthFeed`."""

    def __init__(self, feed: HealthFeed, resend: float = RESEND_SECONDS,
                 clock: Callable[[], float] = time.time) -> None:
        self.feed = feed
        self.resend = resend
        self.clock = clock
        # three resends, or three check periods when the checks are slower: one missed is no lapse
        self.timeout_seconds = max(1, int(round(3 * max(resend, feed.check_interval))))
        self.streams = 0
        self.sent = 0
        self._stopping = threading.Event()
        self._lock = threading.Lock()

    def stop(self) -> None:
        """End every open stream (the server's stop would cancel them only after its grace)."""
        self._stopping.set()
        self.feed.wake()

    def restart(self) -> None:
        self._stopping.clear()

    def message(self, health: Sequence[DeviceHealth]) -> Any:
        """The response to send now: ``health``, as of the checks' last run."""
        self.sent += 1
        checked = self.feed.checked_at
        return response(health, checked if checked is not None else self.clock(), self.timeout_seconds)

    def NodeWatchResources(self, request, context) -> Iterator[Any]:  # noqa: N802 (the gRPC method's name)
        with self._lock:
            self.streams += 1
        try:
            version, health = self.feed.snapshot()
            waited = 0.0
            while not self.feed.known and not self._stopping.is_set() and context.is_active():
                # not published yet: an empty list would tell the kubelet nothing it can use
                version = self.feed.wait_for_change(version, STREAM_POLL_SECONDS)
                version, health = self.feed.snapshot()
            if self._stopping.is_set() or not context.is_active():
                return
            LOG.info("health stream opened: %d device(s), %d unhealthy", len(health),
                     sum(1 for h in health if h.health != HEALTHY))
            yield self.message(health)
            while not self._stopping.is_set() and context.is_active():
                now = self.feed.wait_for_change(version, min(STREAM_POLL_SECONDS, self.resend))
                waited += min(STREAM_POLL_SECONDS, self.resend)
                if self._stopping.is_set():
                    break
                if now != version or waited >= self.resend:
                    version, health = self.feed.snapshot()
                    waited = 0.0
                    yield self.message(health)
        finally:
            with self._lock:
                self.streams -= 1


def health_map(message: Any) -> Dict[str, Tuple[int, str]]:
    """device name -> (HealthStatus number, message) of a NodeWatchResourcesResponse (tests, logs)."""
    return {d.device.device_name: (d.health, d.message) for d in message.devices}
