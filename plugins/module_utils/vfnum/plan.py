# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Pure planning of a vfnum change: which GPUs, from what, to what, by which writes.

The kernel's rules shape the plan (docs/vfnum.md):

* ``sriov_numvfs`` accepts a new non-zero value only from 0: non-zero to
  another non-zero answers EBUSY, so such a change is planned as two writes,
  0 then the new value;
* a value above ``sriov_totalvfs`` answers ERANGE, so it is refused here,
  before anything is written;
* a GPU without SR-IOV (``sriov_totalvfs`` 0; the node label ``gpu.sriov``
  is then ``forbidden`` when no GPU has it) cannot be virtualised.

The manual allows 1, 2, 4 and 8 VFs per GPU (``gpu.vfnum`` label, section
2.1.3); 0 turns virtualisation off.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from ..errors import MetaxGpuError
from ..gpu.pci import normalize_bdf

ALLOWED_VFNUMS: Tuple[int, ...] = (0, 1, 2, 4, 8)


class VfnumError(MetaxGpuError):
    """A vfnum request that cannot be planned or applied; nothing was written unless said so."""


@dataclass(frozen=True)
class PfState:
    """One physical function as read from sysfs."""

    index: int           # GPU index as discovery numbers them (PFs in PCI address order)
    bdf: str
    totalvfs: int
    numvfs: int
    vf_bdfs: Tuple[str, ...] = ()
    # handed to VMs (bound to vfio-pci, or its driver_override says so: docs/vfio.md): vfnum is
    # not this GPU's any more until it is handed back (which restores the vfnum it had)
    for_vm: bool = False


@dataclass(frozen=True)
class Change:
    """The planned change of one GPU."""

    index: int
    bdf: str
    totalvfs: int
    before: int
    after: int

    @property
    def changed(self) -> bool:
        return self.before != self.after

    @property
    def writes(self) -> Tuple[int, ...]:
        """The values written to ``sriov_numvfs``, in order."""
        if not self.changed:
            return ()
        if self.before and self.after:
            return (0, self.after)
        return (self.after,)

    def to_dict(self) -> Dict[str, object]:
        return {"index": self.index, "bdf": self.bdf, "totalvfs": self.totalvfs,
                "before": self.before, "after": self.after}


@dataclass(frozen=True)
class Plan:
    vfnum: int
    changes: Tuple[Change, ...] = field(default_factory=tuple)

    @property
    def changed(self) -> bool:
        return any(c.changed for c in self.changes)

    def diff(self) -> Dict[str, Dict[str, int]]:
        """Ansible's diff: ``sriov_numvfs`` per selected GPU (by PCI address), before and after."""
        return {"before": {c.bdf: c.before for c in self.changes},
                "after": {c.bdf: c.after for c in self.changes}}


def select(pfs: Sequence[PfState], devices: Optional[Sequence[object]]) -> List[PfState]:
    """The GPUs named by index or PCI address (all when ``devices`` is None or empty), in index order."""
    if not devices:
        return list(pfs)
    by_bdf = {p.bdf: p for p in pfs}
    by_index = {p.index: p for p in pfs}
    chosen: Dict[int, PfState] = {}
    unknown = []
    for item in devices:
        text = str(item).strip()
        pf = None
        if text.isdigit():
            pf = by_index.get(int(text))
        else:
            try:
                pf = by_bdf.get(normalize_bdf(text))
            except ValueError:
                pf = None
        if pf is None:
            unknown.append(text)
        else:
            chosen[pf.index] = pf
    if unknown:
        raise VfnumError("unknown GPU(s) %s: this node has %s" % (
            ", ".join(repr(u) for u in unknown),
            ", ".join("%d (%s)" % (p.index, p.bdf) for p in pfs) or "no MetaX GPU"))
    return [chosen[i] for i in sorted(chosen)]


def plan(pfs: Sequence[PfState], vfnum: int, devices: Optional[Sequence[object]] = None) -> Plan:
    """Validate the request against the node and plan it; raises VfnumError with nothing written."""
    if isinstance(vfnum, bool) or not isinstance(vfnum, int) or vfnum not in ALLOWED_VFNUMS:
        raise VfnumError("vfnum must be one of %s (0 turns virtualisation off), got %r"
                         % (", ".join(str(v) for v in ALLOWED_VFNUMS), vfnum))
    if not pfs:
        raise VfnumError("no MetaX GPU (physical function) found on this node")
    chosen = select(pfs, devices)
    held = ["%d (%s)" % (p.index, p.bdf) for p in chosen if p.for_vm]
    if held and devices:
        raise VfnumError("GPU(s) %s are handed to VMs (vfio-pci): hand them back first (docs/vfio.md)" % ", ".join(held))
    chosen = [p for p in chosen if not p.for_vm]
    if vfnum > 0 and not any(p.totalvfs > 0 for p in pfs):
        raise VfnumError("SR-IOV is not available on this node (gpu.sriov=forbidden: "
                         "sriov_totalvfs is 0 on every GPU); vfnum %d cannot be set" % vfnum)
    problems = []
    for pf in chosen:
        if vfnum == 0 or vfnum == pf.numvfs:
            continue
        if pf.totalvfs == 0:
            problems.append("GPU %d (%s) does not support SR-IOV (sriov_totalvfs 0)" % (pf.index, pf.bdf))
        elif vfnum > pf.totalvfs:
            problems.append("GPU %d (%s) supports at most %d VFs (sriov_totalvfs); the kernel would "
                            "answer ERANGE to %d" % (pf.index, pf.bdf, pf.totalvfs, vfnum))
    if problems:
        raise VfnumError("vfnum %d cannot be set: %s" % (vfnum, "; ".join(problems)))
    return Plan(vfnum=vfnum, changes=tuple(
        Change(index=p.index, bdf=p.bdf, totalvfs=p.totalvfs, before=p.numvfs, after=vfnum)
        for p in chosen))
