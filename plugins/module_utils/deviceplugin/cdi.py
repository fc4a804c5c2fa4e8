# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""gpu-device's CDI side: the node's spec from the advertised devices, kept current.

In CDI mode ``Allocate`` answers with names (``metax-tech.com/gpu=<index>``)
that the runtime resolves through the node's spec, so the spec must name
exactly the devices gpu-device advertises, at the indices it hands out.
gpu-device therefore writes the spec itself, from the same snapshot its
answers come from:

- after every health scan that changed the advertised list (a VF change, a
  GPU that fails or comes back, a driver reload) and on every scan's MACA
  check (a MACA version switch changes the mount's source);
- and before each CDI ``Allocate`` answer, from that answer's snapshot, so a
  name is never handed out before the spec that resolves it is on disk
  (HAMi#1903: a spec left behind after dynamic partitioning made every new
  pod fail with "unresolvable CDI devices").

The write is the writer's (atomic, only when the bytes change).
Standard library only: this runs on nodes.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from ..cdi.spec import CdiDevice, CdiSpecError, Maca, build_spec, device_names, qualified_name, render
from ..cdi.writer import MACA_ROOT, host_maca, remove_spec, write_if_changed
from ..host import HostRoot
from ..names import CDI_SPEC_DIR, CDI_SPEC_FILE
from .devices import Snapshot


def qualified(index: int) -> str:
    """The CDI name of the device at ``index``: ``metax-tech.com/gpu=0``."""
    return qualified_name(int(index))


def spec_devices(snapshot: Snapshot) -> List[CdiDevice]:
    """The devices the spec names: advertised Healthy, present, with both DRM nodes.

    Health is gpu-device's (``--healthy-interval 0`` advertises every device
    Healthy, and the spec follows); the UUID and serial come from the last
    full scan's GPU with the same PCI address, and only for whole GPUs.
    """
    gpus = {g.bdf: g for g in snapshot.inventory.gpus} if snapshot.inventory is not None else {}
    out: List[CdiDevice] = []
    for adv in snapshot.devices:
        dev = adv.device
        if not adv.healthy or dev is None or not dev.drm_card or not dev.drm_render:
            continue
        gpu = None if dev.is_vf else gpus.get(adv.gpu_bdf)
        out.append(CdiDevice(index=dev.index, bdf=dev.bdf, card=dev.drm_card, render=dev.drm_render,
                             uuid=gpu.uuid if gpu is not None else None,
                             serial=gpu.serial if gpu is not None else None))
    return out


def snapshot_spec(snapshot: Snapshot, maca: Optional[Maca], host: HostRoot) -> Optional[Dict[str, Any]]:
    """The spec for ``snapshot`` (None: no device to name; a spec without devices is invalid)."""
    try:
        return build_spec(spec_devices(snapshot), maca, host.host_path)
    except CdiSpecError:
        return None


@dataclass
class SyncResult:
    changed: bool
    names: List[str]        # the fully qualified names the spec on disk now defines
    stale: bool = False     # the snapshot was older than the one last written: nothing done


class SpecSync:
    """Writes ``spec_dir/metax-tech.com-gpu.json`` from snapshots; thread-safe.

    ``spec_dir`` is a path in gpu-device's own filesystem (the node's
    ``/var/run/cdi`` mounted in), not under the host root.
    """

    def __init__(self, host: HostRoot, spec_dir: str = CDI_SPEC_DIR, maca_root: Optional[str] = MACA_ROOT,
                 name: str = CDI_SPEC_FILE) -> None:
        self.host = host
        self.path = os.path.join(spec_dir, name)
        self.maca_root = maca_root
        self.writes = 0
        self._lock = threading.Lock()
        # the newest snapshot written: the health loop and Allocate write concurrently, and an
        # older snapshot must not overwrite a newer one's spec
        self._version = -1
        self._names: List[str] = []

    def maca(self) -> Optional[Maca]:
        return host_maca(self.host, self.maca_root) if self.maca_root else None

    def sync(self, snapshot: Snapshot) -> SyncResult:
        """Bring the file in line with ``snapshot`` (and the host's MACA now).

        A snapshot older than the last one written changes nothing and comes
        back ``stale``: the caller takes a new snapshot.
        """
        with self._lock:
            if snapshot.version < self._version:
                return SyncResult(False, list(self._names), stale=True)
            spec = snapshot_spec(snapshot, self.maca(), self.host)
            if spec is None:
                changed = remove_spec(self.path)
                names: List[str] = []
            else:
                changed = write_if_changed(self.path, render(spec))
                names = device_names(spec)
            if changed:
                self.writes += 1
            self._version, self._names = snapshot.version, names
        return SyncResult(changed, names)

    def remove(self) -> bool:
        with self._lock:
            return remove_spec(self.path)
