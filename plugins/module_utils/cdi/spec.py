# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The CDI spec of a node's MetaX devices (pure: no I/O).

One CDI device per allocatable device (a whole GPU, or a VF under SR-IOV),
under up to three names: its node-local index (``0``), and for a whole GPU
its UUID (``GPU-...``) and serial number, plus ``all``. Each device carries
its DRM ``card`` and ``renderD`` nodes; the spec-wide edits carry
``/dev/mxcd``, the host's MXMACA as a read-only mount on ``/opt/maca`` and
the environment MXMACA needs. Unhealthy devices are left out: a runtime
refuses a name the spec does not have, which is clearer than a container
that starts on a GPU that does not answer.

``cdiVersion`` is the lowest the content needs, by the rules of the CDI
library's ``MinimumRequiredVersion`` (tags.cncf.io/container-device-interface
specs-go/version.go): podman 4.3 (Debian 12) reads at most 0.5.0, and a
device name starting with a digit, or a device node with a ``hostPath``,
needs 0.5.0. tests/unit/cdi checks both against the library itself.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from ..errors import MetaxGpuError
from ..gpu.model import Inventory
from ..names import CDI_ALL, CDI_KIND, MACA_CONTAINER_PATH

DEVICE_MXCD = "/dev/mxcd"
DRI_DIR = "/dev/dri"
# MXMACA's library directories, relative to its root, in the order the
# vendor's images put them on LD_LIBRARY_PATH; only those present are used.
MACA_LIBRARY_DIRS = ("lib", "mxgpu_llvm/lib", "ompi/lib")
MOUNT_OPTIONS = ("ro", "nosuid", "nodev", "bind")
# CDI's device-name rule (parser.ValidateDeviceName): letters, digits and
# "_-.:", starting and ending with a letter or digit.
_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?$")


class CdiSpecError(MetaxGpuError):
    """The devices cannot be described in a valid spec."""


@dataclass(frozen=True)
class CdiDevice:
    """One allocatable device as the spec names it."""

    index: int
    bdf: str
    card: str                    # "card0"
    render: str                  # "renderD128"
    uuid: Optional[str] = None   # whole GPUs only
    serial: Optional[str] = None

    @property
    def names(self) -> Tuple[str, ...]:
        names = [str(self.index)]
        for extra in (self.uuid, self.serial):
            if extra and _NAME.match(extra) and extra != CDI_ALL and extra not in names:
                names.append(extra)
        return tuple(names)

    @property
    def nodes(self) -> Tuple[str, str]:
        return ("%s/%s" % (DRI_DIR, self.card), "%s/%s" % (DRI_DIR, self.render))


@dataclass(frozen=True)
class Maca:
    """The host's MXMACA: where it is (a host path) and which library dirs it has."""

    host_path: str
    library_dirs: Tuple[str, ...] = ()


def devices_of(inventory: Inventory) -> Tuple[List[CdiDevice], List[str]]:
    """The healthy devices with both DRM nodes, and why any other was left out."""
    gpus = {g.index: g for g in inventory.gpus}
    out: List[CdiDevice] = []
    skipped: List[str] = []
    for dev in inventory.devices:
        if not dev.healthy:
            skipped.append("device %d (%s) is unhealthy" % (dev.index, dev.bdf))
            continue
        if not dev.drm_card or not dev.drm_render:
            skipped.append("device %d (%s) has no DRM card/renderD node" % (dev.index, dev.bdf))
            continue
        gpu = gpus.get(dev.gpu_index)
        whole = not dev.is_vf and gpu is not None
        out.append(CdiDevice(index=dev.index, bdf=dev.bdf, card=dev.drm_card, render=dev.drm_render,
                             uuid=gpu.uuid if whole and gpu is not None else None,
                             serial=gpu.serial if whole and gpu is not None else None))
    return out, skipped


def _node(path: str, host_path: Callable[[str], str]) -> Dict[str, str]:
    entry = {"path": path}
    on_host = host_path(path)
    if on_host != path:
        # only when the node's root is not / (a simulated node, an agent
        # that sees the host under /host): hostPath needs cdiVersion 0.5.0
        entry["hostPath"] = on_host
    return entry


def maca_env(maca: Maca, container_path: str = MACA_CONTAINER_PATH) -> List[str]:
    env = ["MACA_PATH=%s" % container_path]
    libs = ["%s/%s" % (container_path, d) for d in MACA_LIBRARY_DIRS if d in maca.library_dirs]
    if libs:
        env.append("LD_LIBRARY_PATH=%s" % ":".join(libs))
    return env


def _common_edits(maca: Optional[Maca], host_path: Callable[[str], str], container_maca: str) -> Dict[str, Any]:
    """The spec-wide edits: ``/dev/mxcd``, and the host's MXMACA with its environment."""
    common: Dict[str, Any] = {"deviceNodes": [_node(DEVICE_MXCD, host_path)]}
    if maca is not None:
        common["env"] = maca_env(maca, container_maca)
        common["mounts"] = [{"hostPath": maca.host_path, "containerPath": container_maca,
                             "options": list(MOUNT_OPTIONS)}]
    return common


