# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The simulated node's GPU health signals: ECC counts, PCI events, RAS and MetaXLink AER counters
in the node's state (what its mx-smi prints), and EID lines in its kernel log (docs/health.md)."""

from __future__ import annotations

import os
from typing import Dict, Optional

from ..host import HostRoot
from .generator import SimError, _gpu, load_state, save_state

KERNEL_LOG = "var/log/kern.log"
ECC_SIGNALS = ("sram_correctable", "sram_uncorrectable", "dram_correctable", "dram_uncorrectable", "retired_dbe")
PCI_EVENT_KINDS = ("aer_ue", "aer_ce", "synfld", "dbe", "mmio")
RAS_KINDS = ("uncorrected", "corrected")
SIGNAL_KEYS = ("ecc", "pci_events", "ras", "mxlk_aer")


def inject_signals(host: HostRoot, index: int, ecc: Optional[Dict[str, int]] = None,
                   pci_events: Optional[Dict[str, int]] = None, ras: Optional[Dict[str, int]] = None,
                   mxlk_aer: Optional[Dict[str, Dict[str, int]]] = None) -> None:
    """Add to a GPU's counters, as the hardware counts: mx-smi prints them (``--count-ecc``, ``-j``).

    ``ecc``: ECC_SIGNALS; ``pci_events``: PCI_EVENT_KINDS (events listed in
    ``-j``'s ``pci_event_info``); ``ras``: RAS_KINDS; ``mxlk_aer``: link ->
    {"ce": n, "ue": n}. The GPU stays available: only the counters move.
    """
    state = load_state(host)
    gpu = _gpu(state, index)
    for key, given, known in (("ecc", ecc, ECC_SIGNALS), ("pci_events", pci_events, PCI_EVENT_KINDS),
                              ("ras", ras, RAS_KINDS)):
        for name, count in (given or {}).items():
            if name not in known:
                raise SimError("unknown %s counter %r (known: %s)" % (key, name, ", ".join(known)))
            if count < 0:
                raise SimError("%s %s: a count cannot be negative" % (key, name))
            bucket = gpu.setdefault(key, {})
            bucket[name] = bucket.get(name, 0) + int(count)
    peers = sum(1 for link in state["links"][index] if link == "MX")
    for link, counts in (mxlk_aer or {}).items():
        if not str(link).isdigit() or int(link) >= peers:
            raise SimError("GPU %d has %d MetaXLink link(s): no link %r" % (index, peers, link))
        bucket = gpu.setdefault("mxlk_aer", {}).setdefault(str(link), {"ce": 0, "ue": 0})
        for kind, count in counts.items():
            if kind not in ("ce", "ue") or count < 0:
                raise SimError("MetaXLink AER counts are ce=N or ue=N, not %s=%s" % (kind, count))
            bucket[kind] += int(count)
    save_state(host, state)


def kernel_log_line(bdf: str, eid: int, sdk: bool = False, when: Optional[float] = None,
                    node: str = "sim-node") -> str:
    """One EID line of the simulated kernel log (the simulator's form; docs/health.md).

    The driver's: ``<time> <node> kernel: [<uptime>] metax <BDF>: [EID <n>] ...``;
    the SDK's (a user-space library writing to syslog): ``<time> <node> maca[<pid>]: <BDF> [SDK EID <n>] ...``.
    """
    import time as _time        # only here: the generator is otherwise time-free

    now = _time.time() if when is None else when
    stamp = _time.strftime("%b %d %H:%M:%S", _time.gmtime(now))
    if sdk:
        return "%s %s maca[4242]: %s [SDK EID %d] simulated SDK error\n" % (stamp, node, bdf, eid)
    return "%s %s kernel: [%12.6f] metax %s: [EID %d] simulated driver error\n" % (stamp, node, now % 100000, bdf, eid)


def add_eid(host: HostRoot, index: int, eid: int, sdk: bool = False) -> str:
    """Append an EID line for a GPU to the simulated kernel log (``var/log/kern.log``); returns it."""
    state = load_state(host)
    gpu = _gpu(state, index)
    if eid < 0:
        raise SimError("an EID is a non-negative number, not %d" % eid)
    line = kernel_log_line(gpu["bdf"], eid, sdk, node=state["spec"]["name"])
    path = host.join(KERNEL_LOG)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    # appended, as syslog does: a reader keeps its offset across writes
    with open(path, "a") as handle:
        handle.write(line)
    return line


def clear_signals(host: HostRoot, index: int) -> bool:
    """Zero a GPU's injected counters (a driver reload resets the hardware's); True when any was set."""
    state = load_state(host)
    gpu = _gpu(state, index)
    had = any(gpu.get(key) for key in SIGNAL_KEYS)
    for key in SIGNAL_KEYS:
        gpu.pop(key, None)
    save_state(host, state)
    return had
