# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""vfnum on a node: read the PFs, find who uses them, write ``sriov_numvfs``.

All I/O goes through a :class:`~..host.HostRoot`, so the same code writes a
real sysfs or a simulated node (whose kernel hook answers like the kernel:
EBUSY, ERANGE, fewer VFs...).
"""

from __future__ import annotations

import errno as errno_codes
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Set

from ..gpu import pci
from ..gpu.users import open_device_users as device_users
from ..host import HostRoot, HostRootError
from ..names import RESOURCE_NAME
from ..vfio.sysfs import VFIO_DRIVER
from .plan import Change, PfState, Plan, VfnumError

NUMVFS = "sriov_numvfs"

# Why the kernel refused a write, in the administrator's terms.
_ERRNO_REASONS = {
    errno_codes.EBUSY: "EBUSY: VFs are enabled or in use; the value must go through 0",
    errno_codes.ERANGE: "ERANGE: more VFs than sriov_totalvfs",
    errno_codes.EINVAL: "EINVAL: the device or the value does not support SR-IOV",
    errno_codes.ENOENT: "ENOENT: no PF driver bound (is the metax kernel module loaded?)",
    errno_codes.ENOMEM: "ENOMEM: the kernel could not allocate the VFs",
}


class VfnumApplyError(VfnumError):
    """A write failed part-way; ``results`` holds every GPU's state as re-read afterwards."""

    def __init__(self, message: str, results: Sequence[Dict[str, object]]) -> None:
        super().__init__(message)
        self.results = list(results)


def read_pfs(host: HostRoot) -> List[PfState]:
    """MetaX physical functions in PCI address order (discovery's GPU indexes)."""
    host.check()
    try:
        functions = pci.scan(host)
    except pci.PciScanError as exc:
        raise VfnumError(str(exc))
    vfs: Dict[str, List[str]] = {}
    for function in functions:
        if function.physfn is not None:
            vfs.setdefault(function.physfn, []).append(function.bdf)
    pfs = [f for f in functions if f.physfn is None]
    return [PfState(index=i, bdf=f.bdf, totalvfs=f.sriov_totalvfs, numvfs=f.sriov_numvfs,
                    vf_bdfs=tuple(vfs.get(f.bdf, ())), for_vm=_for_vm(host, f))
            for i, f in enumerate(pfs)]


def _for_vm(host: HostRoot, function: pci.PciFunction) -> bool:
    """Bound to vfio-pci, or on its way (driver_override): the hand-over's, not vfnum's (docs/vfio.md)."""
    override = host.read_attribute("%s/%s/driver_override" % (pci.PCI_DEVICES, function.bdf), default="")
    return VFIO_DRIVER in (function.driver, override)


def device_nodes(host: HostRoot, bdfs: Iterable[str]) -> Set[str]:
    """``/dev/dri/...`` node paths of the given PCI functions."""
    nodes = set()
    for bdf in bdfs:
        for name in host.listdir("%s/%s/drm" % (pci.PCI_DEVICES, bdf)):
            if name.startswith("card") or name.startswith("renderD"):
                nodes.add("/dev/dri/" + name)
    return nodes


def open_device_users(host: HostRoot, nodes: Set[str]) -> List[str]:
    """``"process <pid> (<comm>) holds <node> open"`` for processes under the host root's /proc holding ``nodes``."""
    return ["process %s (%s) holds %s open" % (u.pid, u.comm, u.node) for u in device_users(host, nodes)]


def in_use(host: HostRoot, pfs: Sequence[PfState], plan: Plan, gpu_pods: Sequence[str] = ()) -> List[str]:
    """Why the planned change would break running work (empty: safe).

    The device nodes of every function of a changing GPU count -- its VFs,
    and the PF itself, which is the allocatable device while vfnum is 0 --
    and so does any pod the caller found on the node requesting the GPU
    resource: the device plugin re-registers a different device list, so
    such pods lose their devices whatever GPU they sit on.
    """
    changing = {c.bdf for c in plan.changes if c.changed}
    if not changing:
        return []
    functions = set(changing)
    for pf in pfs:
        if pf.bdf in changing:
            functions.update(pf.vf_bdfs)
    reasons = open_device_users(host, device_nodes(host, sorted(functions)))
    reasons.extend("pod %s requests %s on this node" % (pod, RESOURCE_NAME) for pod in gpu_pods)
    return reasons


def _write(host: HostRoot, change: Change, value: int) -> None:
    try:
        host.write_attribute("%s/%s/%s" % (pci.PCI_DEVICES, change.bdf, NUMVFS), "%d" % value)
    except HostRootError as exc:
        reason = _ERRNO_REASONS.get(exc.errno or 0, str(exc))
        raise VfnumError("GPU %d (%s): writing %d to %s failed: %s (%s)"
                         % (change.index, change.bdf, value, NUMVFS, reason, exc))


def read_numvfs(host: HostRoot, bdf: str) -> int:
    return host.read_int("%s/%s/%s" % (pci.PCI_DEVICES, bdf, NUMVFS), default=0)


def apply(host: HostRoot, plan: Plan,
          progress: Optional[Callable[[Change, int], None]] = None) -> List[Dict[str, object]]:
    """Write the plan, GPU after GPU; returns per-GPU before/after as re-read from sysfs.

    The kernel may enable fewer VFs than asked (resources, firmware), so the
    value is read back after every GPU: a short count stops the run with
    VfnumApplyError, leaving the remaining GPUs untouched.
    """
    results: List[Dict[str, object]] = []
    pending = list(plan.changes)
    while pending:
        change = pending.pop(0)
        entry = change.to_dict()
        try:
            for value in change.writes:
                if progress is not None:
                    progress(change, value)
                _write(host, change, value)
            actual = read_numvfs(host, change.bdf)
            entry["after"] = actual
            if actual != change.after:
                raise VfnumError("GPU %d (%s): asked for %d VFs, the kernel enabled %d"
                                 % (change.index, change.bdf, change.after, actual))
        except VfnumError as exc:
            entry["after"] = read_numvfs(host, change.bdf)
            results.append(entry)
            results.extend(dict(c.to_dict(), after=c.before) for c in pending)
            raise VfnumApplyError(str(exc), results)
        results.append(entry)
    return results
