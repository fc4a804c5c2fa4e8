# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Take one :class:`~.readings.Reading` of a node: the I/O edge of gpu-exporter.

Per reading: a sysfs scan (cheap, no mx-smi) tells whether the GPUs changed
since the last discovery, and only then discovery runs again (it is what
knows UUIDs, products and VFs); ``mx-smi -j`` where the version has it, and
the ``mx-smi`` table for what the JSON lacks (memory and processes; all of it
when there is no JSON), and on every 4th reading ``mx-smi --count-ecc`` (ECC
counters, for mx_ecc_error_count); the kubelet's pod-resources API for who holds each
device. Every mx-smi run has a timeout well inside the interval; a run that
fails, hangs or prints what we cannot read becomes a problem of the reading
(a metric and a log line), never an exception.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Dict, List, Mapping, Optional, Tuple

from ..gpu import mxsmi, mxsmi_ecc, mxsmi_json, pci
from ..gpu.discovery import DRIVER_MODULE, MX_SMI, DiscoveryError, discover
from ..gpu.model import Inventory
from ..host import HostRoot, HostRootError
from ..health.eid import EidTracker
from .readings import Owner, Reading, device_metrics, driver_version

LOG = logging.getLogger("gpu-exporter.collect")
# parser bugs degrade a reading like odd output does (as in discovery)
_PARSE_FAILURES = (mxsmi.MxSmiParseError, ValueError, IndexError, KeyError, TypeError, AttributeError)
# after ``mx-smi -j`` failed (a version without JSON), try it again after this many readings
JSON_RETRY_READINGS = 20
# a discovery made without mx-smi's answer (no UUIDs, products from PCI ids) is
# repeated after this many readings, in case mx-smi has come back
REDISCOVER_READINGS = 20
# ``mx-smi --count-ecc`` (mx_ecc_error_count) on every this many readings: the
# counters change rarely, and a third mx-smi run per reading would cost the node
ECC_EVERY_READINGS = 4
RESULTS = ("ok", "error", "timeout", "unparsed")
COMMANDS = ("json", "table", "ecc")


class RunCounter:
    """mx-smi runs by (command, result), for ``metax_gpu_exporter_mx_smi_runs_total``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: Dict[Tuple[str, str], int] = {(c, r): 0 for c in COMMANDS for r in RESULTS}

    def add(self, command: str, result: str) -> None:
        with self._lock:
            self.counts[(command, result)] = self.counts.get((command, result), 0) + 1

    def snapshot(self) -> Dict[Tuple[str, str], int]:
        with self._lock:
            return dict(self.counts)

    def total(self) -> int:
        with self._lock:
            return sum(self.counts.values())


def _pci_key(host: HostRoot) -> Tuple[bool, Tuple[Tuple[str, Optional[str], Optional[str]], ...]]:
    """What makes discovery's answer stale: the driver, the functions and their drivers."""
    return host.isdir(DRIVER_MODULE), tuple((f.bdf, f.driver, f.physfn) for f in pci.scan(host))