def build_spec(devices: Sequence[CdiDevice], maca: Optional[Maca],
               host_path: Callable[[str], str] = lambda path: path,
               container_maca: str = MACA_CONTAINER_PATH) -> Dict[str, Any]:
    """The spec as a dict (see the module docstring); raises CdiSpecError without devices."""
    if not devices:
        raise CdiSpecError("no usable MetaX device: a CDI spec needs at least one")
    ordered = sorted(devices, key=lambda d: d.index)
    seen: Dict[str, int] = {}
    cdi_devices: List[Dict[str, Any]] = []
    for dev in ordered:
        edits = {"deviceNodes": [_node(path, host_path) for path in dev.nodes]}
        for name in dev.names:
            if name in seen:
                # two GPUs reporting the same UUID or serial: neither gets the
                # name rather than one getting the other's
                raise CdiSpecError("devices %d and %d are both named %r" % (seen[name], dev.index, name))
            seen[name] = dev.index
            cdi_devices.append({"name": name, "containerEdits": edits})
    cdi_devices.append({"name": CDI_ALL, "containerEdits": {
        "deviceNodes": [_node(path, host_path) for dev in ordered for path in dev.nodes]}})
    common = _common_edits(maca, host_path, container_maca)
    spec: Dict[str, Any] = {"cdiVersion": "", "kind": CDI_KIND, "devices": cdi_devices, "containerEdits": common}
    spec["cdiVersion"] = required_version(spec)
    return spec


def _edits(spec: Dict[str, Any]) -> Iterable[Dict[str, Any]]:
    yield spec.get("containerEdits") or {}
    for dev in spec.get("devices") or []:
        yield dev.get("containerEdits") or {}


def required_version(spec: Dict[str, Any]) -> str:
    """The lowest cdiVersion that can carry ``spec`` (the CDI library's rules up to 0.6.0)."""
    kind_class = str(spec.get("kind", "")).partition("/")[2]
    if spec.get("annotations") or any(d.get("annotations") for d in spec.get("devices") or []) \
            or "." in kind_class:
        return "0.6.0"
    if any(str(d.get("name", ""))[:1].isdigit() for d in spec.get("devices") or []) or \
            any(n.get("hostPath") for e in _edits(spec) for n in e.get("deviceNodes") or []):
        return "0.5.0"
    if any(m.get("type") for e in _edits(spec) for m in e.get("mounts") or []):
        return "0.4.0"
    return "0.3.0"


def render(spec: Dict[str, Any]) -> bytes:
    """The spec file's bytes: JSON, stable for the same content (what the writer compares)."""
    return (json.dumps(spec, indent=2) + "\n").encode("utf-8")


def qualified_name(name: Any, kind: str = CDI_KIND) -> str:
    """The fully qualified CDI name of a device: ``metax-tech.com/gpu=0`` (the one place it is spelt)."""
    return "%s=%s" % (kind, name)


def device_names(spec: Dict[str, Any]) -> List[str]:
    """The fully qualified names (``metax-tech.com/gpu=0``) a spec defines."""
    return [qualified_name(d["name"], spec["kind"]) for d in spec.get("devices") or []]


def claim_device_name(claim_uid: str, name: str) -> str:
    """The CDI device name of device ``name`` of a DRA claim: ``<claim uid>-<name>``."""
    return "%s-%s" % (claim_uid, name)


def build_claim_spec(claim_uid: str, devices: Sequence[Tuple[str, CdiDevice]], maca: Optional[Maca],
                     host_path: Callable[[str], str] = lambda path: path,
                     container_maca: str = MACA_CONTAINER_PATH) -> Dict[str, Any]:
    """The spec of one DRA claim (gpu-dra): ``(device name, device)`` pairs -> a spec whose
    devices are named ``<claim uid>-<device name>``.

    The claim's UID in every name keeps two claims' specs (and gpu-device's node spec, which
    may be left on a node switched to DRA) from defining the same name: the CDI cache drops a
    name two specs of one priority define. The spec-wide edits are the node spec's:
    ``/dev/mxcd``, the host's MXMACA and its environment.
    """
    if not devices:
        raise CdiSpecError("claim %s has no MetaX device: a CDI spec needs at least one" % claim_uid)
    cdi_devices: List[Dict[str, Any]] = []
    for name, dev in devices:
        full = claim_device_name(claim_uid, name)
        if not _NAME.match(full):
            raise CdiSpecError("%r is not a valid CDI device name" % full)
        cdi_devices.append({"name": full, "containerEdits": {
            "deviceNodes": [_node(path, host_path) for path in dev.nodes]}})
    common = _common_edits(maca, host_path, container_maca)
    spec: Dict[str, Any] = {"cdiVersion": "", "kind": CDI_KIND, "devices": cdi_devices, "containerEdits": common}
    spec["cdiVersion"] = required_version(spec)
    return spec
