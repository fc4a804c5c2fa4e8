# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""CLI: ``python -m ansible_collections.metax.gpu.plugins.module_utils.sim``.

create --preset NAME DIR     write a simulated MetaX node
fail DIR --gpu N [--mode]    a GPU falls off the bus (bus) or turns unavailable (smi)
fail DIR --gpu N --ecc-uncorrectable N | --aer-ue N | --eid N ...   a health signal (docs/health.md):
                             counters add up; the GPU stays available
recover DIR --gpu N          undo ``fail`` (counters back to zero)
unload DIR | load DIR        unload / load the kernel driver
status DIR                   print the node state as JSON
install-hook DIR             (re)install the kernel hook (roots made before it existed)
install-mx-smi DIR           (re)install usr/bin/mx-smi (roots made before it changed, e.g. the real -L form)
driver-tools DIR [--kind K]  add fake dpkg/rpm + modprobe (sim.pkgtool); --remove undoes it
make-package DIR --kind K --version V [--broken] [--driver-version D]   write a simulated driver package
make-payload DIR --version V [--driver-version D] [--layout L ...]   a driver payload (prebuilt: MetaX's layout)
set-mx-smi-layout DIR real|legacy   what mx-smi prints (real: MetaX's layout, the default)
set-mx-smi-version DIR VERSION      what mx-smi says it is (before 2.2.12: no -j)
workload DIR --bdf BDF --utilization U [--processes N] | --clear   a workload on a GPU or VF
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import List, Optional

from ..host import HostRoot
from . import generator
from . import signals as sim_signals
from .kernel import install_hook
from .pkgtool import LAYOUTS, install_tools, make_package, make_payload, remove_tools
from .spec import PRESETS, preset


# sim fail's signal options: (flag, counter group, counter)
SIGNAL_FLAGS = (
    ("--ecc-uncorrectable", "ecc", "dram_uncorrectable"), ("--ecc-correctable", "ecc", "dram_correctable"),
    ("--sram-uncorrectable", "ecc", "sram_uncorrectable"), ("--sram-correctable", "ecc", "sram_correctable"),
    ("--retired-pages", "ecc", "retired_dbe"),
    ("--aer-ue", "pci_events", "aer_ue"), ("--aer-ce", "pci_events", "aer_ce"),
    ("--pci-synfld", "pci_events", "synfld"), ("--pci-dbe", "pci_events", "dbe"), ("--pci-mmio", "pci_events", "mmio"),
    ("--ras-uncorrected", "ras", "uncorrected"), ("--ras-corrected", "ras", "corrected"),
)


def _signal_options(cmd: argparse.ArgumentParser) -> None:
    for flag, group, counter in SIGNAL_FLAGS:
        cmd.add_argument(flag, type=int, default=None, metavar="N", help="add N to %s %s" % (group, counter))
    cmd.add_argument("--mxlk-aer", action="append", default=[], metavar="LINK:ce|ue=N",
                     help="add N to MetaXLink link LINK's AER count (repeat)")
    cmd.add_argument("--eid", type=int, action="append", default=[], metavar="N",
                     help="append an EID line for the GPU to the kernel log (repeat)")
    cmd.add_argument("--sdk", action="store_true", help="--eid lines are the SDK's, not the driver's")


def _mxlk(specs: List[str]) -> dict:
    out: dict = {}
    for spec in specs:
        try:
            link, rest = spec.split(":", 1)
            kind, count = rest.split("=", 1)
            out.setdefault(link, {})[kind] = out.get(link, {}).get(kind, 0) + int(count)
        except ValueError:
            raise generator.SimError("--mxlk-aer %r: expected LINK:ce=N or LINK:ue=N" % spec)
    return out


def _fail(host: HostRoot, args: argparse.Namespace) -> None:
    groups: dict = {}
    for flag, group, counter in SIGNAL_FLAGS:
        value = getattr(args, flag.lstrip("-").replace("-", "_"))
        if value is not None:
            groups.setdefault(group, {})[counter] = value
    mxlk = _mxlk(args.mxlk_aer)
    signals = bool(groups or mxlk or args.eid)
    if signals:
        sim_signals.inject_signals(host, args.gpu, ecc=groups.get("ecc"), pci_events=groups.get("pci_events"),
                                   ras=groups.get("ras"), mxlk_aer=mxlk)
        for eid in args.eid:
            sys.stdout.write(sim_signals.add_eid(host, args.gpu, eid, sdk=args.sdk))
    if args.mode is not None or not signals:
        generator.fail_gpu(host, args.gpu, args.mode or "bus")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="metax-sim", description="Simulated MetaX GPU node")
    sub = parser.add_subparsers(dest="command", required=True)
    create = sub.add_parser("create", help="create a simulated node root")
    create.add_argument("--preset", default="8xC500", choices=sorted(PRESETS))
    create.add_argument("--force", action="store_true", help="replace an existing simulated root")
    create.add_argument("root")
    for name in ("fail", "recover"):
        cmd = sub.add_parser(name, help="%s one GPU" % name)
        cmd.add_argument("root")
        cmd.add_argument("--gpu", type=int, required=True, help="GPU index as created (PCI order)")
        if name == "fail":
            cmd.add_argument("--mode", choices=("bus", "smi"), default=None,
                             help="bus (the default without a signal option) or smi (state Not Available)")
            _signal_options(cmd)
    sub.add_parser("install-hook", help="(re)install .metax-sim/kernel").add_argument("root")
    sub.add_parser("install-mx-smi", help="(re)install usr/bin/mx-smi from this simulator").add_argument("root")
    for name in ("load", "unload", "status"):
        sub.add_parser(name, help="%s the driver" % name if name != "status" else "show state").add_argument("root")
    version = sub.add_parser("set-driver-version", help="change the installed driver version")
    version.add_argument("root")
    version.add_argument("version")
    tools = sub.add_parser("driver-tools", help="fake package tools and modprobe (driver tests)")
    tools.add_argument("root")
    tools.add_argument("--kind", choices=("deb", "rpm"), default="deb")
    tools.add_argument("--remove", action="store_true")
    package = sub.add_parser("make-package", help="write a simulated driver package")
    package.add_argument("directory")
    package.add_argument("--kind", choices=("deb", "rpm", "run"), required=True)
    package.add_argument("--version", required=True)
    package.add_argument("--broken", action="store_true", help="loads but probes no GPU")
    package.add_argument("--driver-version", help="the kernel driver it installs, when not --version")
    whole = sub.add_parser("make-payload", help="write a simulated driver payload (the payload image's /payload)")
    whole.add_argument("directory")
    whole.add_argument("--version", required=True)
    whole.add_argument("--driver-version", help="the kernel driver it declares, when not --version")
    whole.add_argument("--layout", action="append", choices=LAYOUTS, help="repeat; default deb, rpm and run")
    layout = sub.add_parser("set-mx-smi-layout", help="choose what mx-smi prints")
    layout.add_argument("root")
    layout.add_argument("layout", choices=generator.MX_SMI_LAYOUTS)
    smi_version = sub.add_parser("set-mx-smi-version", help="change mx-smi's version")
    smi_version.add_argument("root")
    smi_version.add_argument("version")
    load = sub.add_parser("workload", help="put a workload on a GPU or VF (what mx-smi reports)")
    load.add_argument("root")
    load.add_argument("--bdf", help="PCI address of the PF or VF")
    load.add_argument("--utilization", type=float, default=0.7, help="0-1; 0 removes the load")
    load.add_argument("--processes", type=int, default=None, help="processes mx-smi lists (default 1)")
    load.add_argument("--clear", action="store_true", help="remove every load")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "create":
            host = generator.create(args.root, preset(args.preset), force=args.force)
            state = generator.load_state(host)
            sys.stdout.write("created %s: %d GPUs (%s), driver %s\n" % (
                host.path, len(state["gpus"]), args.preset, state["driver_version"]))
            return 0
        if args.command == "make-package":
            sys.stdout.write(make_package(args.directory, args.kind, args.version, broken=args.broken,
                                          driver_version=args.driver_version) + "\n")
            return 0
        if args.command == "make-payload":
            sys.stdout.write(make_payload(args.directory, args.version, args.driver_version,
                                          layouts=args.layout or ("deb", "rpm", "run")) + "\n")
            return 0
        if args.command == "driver-tools":
            if args.remove:
                remove_tools(args.root)
            else:
                install_tools(args.root, args.kind)
            return 0
        host = HostRoot(args.root)
        if args.command == "install-hook":
            generator.load_state(host)      # refuses a directory that is not a simulated node
            sys.stdout.write("installed %s\n" % install_hook(host.path))
            return 0
        if args.command == "install-mx-smi":
            sys.stdout.write("installed %s\n" % generator.reinstall_mx_smi(host))
            return 0
        if args.command == "fail":
            _fail(host, args)
        elif args.command == "recover":
            generator.recover_gpu(host, args.gpu)
        elif args.command == "load":
            generator.load_driver(host)
        elif args.command == "unload":
            generator.unload_driver(host)
        elif args.command == "set-driver-version":
            generator.set_driver_version(host, args.version)
        elif args.command == "set-mx-smi-layout":
            generator.set_mx_smi_layout(host, args.layout)
        elif args.command == "set-mx-smi-version":
            generator.set_mx_smi_version(host, args.version)
        elif args.command == "workload":
            if args.clear:
                generator.clear_load(host)
            elif not args.bdf:
                raise generator.SimError("workload needs --bdf BDF (or --clear)")
            else:
                generator.set_load(host, args.bdf, args.utilization, args.processes)
        else:
            state = generator.load_state(host)
            json.dump({"driver_loaded": state["driver_loaded"], "driver_version": state["driver_version"],
                       "gpus": [dict({k: g[k] for k in ("index", "bdf", "product", "failed", "numvfs")},
                                     **{k: g[k] for k in sim_signals.SIGNAL_KEYS if g.get(k)})
                                for g in state["gpus"]]}, sys.stdout, indent=2)
            sys.stdout.write("\n")
        return 0
    except (generator.SimError, ValueError, OSError) as exc:
        sys.stderr.write("metax-sim: error: %s\n" % exc)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
