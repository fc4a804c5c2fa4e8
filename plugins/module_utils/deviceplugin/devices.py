# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The device list gpu-device advertises to the kubelet, and its health.

Device IDs are PCI addresses (``Device.id``). The list only grows while the
agent runs: a GPU that falls off the bus stays advertised as Unhealthy, so the
node's capacity stays and its allocatable drops (the kubelet would otherwise
forget the device and the failure would be invisible). A device that
disappears because its GPU was reconfigured -- the PF replaced by its VFs
after ``sriov_numvfs`` changed, or the VFs by the PF -- is forgotten, since
its GPU is still on the bus.

Health (checked every ``healthyInterval`` seconds, manual Table 2.2): a device
is Healthy when its GPU is on the bus, bound to the driver, the driver is
loaded and ``mx-smi`` reports it available (``gpu.discovery``). It becomes
Healthy again when that holds again. With the interval at 0 health is not
checked and every device found at start is advertised Healthy.

On top of that, the health policy (``health/``, docs/health.md) may hold
GPUs out (:meth:`DeviceState.hold`): their devices are advertised Unhealthy
until the policy lets them go.

Pure bookkeeping plus one call into discovery; no gRPC here.
"""

from __future__ import annotations

import logging
import time
import dataclasses
from dataclasses import dataclass
from typing import Callable, Dict, FrozenSet, List, Optional, Tuple

from ..gpu.discovery import DiscoveryError, discover
from ..gpu.model import Device, Inventory
from ..host import HostRoot, HostRootError
from .versioned import Versioned

LOG = logging.getLogger("gpu-device.devices")


@dataclass(frozen=True)
class Advertised:
    """One device as the kubelet sees it."""

    id: str
    healthy: bool
    numa_node: int
    gpu_bdf: str                   # the physical GPU (itself for a PF)
    device: Optional[Device]       # the current discovery entry; None when gone

    @property
    def present(self) -> bool:
        return self.device is not None


@dataclass(frozen=True)
class Snapshot:
    """The advertised list at one moment; ``version`` grows on every change."""

    version: int
    devices: Tuple[Advertised, ...]
    inventory: Optional[Inventory]

    def by_id(self) -> Dict[str, Advertised]:
        return {d.id: d for d in self.devices}

    @property
    def healthy_ids(self) -> List[str]:
        return [d.id for d in self.devices if d.healthy]


def _gpu_bdf_of(inventory: Inventory) -> Dict[str, str]:
    gpu_bdf = {g.index: g.bdf for g in inventory.gpus}
    return {d.id: gpu_bdf[d.gpu_index] for d in inventory.devices}


class DeviceState(Versioned):
    """Thread-safe advertised list; :meth:`refresh` rescans the host root.

    ``discover_fn`` is :func:`gpu.discovery.discover` (tests may pass a
    wrapper). A full scan (with ``mx-smi topo -m``) runs only when the device
    set changed or MetaXLink was unknown at the last full scan; otherwise the
    cheaper scan without topology is enough to judge health.
    """

    def __init__(self, host: HostRoot, check_health: bool = True,
                 discover_fn: Callable[..., Inventory] = discover) -> None:
        self.host = host
        self.check_health = check_health
        self._discover = discover_fn
        Versioned.__init__(self)
        self._order: List[str] = []                 # every id seen, in first-seen order
        self._known: Dict[str, Advertised] = {}
        self._inventory: Optional[Inventory] = None  # last full scan (topology)
        self._started = False
        self.scans = 0
        self.last_error: Optional[str] = None
        # of the latest successful scan: every discovery warning, and those
        # about mx-smi output that was not understood (a subset)
        self.warnings: Tuple[str, ...] = ()
        self.unparsed: Tuple[str, ...] = ()
        self.latest: Optional[Inventory] = None     # the latest successful scan (the health policy reads it)
        self._held: FrozenSet[str] = frozenset()     # GPU addresses the health policy holds out

    # -- scanning -----------------------------------------------------
    def _scan(self, topology: bool) -> Inventory:
        self.scans += 1
        return self._discover(self.host, topology=topology)

    def _scan_retrying(self, topology: bool) -> Optional[Inventory]:
        """One scan; a failure is retried once (a tree read mid-change)."""
        for attempt in (1, 2):
            try:
                return self._scan(topology)
            except (DiscoveryError, HostRootError, OSError) as exc:
                self.last_error = str(exc)
                if attempt == 2:
                    LOG.warning("device scan failed: %s", exc)
                    return None
                time.sleep(0.2)
        return None

    def refresh(self) -> bool:
        """Rescan and update; True when the advertised list changed."""
        if self._started and not self.check_health and self._inventory is not None:
            return False
        light = self._scan_retrying(topology=False)
        full = self._inventory
        if light is not None:
            ids = [d.id for d in light.devices]
            stale = (full is None or [d.id for d in full.devices] != ids
                     or (not full.topology.metaxlink_known and light.mx_smi_available))
            if stale:
                rescanned = self._scan_retrying(topology=True)
                if rescanned is not None and [d.id for d in rescanned.devices] == ids:
                    full = rescanned
                elif rescanned is not None:   # changed between the two scans: next round
                    full, light = rescanned, rescanned
                else:
                    full = None
        return self._apply(light, full)

    def _apply(self, light: Optional[Inventory], full: Optional[Inventory]) -> bool:
        with self._cond:
            before = dict(self._known)
            first = not self._started
            self._started = True
            if light is None:
                # cannot read the node: nothing is known to work
                updated = {i: _replace(a, healthy=False) for i, a in self._known.items()}
                self._inventory = None
            else:
                updated = self._merge(light, first)
                self._inventory = full
                self.latest = light
                extra = full.warnings if full is not None else ()
                self.warnings = light.warnings + tuple(w for w in extra if w not in light.warnings)
                unparsed = set(light.unparsed) | set(full.unparsed if full is not None else ())
                self.unparsed = tuple(w for w in self.warnings if w in unparsed)
            for dev_id in updated:
                if dev_id not in self._order:
                    self._order.append(dev_id)
            self._order = [i for i in self._order if i in updated]
            self._known = updated
            changed = first or updated != before
            if changed:
                self._version += 1
                self._cond.notify_all()
            return changed

    def _merge(self, inv: Inventory, first: bool) -> Dict[str, Advertised]:
        gpu_of = _gpu_bdf_of(inv)
        present_gpus = {g.bdf for g in inv.gpus}
        healthy_default = not self.check_health
        out: Dict[str, Advertised] = {}
        for dev in inv.devices:
            healthy = True if (first and healthy_default) else dev.healthy and gpu_of[dev.id] not in self._held
            out[dev.id] = Advertised(dev.id, healthy, dev.numa_node, gpu_of[dev.id], dev)
        for dev_id, old in self._known.items():
            if dev_id in out:
                continue
            if old.gpu_bdf in present_gpus:
                LOG.info("device %s is gone but its GPU %s is on the bus (SR-IOV reconfigured): "
                         "no longer advertised", dev_id, old.gpu_bdf)
                continue
            out[dev_id] = _replace(old, healthy=False, device=None)
        return out

    def hold(self, gpus: FrozenSet[str]) -> bool:
        """Advertise the devices of these GPUs (PCI addresses) Unhealthy, and release the others the
        policy held; True when the advertised list changed (the kubelet must hear of it)."""
        with self._cond:
            if gpus == self._held:
                return False
            self._held = frozenset(gpus)
            before = self._known
            self._known = {i: _replace(a, healthy=(a.device is not None and a.device.healthy
                                                   and a.gpu_bdf not in self._held))
                           if a.device is not None else a for i, a in before.items()}
            changed = self._known != before
            if changed:
                self._version += 1
                self._cond.notify_all()
            return changed

    def lost_gpus(self) -> List[Tuple[str, int]]:
        """(address, position) of each GPU whose devices are still advertised but gone from the bus."""
        with self._cond:
            seen: Dict[str, int] = {}
            for pos, dev_id in enumerate(self._order):
                adv = self._known[dev_id]
                if adv.device is None and adv.gpu_bdf not in seen:
                    seen[adv.gpu_bdf] = pos
            return sorted(seen.items(), key=lambda kv: kv[1])

    # -- reading ------------------------------------------------------
    def snapshot(self) -> Snapshot:
        with self._cond:
            return Snapshot(self._version, tuple(self._known[i] for i in self._order), self._inventory)


def _replace(adv: Advertised, **changes) -> Advertised:
    return dataclasses.replace(adv, **changes)


def health_transitions(before: Snapshot, after: Snapshot) -> List[Tuple[str, bool]]:
    """(id, healthy) for every device whose health changed or that appeared."""
    old = before.by_id()
    return [(d.id, d.healthy) for d in after.devices
            if d.id not in old or old[d.id].healthy != d.healthy]
