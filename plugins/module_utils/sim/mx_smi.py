# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The ``mx-smi`` of a simulated node (copied to ``usr/bin/mx-smi``).

Standalone (standard library only, Python 3.6+): it runs wherever the
simulated root is mounted, including inside agent containers, and finds the
node state relative to its own location. Output follows the MetaX tool:
the device table, ``-L`` (one line per GPU with UUID) and ``topo -m``.

Two layouts (``mx_smi_layout`` in the node state):

``real`` (default)  what MetaX machines print (the samples in
                    tests/unit/gpu/fixtures/mx-smi/): two rows of four
                    irregular-width cells per GPU, ``MetaX C500`` board
                    names, ``topo -m`` without CPU/NUMA affinity columns.
``legacy``          the layout this simulator printed before the real one
                    was known (``MXC500``, aligned cells, affinity columns);
                    kept so the parsers' tolerance stays tested.
"""

import json
import os
import sys
import time

LEGEND = [
    ("X", "Self"),
    ("MX", "Connection traversing MetaXLink"),
    ("SYS", "Connection traversing PCIe as well as the SMP interconnect between NUMA nodes"),
    ("NODE", "Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node"),
    ("PHB", "Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)"),
    ("PXB", "Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)"),
    ("PIX", "Connection traversing at most a single PCIe bridge"),
]


def _root():
    here = os.path.dirname(os.path.realpath(os.path.abspath(__file__)))
    return os.path.dirname(os.path.dirname(here))  # <root>/usr/bin/mx-smi


def _state():
    with open(os.path.join(_root(), ".metax-sim", "state.json")) as handle:
        return json.load(handle)


def _visible(state):
    return [g for g in state["gpus"] if g["failed"] != "bus"]


LAYOUTS = ("real", "legacy")
BANNER = "=================== MetaX System Management Interface Log ==================="


def _layout(state):
    return state.get("mx_smi_layout", "real")


def _table(state):
    return _table_real(state) if _layout(state) == "real" else _table_legacy(state)


def _table_real(state):
    gpus = _visible(state)
    rule = "+-------------------------+-----------------+---------------------+----------------------+"
    out = ["mx-smi  version: %s" % state["mx_smi_version"],
           "Kernel Mode Driver Version: %s" % state["driver_version"],
           "MACA Version: %s" % state["maca_version"], "",
           BANNER,
           "Attached GPUs                                     : %d" % len(gpus),
           rule,
           "| Board Name   | GPU Persist-M | Bus-id              | GPU-Util      sGPU-M |",
           "| Pwr:Usage/Cap| Temp   Perf  | Memory-Usage        | GPU-State            |",
           "|-------------------------+-----------------+---------------------+----------------------|"]
    for pos, gpu in enumerate(gpus):
        status = "Unavailable" if gpu["failed"] else "Available"
        out.append("| %d  MetaX %s | %d  Off | %s | 0%%  Disabled |" % (pos, gpu["product"], pos, gpu["bdf"]))
        out.append("| 57W / 350W   | 35C  P0  | 826/%d MiB | %-20s |" % (gpu["memory_mib"], status))
        out.append(rule)
    out += ["", "+---------------------------------------------------------------------------------+",
            "| Process:                                                                        |",
            "|  GPU                    PID         Process Name                 GPU Memory     |",
            "|                                                                  Usage(MiB)     |",
            "|=================================================================================|",
            "|  no process found                                                               |",
            "+---------------------------------------------------------------------------------+",
            "", "End of Log"]
    return "\n".join(out)


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
    out.append("| %-35s %-43s |" % ("MACA Version: %s" % state["maca_version"], "BIOS Version: 1.22.3.0"))
    out.append("|------------------------------------+---------------------+----------------------|")
    out.append("| GPU         NAME                   | Bus-id              | GPU-Util             |")
    out.append("| Temp        Pwr:Usage/Cap          | Memory-Usage        | GPU-State            |")
    out.append("|====================================+=====================+======================|")
    for pos, gpu in enumerate(gpus):
        name = "MX" + gpu["product"]
        status = "Unavailable" if gpu["failed"] else "Available"
        out.append("| %-11d %-22s | %-19s | %-20s |" % (pos, name, gpu["bdf"], "0%"))
        memory = "858/%d MiB" % gpu["memory_mib"]
        out.append("| %-11s %-22s | %-19s | %-20s |" % ("36C", "52W / 350W", memory, status))
        out.append(sep)
    out.append("")
    out.append("End of Log")
    return "\n".join(out)


def _list(state):
    prefix = "MetaX " if _layout(state) == "real" else "MX"
    return "\n".join("GPU %d: %s%s (UUID: %s, SN: %s)" % (pos, prefix, g["product"], g["uuid"], g["serial"])
                     for pos, g in enumerate(_visible(state)))


def _topo(state):
    return _topo_real(state) if _layout(state) == "real" else _topo_legacy(state)


def _topo_real(state):
    gpus = _visible(state)
    out = [BANNER, "Attached GPUs                                     : %d" % len(gpus),
           "        " + "".join("GPU%-5d" % i for i in range(len(gpus))).rstrip()]
    for i, a in enumerate(gpus):
        cells = ["X" if i == j else state["links"][a["index"]][b["index"]] for j, b in enumerate(gpus)]
        out.append(("GPU%-5d" % i + "".join("%-8s" % c for c in cells)).rstrip())
    out.append("Legend:")
    out += ["%-4s = %s" % item for item in LEGEND]
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
    elif args[0] in ("-v", "--version"):
        sys.stdout.write("mx-smi version: %s\n" % state["mx_smi_version"])
    else:
        sys.stderr.write("mx-smi: unsupported arguments: %s\n" % " ".join(args))
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