class NodeReader:
    """``read()`` -> one Reading; callable from one thread at a time (the cache's)."""

    def __init__(self, host: HostRoot, timeout: float,
                 allocations: Optional[Callable[[], Mapping[str, Owner]]] = None,
                 clock: Callable[[], float] = time.time, eids: Optional[EidTracker] = None) -> None:
        self.host = host
        # EIDs from the kernel log (docs/health.md); None: not read
        self.eids = eids
        self.timeout = timeout
        self.allocations = allocations
        self.clock = clock
        self.runs = RunCounter()
        self.inventory: Optional[Inventory] = None
        self._pci: Optional[tuple] = None
        self._json_skip = 0              # readings left before ``-j`` is tried again
        self._ecc_wait = 0               # readings left before ``--count-ecc`` runs again
        self.ecc: Dict[str, Dict[str, int]] = {}     # its latest answer, served until the next
        self.discoveries = 0
        self._since_discovery = 0
        self._logged: frozenset = frozenset()

    # -- discovery, only when the hardware changed ------------------------
    def _inventory(self, problems: List[str]) -> Optional[Inventory]:
        try:
            key = _pci_key(self.host)
        except (pci.PciScanError, HostRootError, OSError) as exc:
            problems.append("cannot scan PCI devices: %s" % exc)
            return self.inventory
        self._since_discovery += 1
        incomplete = self.inventory is not None and self.inventory.gpus and not self.inventory.mx_smi_available
        if self.inventory is None or key != self._pci or (incomplete and self._since_discovery >= REDISCOVER_READINGS):
            try:
                self.inventory = discover(self.host, topology=False)
            except (DiscoveryError, HostRootError) as exc:
                problems.append("discovery failed: %s" % exc)
                return self.inventory
            self._pci = key
            self.discoveries += 1
            self._since_discovery = 0
            LOG.info("discovered %d GPU(s), %d device(s)", len(self.inventory.gpus), len(self.inventory.devices),
                     extra={"fields": {"devices": [d.bdf for d in self.inventory.devices]}})
        return self.inventory

    # -- mx-smi -------------------------------------------------------------
    def _run(self, command: str, args: List[str], deadline: float, problems: List[str]) -> Optional[str]:
        binary = self.host.which(MX_SMI)
        if binary is None:
            problems.append("mx-smi not found under %s" % self.host.path)
            self.runs.add(command, "error")
            return None
        shown = " ".join([MX_SMI] + args)
        left = deadline - time.monotonic()
        if left <= 0.05:
            problems.append("`%s` not run: the reading's %.1fs budget is spent" % (shown, self.timeout))
            self.runs.add(command, "timeout")
            return None
        try:
            rc, out, err = self.host.run([binary] + args, timeout=left)
        except HostRootError as exc:
            timed_out = "timed out" in str(exc)
            self.runs.add(command, "timeout" if timed_out else "error")
            problems.append("`%s`: %s" % (shown, exc))
            return None
        except OSError as exc:
            self.runs.add(command, "error")
            problems.append("`%s` could not be run: %s" % (shown, exc))
            return None
        if rc != 0:
            self.runs.add(command, "error")
            detail = (err.strip() or out.strip() or "no output").splitlines()[0][:200]
            problems.append("`%s` exited %d: %s" % (shown, rc, detail))
            return None
        return out

    def _read_json(self, deadline: float, problems: List[str]) -> Optional[mxsmi_json.MxSmiJson]:
        if self._json_skip > 0:
            self._json_skip -= 1
            return None
        out = self._run("json", ["-j"], deadline, problems)
        parsed = None
        if out is not None:
            try:
                parsed = mxsmi_json.parse_json(out)
            except _PARSE_FAILURES as exc:
                problems.append(str(exc))
                self.runs.add("json", "unparsed")
            else:
                self.runs.add("json", "ok")
                problems.extend(parsed.problems)
        if parsed is None:
            self._json_skip = JSON_RETRY_READINGS   # the table alone meanwhile
        return parsed

    def _read_table(self, deadline: float, problems: List[str]) -> Optional[mxsmi.MxSmiTable]:
        out = self._run("table", [], deadline, problems)
        if out is None:
            return None
        try:
            table = mxsmi.parse_table(out)
        except _PARSE_FAILURES as exc:
            problems.append(str(exc))
            self.runs.add("table", "unparsed")
            return None
        self.runs.add("table", "ok")
        problems.extend(table.problems)
        return table

    def _read_ecc(self, deadline: float, problems: List[str]) -> None:
        """``--count-ecc`` when due; its answer is kept for the readings in between."""
        if self._ecc_wait > 0:
            self._ecc_wait -= 1
            return
        out = self._run("ecc", ["--count-ecc"], deadline, problems)
        if out is None:
            self.ecc = {}
            self._ecc_wait = JSON_RETRY_READINGS       # a version without it: not on every reading
            return
        found: List[str] = []
        try:
            self.ecc = mxsmi_ecc.parse_count_ecc(out, found)
        except _PARSE_FAILURES as exc:
            found.append(str(exc))
            self.ecc = {}
        self.runs.add("ecc", "unparsed" if found and not self.ecc else "ok")
        problems.extend(found)
        self._ecc_wait = ECC_EVERY_READINGS - 1

    def _owners(self, problems: List[str]) -> Tuple[Mapping[str, Owner], bool]:
        if self.allocations is None:
            return {}, False
        try:
            return self.allocations(), True
        except Exception as exc:  # pylint: disable=broad-except  # gRPC and socket errors of many kinds
            problems.append("pod-resources: %s" % exc)
            return {}, False

    def read(self) -> Reading:
        started = time.monotonic()
        deadline = started + self.timeout
        problems: List[str] = []
        inventory = self._inventory(problems)
        smi_json = table = None
        if inventory is not None and inventory.gpus and inventory.driver.loaded:
            smi_json = self._read_json(deadline, problems)
            # real -j output has no memory and no processes: the table has them
            table = self._read_table(deadline, problems)
            if smi_json is not None or table is not None:
                self._read_ecc(deadline, problems)
        owners, pod_resources_ok = self._owners(problems)
        eids = None
        if self.eids is not None and inventory is not None:
            eids = self.eids.read([g.bdf for g in inventory.gpus], problems)
        devices = device_metrics(inventory, smi_json, table, owners, self.ecc, eids) if inventory is not None else ()
        source = "+".join(name for name, part in (("json", smi_json), ("table", table)) if part) or "none"
        ok = smi_json is not None or table is not None
        self._log(problems)
        return Reading(taken_at=self.clock(), devices=devices, mx_smi_ok=ok, source=source,
                       duration_seconds=time.monotonic() - started, pod_resources_ok=pod_resources_ok,
                       problems=tuple(dict.fromkeys(problems)),
                       driver_version=driver_version(inventory, smi_json, table))

    def _log(self, problems: List[str]) -> None:
        """Each problem once when it appears, and once when all are gone."""
        current = frozenset(problems)
        for problem in problems:
            if problem not in self._logged:
                LOG.warning("%s", problem)
        if self._logged and not current:
            LOG.info("mx-smi and pod-resources read cleanly again")
        self._logged = current
