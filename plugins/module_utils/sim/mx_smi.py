# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The ``mx-smi`` of a simulated node (copied to ``usr/bin/mx-smi``).

Standalone (standard library only, Python 3.6+): it runs wherever the
simulated root is mounted, including inside agent containers, and finds the
node state relative to its own location. Output follows the MetaX tool:
the device table, ``-L`` (one line per GPU: chip, PCI address, state, UUID)
and ``topo -m``.

Two layouts (``mx_smi_layout`` in the node state):

``real`` (default)  what MetaX machines print (the samples in
                    tests/unit/gpu/fixtures/mx-smi/): two rows of four
                    irregular-width cells per GPU, ``MetaX C500`` board
                    names, ``topo -m`` without CPU/NUMA affinity columns.
``legacy``          the layout this simulator printed before the real one
                    was known (``MXC500``, aligned cells, affinity columns);
                    kept so the parsers' tolerance stays tested.

``-j`` prints JSON shaped like the real 2.2.12 capture (version line first,
devices keyed by PCI address, numbers as strings, no memory); versions
before 2.2.12 refuse it, as old tools do. Simulated VFs are listed in the
JSON under their own addresses (an assumption: no real capture with VFs).

Readings change over time and with load: ``.metax-sim/load.json`` (written by
``sim load``) gives a device (PF or VF address) a utilisation and a number of
processes; utilisation, memory, temperature and power follow from it with a
slow wave, so a dashboard shows something alive. Everything is a function
of the state's ``seed`` and the time, which ``METAX_SIM_TIME`` (seconds)
fixes for tests.
"""

import math
import os
import sys
import time

try:
    # json's C scanner on its own. The tool runs thousands of times in a test
    # run (every agent's health and metrics cycle), and ``import json`` pulls in
    # ``re`` and ``enum``: half of each run's CPU time. ``json`` itself is
    # imported only by ``-j``, which prints JSON.
    from _json import make_scanner as _make_scanner
except ImportError:     # another Python: the json module does the same job
    _make_scanner = None  # type: ignore[misc,assignment]  # (a typing import would cost the run's time)

# the legend of 2.2.9 (samples/mx-smi/topo-m-2.2.9-8xC500.txt), in its order
LEGEND = [
    ("X", "Self"),
    ("SYS", "Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)"),
    ("NODE", "Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node"),
    ("PHB", "Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)"),
    ("PXB", "Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)"),
    ("PIX", "Connection traversing at most a single PCIe bridge"),
    ("MX", "Connection traversing MetaXLink"),
    ("ETH", "Connection traversing Eth"),
    ("NA", "Connection type is unknown"),
]


def _root():
    here = os.path.dirname(os.path.realpath(os.path.abspath(__file__)))
    return os.path.dirname(os.path.dirname(here))  # <root>/usr/bin/mx-smi


class _Decoding:
    """What json's C scanner reads from its decoder: plain JSON, as json.loads decodes it."""
    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = float      # NaN, Infinity, -Infinity


def read_json(path):
    """The JSON document in ``path`` (the simulator's own files), ValueError when it is not one."""
    with open(path) as handle:
        text = handle.read()
    if _make_scanner is None:
        import json  # pylint: disable=import-outside-toplevel
        return json.loads(text)
    body = text.strip(" \t\r\n")
    try:
        value, end = _make_scanner(_Decoding())(body, 0)
    except StopIteration as exc:
        raise ValueError("%s: not JSON at character %s" % (path, exc.value)) from None
    if end != len(body):
        raise ValueError("%s: extra data after the JSON document (at %d)" % (path, end))
    return value


def _state():
    return read_json(os.path.join(_root(), ".metax-sim", "state.json"))


def _visible(state):
    # a GPU vfio-pci holds is not the MetaX driver's: mx-smi no longer sees it
    return [g for g in state["gpus"] if g["failed"] != "bus" and not g.get("vfio")]


POWER_CAP = {"C500": 350, "C550": 450, "N100": 150}
# an idle GPU prints what the real captures show (table-2.2.9-8xC500.txt):
# 0%, 826 MiB, 57 W, 35 C; only load makes the numbers move
IDLE_MEMORY_MIB = 826
IDLE_POWER = 57
IDLE_TEMP = 35
WAVE_SECONDS = 300.0
JSON_SINCE = (2, 2, 12)


