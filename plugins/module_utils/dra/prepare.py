# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""NodePrepareResources / NodeUnprepareResources as files: a CDI spec per claim, and a checkpoint.

Prepare of a claim (namespace, name, UID) reads the ResourceClaim (``get_claim``,
injected: the API server in the agent, a dict in tests), takes the devices the
scheduler allocated from this driver's pool, writes one CDI spec with exactly
those devices and the host's MXMACA (cdi.spec.build_claim_spec), records the
claim in the checkpoint and returns the CDI names. Unprepare removes exactly
that spec and the record.

The kubelet retries, repeats and reorders these calls (after its own restart,
after ours, after a timeout), so both are idempotent:

- a claim already in the checkpoint is answered from it, without the API
  server, and its spec is written again if it went missing;
- a claim whose UID is not the one the API server holds under that name (the
  claim was deleted and made again) is refused, so a stale request never
  prepares another claim's devices;
- Unprepare of a claim that is not prepared succeeds (nothing to undo), and
  removes the claim's spec file even when the checkpoint does not list it (a
  crash between writing the spec and the checkpoint).

The checkpoint (JSON in the plugin's directory) is replaced atomically after
every change, so a restarted plugin knows every claim it prepared. Standard
library only: this runs on nodes.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..cdi.spec import CdiDevice, CdiSpecError, Maca, build_claim_spec, claim_device_name, qualified_name, render
from ..cdi.writer import remove_spec, write_if_changed
from ..errors import MetaxGpuError
from ..gpu.model import Inventory
from ..host import replace_file
from ..names import CDI_CLAIM_SPEC_PREFIX, DRA_DRIVER
from .slices import device_name

LOG = logging.getLogger("gpu-dra.prepare")
CHECKPOINT_FILE = "checkpoint.json"
CHECKPOINT_VERSION = 1


class ClaimError(MetaxGpuError):
    """A claim cannot be prepared (the message goes back to the kubelet)."""


class CheckpointError(MetaxGpuError):
    """The checkpoint cannot be read or written."""


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    uid: str
    name: str

    def __str__(self) -> str:
        return "%s/%s (%s)" % (self.namespace, self.name, self.uid)


@dataclass
class PreparedDevice:
    """One device of a prepared claim, as NodePrepareResourceResponse carries it."""

    request_names: List[str]
    pool_name: str
    device_name: str
    cdi_device_ids: List[str]


@dataclass
class PreparedClaim:
    namespace: str
    name: str
    devices: List[PreparedDevice] = field(default_factory=list)
    spec: Optional[Dict[str, Any]] = None       # the CDI spec written (None: no device of ours)

    def to_dict(self) -> Dict[str, Any]:
        return {"namespace": self.namespace, "name": self.name, "spec": self.spec,
                "devices": [{"requestNames": d.request_names, "poolName": d.pool_name, "deviceName": d.device_name,
                             "cdiDeviceIDs": d.cdi_device_ids} for d in self.devices]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "PreparedClaim":
        return cls(str(data["namespace"]), str(data["name"]),
                   [PreparedDevice(list(d.get("requestNames") or []), str(d["poolName"]), str(d["deviceName"]),
                                   list(d.get("cdiDeviceIDs") or [])) for d in data.get("devices") or []],
                   data.get("spec"))


def spec_file(claim_uid: str) -> str:
    return "%s%s.json" % (CDI_CLAIM_SPEC_PREFIX, claim_uid)


def cdi_devices(inventory: Inventory) -> Dict[str, CdiDevice]:
    """Device name (slices.device_name) -> what its CDI entry needs, for every present device
    with both DRM nodes (health is the scheduler's business: a claim may tolerate the taint)."""
    gpus = {g.index: g for g in inventory.gpus}
    out: Dict[str, CdiDevice] = {}
    for dev in inventory.devices:
        if not dev.drm_card or not dev.drm_render:
            continue
        gpu = gpus.get(dev.gpu_index)
        whole = not dev.is_vf and gpu is not None
        out[device_name(dev.id)] = CdiDevice(index=dev.index, bdf=dev.bdf, card=dev.drm_card, render=dev.drm_render,
                                             uuid=gpu.uuid if whole and gpu is not None else None,
                                             serial=gpu.serial if whole and gpu is not None else None)
    return out


def allocated(claim: Mapping[str, Any], ref: ClaimRef, pool: str) -> List[Tuple[str, List[str]]]:
    """(device name, request names) of this driver's devices in ``claim``'s allocation, in order.

    Raises ClaimError when the object is another claim (UID), is not allocated, or names a
    device of this driver in a pool other than this node's.
    """
    uid = (claim.get("metadata") or {}).get("uid")
    if uid != ref.uid:
        raise ClaimError("claim %s/%s has UID %s now, not %s: the request is stale"
                         % (ref.namespace, ref.name, uid, ref.uid))
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise ClaimError("claim %s is not allocated" % ref)
    out: Dict[str, List[str]] = {}
    for result in (allocation.get("devices") or {}).get("results") or []:
        if result.get("driver") != DRA_DRIVER:
            continue
        if result.get("pool") != pool:
            raise ClaimError("claim %s has device %s of pool %s, this node's pool is %s"
                             % (ref, result.get("device"), result.get("pool"), pool))
        requests = out.setdefault(str(result.get("device")), [])
        if result.get("request") and result["request"] not in requests:
            requests.append(str(result["request"]))
    return list(out.items())


class Checkpoint:
    """The prepared claims by UID, in ``path`` (replaced atomically on every save)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def load(self) -> Dict[str, PreparedClaim]:
        try:
            with open(self.path, "r", encoding="utf-8") as handle:
                data = json.load(handle)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise CheckpointError("cannot read the checkpoint %s: %s" % (self.path, exc))
        if not isinstance(data, dict) or data.get("version") != CHECKPOINT_VERSION:
            raise CheckpointError("checkpoint %s is not version %d" % (self.path, CHECKPOINT_VERSION))
        try:
            return {str(uid): PreparedClaim.from_dict(item) for uid, item in (data.get("claims") or {}).items()}
        except (KeyError, TypeError, AttributeError) as exc:
            raise CheckpointError("checkpoint %s is malformed: %s" % (self.path, exc))

    def save(self, claims: Mapping[str, PreparedClaim]) -> None:
        data = {"version": CHECKPOINT_VERSION, "driver": DRA_DRIVER,
                "claims": {uid: claims[uid].to_dict() for uid in sorted(claims)}}
        directory = os.path.dirname(self.path) or "."
        os.makedirs(directory, exist_ok=True)
        replace_file(self.path, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode("utf-8"), 0o600)


@dataclass
class Outcome:
    """One claim's answer: its devices, or why it failed."""

    devices: List[PreparedDevice] = field(default_factory=list)
    error: str = ""


class Preparer:
    """Prepare/Unprepare over the checkpoint and the CDI spec directory; thread-safe.

    ``get_claim(namespace, name)`` returns the ResourceClaim as a dict (raises ClaimError or
    any MetaxGpuError); ``node_devices()`` the node's devices now (:func:`cdi_devices`);
    ``maca()`` the host's MXMACA or None; ``host_path`` maps a node path to the host's.
    """

    def __init__(self, pool: str, plugin_dir: str, spec_dir: str,
                 get_claim: Callable[[str, str], Mapping[str, Any]],
                 node_devices: Callable[[], Mapping[str, CdiDevice]],
                 maca: Callable[[], Optional[Maca]] = lambda: None,
                 host_path: Callable[[str], str] = lambda path: path) -> None:
        self.pool = pool
        self.spec_dir = spec_dir
        self.checkpoint = Checkpoint(os.path.join(plugin_dir, CHECKPOINT_FILE))
        self._get_claim = get_claim
        self._node_devices = node_devices
        self._maca = maca
        self._host_path = host_path
        self._lock = threading.Lock()
        self._claims = self.checkpoint.load()
        self.api_reads = 0

    @property
    def prepared(self) -> Dict[str, PreparedClaim]:
        with self._lock:
            return dict(self._claims)

    def _spec_path(self, uid: str) -> str:
        return os.path.join(self.spec_dir, spec_file(uid))

    def prepare(self, ref: ClaimRef) -> Outcome:
        with self._lock:
            known = self._claims.get(ref.uid)
            if known is not None:
                if known.spec is not None:
                    write_if_changed(self._spec_path(ref.uid), render(known.spec))
                return Outcome(list(known.devices))
        try:
            self.api_reads += 1
            claim = self._get_claim(ref.namespace, ref.name)
            wanted = allocated(claim, ref, self.pool)
        except MetaxGpuError as exc:
            return Outcome(error=str(exc))
        with self._lock:
            known = self._claims.get(ref.uid)
            if known is not None:           # a concurrent call prepared it meanwhile
                return Outcome(list(known.devices))
            try:
                prepared = self._write(ref, wanted)
            except (ClaimError, CdiSpecError, OSError) as exc:
                return Outcome(error="cannot prepare claim %s: %s" % (ref, exc))
            claims = dict(self._claims)
            claims[ref.uid] = prepared
            try:
                self.checkpoint.save(claims)
            except OSError as exc:
                remove_spec(self._spec_path(ref.uid))
                return Outcome(error="cannot write the checkpoint %s: %s" % (self.checkpoint.path, exc))
            self._claims = claims
        LOG.info("prepared claim %s: %s", ref, ", ".join(d.device_name for d in prepared.devices) or "no device")
        return Outcome(list(prepared.devices))

    def _write(self, ref: ClaimRef, wanted: Sequence[Tuple[str, List[str]]]) -> PreparedClaim:
        if not wanted:
            return PreparedClaim(ref.namespace, ref.name)
        present = self._node_devices()
        missing = [name for name, _requests in wanted if name not in present]
        if missing:
            raise ClaimError("device(s) %s are not on this node now" % ", ".join(missing))
        spec = build_claim_spec(ref.uid, [(name, present[name]) for name, _requests in wanted], self._maca(),
                                self._host_path)
        write_if_changed(self._spec_path(ref.uid), render(spec))
        devices = [PreparedDevice(list(requests), self.pool, name, [qualified_name(claim_device_name(ref.uid, name))])
                   for name, requests in wanted]
        return PreparedClaim(ref.namespace, ref.name, devices, spec)

    def unprepare(self, ref: ClaimRef) -> str:
        """'' when the claim is not prepared any more, else why not."""
        with self._lock:
            try:
                removed = remove_spec(self._spec_path(ref.uid))
            except OSError as exc:
                return "cannot remove the CDI spec of claim %s: %s" % (ref, exc)
            if ref.uid not in self._claims:
                if removed:
                    LOG.info("unprepared claim %s (its spec was not in the checkpoint)", ref)
                return ""
            claims = dict(self._claims)
            del claims[ref.uid]
            try:
                self.checkpoint.save(claims)
            except OSError as exc:
                return "cannot write the checkpoint %s: %s" % (self.checkpoint.path, exc)
            self._claims = claims
        LOG.info("unprepared claim %s", ref)
        return ""
