# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Take one health reading of a node: the I/O edge of the health signals.

Per reading, on top of the discovery gpu-device already made (the four old
checks): ``mx-smi -j`` (state, PCI events, RAS, MetaXLink AER), ``mx-smi
--count-ecc`` (ECC, retired pages) and what the kernel log gained (EIDs).
A command the installed mx-smi lacks (before 2.2.12) is tried again only
after ``RETRY_READINGS`` readings; whatever fails or is not understood is a
problem of the reading, never an exception, and the signals it would have
given are unknown, not 0. Standard library only (node-side).
"""

from __future__ import annotations

import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..gpu import mxsmi, mxsmi_ecc, mxsmi_json
from ..gpu.discovery import MX_SMI
from ..gpu.model import Inventory
from ..host import HostRoot, HostRootError
from . import eid as E
from .signals import NodeReading, gpu_readings

_PARSE_FAILURES = (mxsmi.MxSmiParseError, ValueError, IndexError, KeyError, TypeError, AttributeError)
RETRY_READINGS = 20
DEFAULT_TIMEOUT = 10.0


class HealthReader:
    """``read(inventory, lost)`` -> NodeReading; one thread at a time (gpu-device's health loop)."""

    def __init__(self, host: HostRoot, eid_pattern: str = E.DEFAULT_PATTERN,
                 log_files: Sequence[str] = E.DEFAULT_LOG_FILES, timeout: float = DEFAULT_TIMEOUT,
                 clock: Callable[[], float] = time.time) -> None:
        self.host = host
        self.timeout = timeout
        self.clock = clock
        self.eids = E.EidTracker(host.path, eid_pattern, log_files)
        self._skip: Dict[str, int] = {"-j": 0, "--count-ecc": 0}
        self.runs = 0

    def configure(self, eid_pattern: str, log_files: Sequence[str]) -> None:
        """A new pattern or log list (the policy changed): a new list is read from its end again."""
        self.eids.configure(eid_pattern, log_files)

    def _run(self, arg: str, deadline: float, problems: List[str]) -> Optional[str]:
        if self._skip[arg] > 0:
            self._skip[arg] -= 1
            return None
        binary = self.host.which(MX_SMI)
        if binary is None:
            return None          # discovery already reports a missing mx-smi (mx-smi-unresponsive)
        left = deadline - time.monotonic()
        if left <= 0.05:
            problems.append("`mx-smi %s` not run: the reading's %.1fs budget is spent" % (arg, self.timeout))
            return None
        self.runs += 1
        try:
            rc, out, err = self.host.run([binary, arg], timeout=left)
        except (HostRootError, OSError) as exc:
            problems.append("`mx-smi %s`: %s" % (arg, exc))
            return None
        if rc != 0:
            detail = (err.strip() or out.strip() or "no output").splitlines()[0][:200]
            problems.append("`mx-smi %s` exited %d: %s" % (arg, rc, detail))
            self._skip[arg] = RETRY_READINGS      # a version without it: not on every reading
            return None
        return out

    def _json(self, deadline: float, problems: List[str]) -> Optional[mxsmi_json.MxSmiJson]:
        out = self._run("-j", deadline, problems)
        if out is None:
            return None
        try:
            parsed = mxsmi_json.parse_json(out)
        except _PARSE_FAILURES as exc:
            problems.append(str(exc))
            return None
        problems.extend(parsed.problems)
        return parsed

    def _ecc(self, deadline: float, problems: List[str]) -> Optional[Dict[str, Dict[str, int]]]:
        out = self._run("--count-ecc", deadline, problems)
        if out is None:
            return None
        try:
            return mxsmi_ecc.parse_count_ecc(out, problems)
        except _PARSE_FAILURES as exc:
            problems.append(str(exc))
            return None

    def read(self, inventory: Inventory, lost: Sequence[Tuple[str, int]] = ()) -> NodeReading:
        deadline = time.monotonic() + self.timeout
        problems: List[str] = []
        smi_json = ecc = None
        if inventory.gpus and inventory.driver.loaded and inventory.mx_smi_available:
            smi_json = self._json(deadline, problems)
            ecc = self._ecc(deadline, problems)
        eids = self.eids.read([g.bdf for g in inventory.gpus], problems)
        return NodeReading(self.clock(), gpu_readings(inventory, lost, smi_json, ecc, eids),
                           tuple(dict.fromkeys(problems)))