def _now():
    fixed = os.environ.get("METAX_SIM_TIME")
    return float(fixed) if fixed else time.time()


def _loads():
    try:
        data = read_json(os.path.join(_root(), ".metax-sim", "load.json"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _phase(bdf, seed):
    return (sum((i + 1) * ord(c) for i, c in enumerate(bdf)) * 7919 + seed * 104729) % 1000 / 1000.0


def _vf_bdfs(gpu):
    domain, bus = gpu["bdf"].split(":")[:2]
    return ["%s:%s:%02x.%d" % (domain, bus, k >> 3, k & 7) for k in range(1, gpu.get("numvfs", 0) + 1)]


def _reading(state, bdf, loads, now):
    """(utilisation 0-1, processes, wave 0-1) of one PF or VF: its load, swaying slowly."""
    wave = 0.5 + 0.5 * math.sin(2 * math.pi * (now / WAVE_SECONDS + _phase(bdf, state.get("seed", 0))))
    entry = loads.get(bdf) or {}
    load = max(0.0, min(1.0, float(entry.get("utilization", 0.0))))
    util = load * (0.8 + 0.2 * wave) if load > 0 else 0.0
    return util, int(entry.get("processes", 1 if load > 0 else 0)), wave


def _gpu_readings(state, gpu, loads, now):
    """The board's numbers: a PF with VFs is as busy as its VFs on average."""
    util, procs, wave = _reading(state, gpu["bdf"], loads, now)
    vfs = [_reading(state, vf, loads, now) for vf in _vf_bdfs(gpu)]
    if vfs:
        util = sum(v[0] for v in vfs) / len(vfs)
        procs += sum(v[1] for v in vfs)
    cap = POWER_CAP.get(gpu["product"], 350)
    total = gpu["memory_mib"]
    sway = wave if util > 0 else 0.0
    return {
        "util": util, "processes": procs, "cap": cap,
        "memory_used": min(total, IDLE_MEMORY_MIB + int(util * 0.9 * (total - IDLE_MEMORY_MIB))),
        "temp": IDLE_TEMP + 45.0 * util + 2.0 * sway,
        "power": IDLE_POWER + (cap - IDLE_POWER) * util + 3.0 * sway,
    }


def _version_tuple(text):
    parts = []
    for part in text.split("."):
        parts.append(int(part) if part.isdigit() else 0)
    return tuple(parts)


LAYOUTS = ("real", "legacy")
BIOS_VERSION = "1.22.3.0"
BANNER = "=================== MetaX System Management Interface Log ==================="


def _layout(state):
    return state.get("mx_smi_layout", "real")


def _table(state):
    return _table_real(state) if _layout(state) == "real" else _table_legacy(state)


_RULE_229 = "+------------------+-----------------+---------------------+----------------------+"
_BOX = "+---------------------------------------------------------------------------------+"


def _table_real(state):
    """The table as 2.2.9 prints it, cell for cell (samples/mx-smi/table-2.2.9-8xC500.txt)."""
    gpus = _visible(state)
    out = ["mx-smi  version: %s" % state["mx_smi_version"], "",
           BANNER,
           "Timestamp                                         : %s" % time.strftime("%a %b %d %H:%M:%S %Y",
                                                                                    time.gmtime(_now())),
           "", "Attached GPUs                                     : %d" % len(gpus), _BOX,
           "| %-34s %-44s |" % ("MX-SMI %s" % state["mx_smi_version"],
                                "Kernel Mode Driver Version: %s" % state["driver_version"]),
           "| %-34s %-44s |" % ("MACA Version: %s" % state["maca_version"], "BIOS Version: %s" % BIOS_VERSION),
           "|------------------+-----------------+---------------------+----------------------|",
           "| Board       Name | GPU   Persist-M | Bus-id              | GPU-Util      sGPU-M |",
           "| Pwr:Usage/Cap    | Temp       Perf | Memory-Usage        | GPU-State            |",
           "|==================+=================+=====================+======================|"]
    loads, now = _loads(), _now()
    processes = []
    for pos, gpu in enumerate(gpus):
        status = "Unavailable" if gpu["failed"] else "Available"
        r = _gpu_readings(state, gpu, loads, now)
        name, util = "MetaX %s" % gpu["product"], "%d%%" % round(r["util"] * 100)
        out.append("| %s%s | %s%s | %-19s | %s%s |" % (str(pos).ljust(16 - len(name)), name, str(pos).ljust(12), "Off",
                                                       gpu["bdf"], util.ljust(12), "Disabled"))
        out.append("| %-16s | %s%s | %-19s | %-20s |" % ("%dW / %dW" % (r["power"], r["cap"]),
                                                         ("%dC" % r["temp"]).ljust(13), "P0",
                                                         "%d/%d MiB" % (r["memory_used"], gpu["memory_mib"]), status))
        out.append(_RULE_229)
        for k in range(r["processes"]):
            processes.append((pos, 10000 + 100 * gpu["index"] + k, (r["memory_used"] - IDLE_MEMORY_MIB)
                              // max(1, r["processes"])))
    out += ["", _BOX,
            "| Process:                                                                        |",
            "|  GPU                    PID         Process Name                 GPU Memory     |",
            "|                                                                  Usage(MiB)     |",
            "|=================================================================================|"]
    if not processes:
        out.append("|  no process found                                                               |")
    for pos, pid, mib in processes:
        out.append("|  %-21s%-14s%-29s%-15s|" % (pos, pid, "python", mib))
    out += [_BOX, "", "End of Log"]
    return "\n".join(out)


def _json(state):
    """``mx-smi -j`` as 2.2.12 prints it (the capture in tests/unit/gpu/fixtures/mx-smi/)."""
    loads, now = _loads(), _now()
    gpus = _visible(state)
    doc = {"timestamp": time.strftime("%a %b %d %H:%M:%S %Y", time.gmtime(now)),
           "smi_version": state["mx_smi_version"], "maca_version": state["maca_version"],
           "driver_version": state["driver_version"], "attached_gpus": len(gpus)}
    for pos, gpu in enumerate(gpus):
        r = _gpu_readings(state, gpu, loads, now)
        rails = (0.42, 0.43, 0.15)     # the real capture's split of board power over three rails
        doc[gpu["bdf"]] = {
            "device_id": pos, "vbios_version": BIOS_VERSION,
            "unavailable_reason": "GPU is unavailable" if gpu["failed"] else "",
            "hotspot": "%.3f" % (r["temp"] + 3.5), "utilization": int(round(r["util"] * 100)),
            # the capture's idle clocks; the core clock rises with the load
            "clocks": {"XCORE": int(round(1125 + 475 * r["util"])), "MC": 1800, "VPUE": 535, "VPUD": 525},
            "board_power": {"power": {"Way%d" % i: "%.3f" % (r["power"] * share) for i, share in enumerate(rails)}},
            "ras_count": _ras_count(gpu),
            "pci_event_info": _pci_events(gpu, now),
            "sgpu_count": 0, "sgpu_info": [],
        }
        links = _mxlk_links(state, gpu)
        if links:
            doc[gpu["bdf"]]["mxlk_aer_count"] = links
        for k, vf in enumerate(_vf_bdfs(gpu)):
            util, _procs, _wave = _reading(state, vf, loads, now)
            parent = doc[gpu["bdf"]]
            doc[vf] = {"device_id": len(gpus) + pos * 64 + k, "unavailable_reason": parent["unavailable_reason"],
                       "hotspot": parent["hotspot"], "utilization": int(round(util * 100))}
    import json  # pylint: disable=import-outside-toplevel  # only -j prints JSON (see the imports)
    return "mx-smi  version: %s\n%s" % (state["mx_smi_version"], json.dumps(doc, indent=4))


PCI_EVENT_KINDS = ("aer_ue", "aer_ce", "synfld", "dbe", "mmio")


def _pci_events(gpu, now):
    """``pci_event_info``: per kind, the list of events (the real capture's lists are empty).

    An injected event (``sim fail --aer-ue N``) is listed as a string naming
    its kind and number: what a real entry holds is unknown, its count is
    what readers use (docs/health.md).
    """
    injected = gpu.get("pci_events") or {}
    stamp = time.strftime("%a %b %d %H:%M:%S %Y", time.gmtime(now))
    return {kind: ["%s %s #%d" % (stamp, kind, k + 1) for k in range(int(injected.get(kind, 0)))]
            for kind in PCI_EVENT_KINDS}


def _ras_count(gpu):
    """``ras_count`` as the capture shows it (two objects, empty); an injected count names a block."""
    ras = gpu.get("ras") or {}
    out = {"uncorrected_error": {}, "corrected_error": {}}
    for kind in ("uncorrected", "corrected"):
        if ras.get(kind):
            out[kind + "_error"] = {"MCCTL0": str(int(ras[kind]))}
    return out


def _mxlk_links(state, gpu):
    """``mxlk_aer_count`` (the simulator's form; no real capture): one entry per MetaXLink peer."""
    row = state["links"][gpu["index"]]
    peers = [i for i, link in enumerate(row) if link == "MX"]
    injected = gpu.get("mxlk_aer") or {}
    out = {}
    for link in range(len(peers)):
        counts = injected.get(str(link)) or {}
        out[str(link)] = {"ce": str(int(counts.get("ce", 0))), "ue": str(int(counts.get("ue", 0)))}
    return out


def _table_legacy(state):
    gpus = _visible(state)
    out = ["mx-smi  version: %s" % state["mx_smi_version"], "",
           "=================== MetaX System Management Interface Log ===================",
           "Timestamp                                         : %s" % time.strftime("%a %b %d %H:%M:%S %Y"),
           "", "Attached GPUs                                     : %d" % len(gpus)]
    sep = "+------------------------------------+---------------------+----------------------+"
    out.append("+---------------------------------------------------------------------------------+")
    versions = ("MX-SMI %s" % state["mx_smi_version"], "Kernel Mode Driver Version: %s" % state["driver_version"])
    out.append("| %-35s %-43s |" % versions)
    out.append("| %-35s %-43s |" % ("MACA Version: %s" % state["maca_version"], "BIOS Version: %s" % BIOS_VERSION))
    out.append("|------------------------------------+---------------------+----------------------|")
    out.append("| GPU         NAME                   | Bus-id              | GPU-Util             |")
    out.append("| Temp        Pwr:Usage/Cap          | Memory-Usage        | GPU-State            |")
    out.append("|====================================+=====================+======================|")
    loads, now = _loads(), _now()
    for pos, gpu in enumerate(gpus):
        name = "MX" + gpu["product"]
        status = "Unavailable" if gpu["failed"] else "Available"
        r = _gpu_readings(state, gpu, loads, now)
        out.append("| %-11d %-22s | %-19s | %-20s |" % (pos, name, gpu["bdf"], "%d%%" % round(r["util"] * 100)))
        memory = "%d/%d MiB" % (r["memory_used"], gpu["memory_mib"])
        power = "%dW / %dW" % (r["power"], r["cap"])
        out.append("| %-11s %-22s | %-19s | %-20s |" % ("%dC" % r["temp"], power, memory, status))
        out.append(sep)
    out.append("")
    out.append("End of Log")
    return "\n".join(out)


def _list(state):
    # the real form (samples/mx-smi/list-2.2.9-MXC500-excerpt.txt): chip name,
    # PCI address, state and UUID; no serial number. An unavailable GPU prints
    # its reason and no UUID, as the samples' README records. Both layouts
    # print it: the nvidia-smi shape printed here before was never real.
    out = ["mx-smi  version: %s" % state["mx_smi_version"]]
    for pos, gpu in enumerate(_visible(state)):
        head = "%-9s%-12s%-15s" % ("GPU#%d" % pos, "MX" + gpu["product"], gpu["bdf"])
        if gpu["failed"]:
            out.append(head + "Not Available(GPU is unavailable)")
        else:
            out.append(head + "Available (UUID: %s)" % gpu["uuid"])
    return "\n".join(out)


def _topo(state):
    return _topo_real(state) if _layout(state) == "real" else _topo_legacy(state)


def _topo_real(state):
    """``topo -m`` as 2.2.9 prints it (samples/mx-smi/topo-m-2.2.9-8xC500.txt): affinity columns, legend."""
    gpus = _visible(state)
    out = ["mx-smi  version: %s" % state["mx_smi_version"], "", BANNER,
           "Timestamp                                         : %s" % time.strftime("%a %b %d %H:%M:%S %Y",
                                                                                    time.gmtime(_now())),
           "", "Attached GPUs                                     : %d" % len(gpus), "Device link type matrix",
           "        " + "".join("GPU%-5d" % i for i in range(len(gpus))) + "Node Affinity  CPU Affinity"]
    for i, a in enumerate(gpus):
        cells = ["X" if i == j else state["links"][a["index"]][b["index"]] for j, b in enumerate(gpus)]
        numa = a["numa_node"]
        # two hardware threads per core, as the capture's 0-31,64-95
        cpus = "%d-%d,%d-%d" % (numa * 32, numa * 32 + 31, 64 + numa * 32, 64 + numa * 32 + 31)
        out.append("GPU%-5d" % i + "".join("%-8s" % c for c in cells) + "%-15s%s" % (numa, cpus))
    out += ["", "Legend:"] + ["  %-4s = %s" % item for item in LEGEND]
    return "\n".join(out)


def _topo_legacy(state):
    gpus = _visible(state)
    rows = []
    header = [""] + ["GPU%d" % i for i in range(len(gpus))] + ["CPU Affinity", "NUMA Affinity"]
    rows.append(header)
    for i, a in enumerate(gpus):
        cells = ["GPU%d" % i]
        for j, b in enumerate(gpus):
            cells.append("X" if i == j else state["links"][a["index"]][b["index"]])
        numa = a["numa_node"]
        cells.append("%d-%d" % (numa * 32, numa * 32 + 31))
        cells.append(str(numa))
        rows.append(cells)
    widths = [max(len(r[c]) for r in rows) + 2 for c in range(len(header))]
    lines = ["".join(cell.ljust(widths[c]) for c, cell in enumerate(r)).rstrip() for r in rows]
    lines += ["", "Legend:", ""]
    lines += ["  %-4s = %s" % item for item in LEGEND]
    return "\n".join(lines)


ECC_KEYS = (("SRAM Correctable", "sram_correctable"), ("SRAM Uncorrectable", "sram_uncorrectable"),
            ("DRAM Correctable", "dram_correctable"), ("DRAM Uncorrectable", "dram_uncorrectable"))


def _count_ecc(state):
    """``mx-smi --count-ecc`` as 2.2.12 prints it (samples/mx-smi/count-ecc-2.2.12-1xC500.txt)."""
    gpus = _visible(state)
    out = ["mx-smi  version: %s" % state["mx_smi_version"], "", BANNER,
           "Timestamp                                         : %s" % time.strftime("%a %b %d %H:%M:%S %Y",
                                                                                    time.gmtime(_now())),
           "", "Attached GPUs                                     : %d" % len(gpus)]
    for pos, gpu in enumerate(gpus):
        counts = gpu.get("ecc") or {}
        out.append("GPU#%d  MX%s  %s" % (pos, gpu["product"], gpu["bdf"]))
        out.append("    ECC Errors")
        out += ["        %-42s: %d " % (label, counts.get(key, 0)) for label, key in ECC_KEYS]
        out += ["    Retired Pages", "        %-42s: %d " % ("Double Bit ECC", counts.get("retired_dbe", 0))]
    out += ["", "End of Log"]
    return "\n".join(out)


def main(argv):
    try:
        state = _state()
    except (OSError, ValueError) as exc:
        sys.stderr.write("mx-smi: cannot read device state: %s\n" % exc)
        return 2
    if not state["driver_loaded"]:
        sys.stderr.write("mx-smi: failed to initialize MetaX management library: driver not loaded\n")
        return 9
    args = [a for a in argv if a]
    if not args:
        sys.stdout.write(_table(state) + "\n")
    elif args[0] in ("-L", "--list"):
        sys.stdout.write(_list(state) + "\n")
    elif args[0] == "topo" and args[1:2] in (["-m"], ["--matrix"]):
        sys.stdout.write(_topo(state) + "\n")
    elif args[0] in ("-j", "--json"):
        if _version_tuple(state["mx_smi_version"]) < JSON_SINCE:
            sys.stderr.write("mx-smi: unrecognized option '%s'\n" % args[0])
            return 2
        sys.stdout.write(_json(state) + "\n")
    elif args[0] == "--count-ecc":
        if _version_tuple(state["mx_smi_version"]) < JSON_SINCE:
            sys.stderr.write("mx-smi: unrecognized option '%s'\n" % args[0])
            return 2
        sys.stdout.write(_count_ecc(state) + "\n")
    elif args[0] in ("-v", "--version"):
        sys.stdout.write("mx-smi version: %s\n" % state["mx_smi_version"])
    else:
        sys.stderr.write("mx-smi: unsupported arguments: %s\n" % " ".join(args))
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
