# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""A simulated node's package tools and module loader (dpkg, rpm, modprobe).

The driver module installs a driver "with the node's own package tool" and
loads it with ``modprobe metax``. On a simulated root those tools are small
executables this file writes into the root (:func:`install_tools`); the
driver module finds them under the root exactly as it finds ``/usr/bin/dpkg``
on a real node, runs them as separate processes, and never imports this file.

What they emulate, as the driver module depends on it:

* a package database (``.metax-sim/pkgdb.json``): ``dpkg -i|-r|--purge``,
  ``dpkg-query -W -f FMT``, ``rpm -U|-i|-e``, ``rpm -q --qf FMT``;
* the module on disk versus the module loaded: installing a package changes
  what the next ``modprobe metax`` loads, not the running driver;
  ``modprobe -r metax`` refuses while ``refcnt`` > 0, as the kernel does;
* a vendor ``.run`` package is an executable script that calls back here.

A simulated package file (:func:`make_package`) carries a JSON manifest line
(name, version, kind, ``broken``). A broken driver loads, but creates no
``/dev/mxcd`` and binds no GPU: what a driver built for the wrong kernel
looks like, and what the upgrade playbook's validation must catch.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Dict, List, Optional

from ..host import SIM_STATE_DIR, HostRoot
from . import generator

PKGDB_FILE = SIM_STATE_DIR + "/pkgdb.json"
TOOL_HOOK = SIM_STATE_DIR + "/pkgtool"
MANIFEST_MARK = "# METAX-SIM-PACKAGE "
DEFAULT_PACKAGE = "metax-driver"

# tool name -> where a real node has it
TOOL_PATHS = {
    "dpkg": "usr/bin/dpkg",
    "dpkg-query": "usr/bin/dpkg-query",
    "rpm": "usr/bin/rpm",
    "modprobe": "usr/sbin/modprobe",
    "modinfo": "usr/sbin/modinfo",
}
# The simulated metax module's parameters, as ``modinfo -p metax`` lists them. The simulator's own
# list (what the tests use), not the vendor driver's: driver-manager checks driver-config against
# whatever the node's module says.
MODULE_PARAMS = (
    ("vf_mode", "SR-IOV mode of the physical functions (int)"),
    ("dbg", "Debug message level (int)"),
)
KIND_TOOLS = {"deb": ("dpkg", "dpkg-query"), "rpm": ("rpm",)}

TOOL_TEMPLATE = """#!/usr/bin/env python3
# Simulated %(tool)s of a metax.gpu simulated node (written by sim.pkgtool).
import os
import sys

sys.path.insert(0, %(collections)r)
from ansible_collections.metax.gpu.plugins.module_utils.sim.pkgtool import main

root = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), %(up)r))
sys.exit(main(%(tool)r, sys.argv[1:], os.environ.get("METAX_HOST_ROOT") or root))
"""


def _write_tool(host: HostRoot, rel: str, tool: str) -> None:
    from .kernel import _collections_dir  # the same lookup the kernel hook uses

    target = host.join(rel)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    tmp = os.path.join(os.path.dirname(target), ".metax-tmp-" + tool)
    up = "/".join([".."] * rel.count("/"))
    with open(tmp, "w") as handle:
        handle.write(TOOL_TEMPLATE % {"tool": tool, "collections": _collections_dir(), "up": up})
    os.chmod(tmp, 0o755)
    os.replace(tmp, target)


def install_tools(root: str, kind: str = "deb", package: str = DEFAULT_PACKAGE) -> List[str]:
    """Write the package tools of ``kind`` (deb|rpm) and modprobe into a simulated root.

    Seeds the package database with the driver the node already runs, so the
    node looks like one whose driver was installed from a ``kind`` package.
    Returns the paths written (relative to the root).
    """
    if kind not in KIND_TOOLS:
        raise generator.SimError("package kind %r: expected deb or rpm" % kind)
    host = HostRoot(root)
    state = generator.load_state(host)
    written = []
    for tool in KIND_TOOLS[kind] + ("modprobe", "modinfo"):
        _write_tool(host, TOOL_PATHS[tool], tool)
        written.append(TOOL_PATHS[tool])
    _write_tool(host, TOOL_HOOK, "run")
    db = {package: {"version": state["driver_version"], "kind": kind, "broken": False}}
    _save_db(host, db)
    state["disk_driver"] = {"version": state["driver_version"], "broken": False}
    generator.save_state(host, state)
    return written


def remove_tools(root: str) -> None:
    """Undo :func:`install_tools` (the cluster tests leave roots as they found them)."""
    host = HostRoot(root)
    for rel in list(TOOL_PATHS.values()) + [PKGDB_FILE, TOOL_HOOK]:
        if os.path.lexists(host.join(rel)):
            os.unlink(host.join(rel))
    for rel in sorted({os.path.dirname(r) for r in TOOL_PATHS.values()}):
        if os.path.isdir(host.join(rel)) and not os.listdir(host.join(rel)):
            os.rmdir(host.join(rel))        # a directory only the tools needed (usr/sbin)
    state = generator.load_state(host)
    state.pop("disk_driver", None)
    generator.save_state(host, state)


def make_package(directory: str, kind: str, version: str, name: str = DEFAULT_PACKAGE,
                 broken: bool = False) -> str:
    """Write a simulated driver package file; returns its path.

    File names follow each format's convention, which the driver module parses:
    ``name_version_amd64.deb``, ``name-version-1.x86_64.rpm``,
    ``name-version-x86_64.run``.
    """
    manifest = json.dumps({"name": name, "version": version, "kind": kind, "broken": broken},
                          sort_keys=True)
    if kind == "deb":
        filename = "%s_%s_amd64.deb" % (name, version)
    elif kind == "rpm":
        filename = "%s-%s-1.x86_64.rpm" % (name, version)
    elif kind == "run":
        filename = "%s-%s-x86_64.run" % (name, version)
    else:
        raise generator.SimError("package kind %r: expected deb, rpm or run" % kind)
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, filename)
    with open(path, "w") as handle:
        if kind == "run":
            handle.write("#!/bin/sh\n%s%s\nexec \"$METAX_HOST_ROOT/%s\" \"$0\" \"$@\"\n"
                         % (MANIFEST_MARK, manifest, TOOL_HOOK))
        else:
            handle.write("%s%s\n" % (MANIFEST_MARK, manifest))
    if kind == "run":
        os.chmod(path, 0o755)
    return path


# -- the tools ----------------------------------------------------------------
def _load_db(host: HostRoot) -> Dict[str, dict]:
    path = host.join(PKGDB_FILE)
    if not os.path.isfile(path):
        return {}
    with open(path) as handle:
        return json.load(handle)


def _save_db(host: HostRoot, db: Dict[str, dict]) -> None:
    host.write_file_atomic(PKGDB_FILE, json.dumps(db, indent=1, sort_keys=True).encode())


def read_manifest(path: str) -> Optional[dict]:
    try:
        with open(path) as handle:
            for line in handle:
                if line.startswith(MANIFEST_MARK):
                    return json.loads(line[len(MANIFEST_MARK):])
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return None


def _node_file(host: HostRoot, path: str) -> str:
    """A path given to a tool: as the node sees it, or already local to this machine."""
    if os.path.isfile(path) and (path.startswith(host.path.rstrip("/") + "/") or not path.startswith("/")):
        return path
    local = host.join(path.lstrip("/"))
    return local if os.path.isfile(local) else path


def _install(host: HostRoot, path: str, kind: str) -> int:
    manifest = read_manifest(_node_file(host, path))
    if manifest is None:
        sys.stderr.write("%s: %s is not a %s package\n" % (kind, path, kind))
        return 2
    if manifest["kind"] != kind:
        sys.stderr.write("%s: %s is a %s package, not %s\n" % (kind, path, manifest["kind"], kind))
        return 2
    db = _load_db(host)
    db[manifest["name"]] = {"version": manifest["version"], "kind": kind, "broken": manifest["broken"]}
    _save_db(host, db)
    state = generator.load_state(host)
    state["disk_driver"] = {"version": manifest["version"], "broken": manifest["broken"]}
    generator.save_state(host, state)
    return 0


def _remove(host: HostRoot, name: str, kind: str) -> int:
    db = _load_db(host)
    if name not in db:
        sys.stderr.write("%s: package %s is not installed\n" % (kind, name))
        return 1
    del db[name]
    _save_db(host, db)
    state = generator.load_state(host)
    state["disk_driver"] = None
    generator.save_state(host, state)
    return 0


def _query(host: HostRoot, name: str, fmt: str, kind: str) -> int:
    entry = _load_db(host).get(name)
    if entry is None or entry["kind"] != kind:
        if kind == "deb":
            sys.stderr.write("dpkg-query: no packages found matching %s\n" % name)
        else:
            sys.stdout.write("package %s is not installed\n" % name)
        return 1
    out = (fmt.replace("${Status}", "install ok installed").replace("${Version}", entry["version"])
           .replace("${Package}", name).replace("%{VERSION}", entry["version"])
           .replace("%{NAME}", name).replace("\\n", "\n").replace("\\t", "\t"))
    sys.stdout.write(out)
    return 0


def _modprobe(host: HostRoot, args: List[str]) -> int:
    remove = "-r" in args or "--remove" in args
    params = [a for a in args if "=" in a and not a.startswith("-")]
    names = [a for a in args if not a.startswith("-") and a not in params]
    if names != ["metax"]:
        sys.stderr.write("modprobe: simulated node knows only the metax module\n")
        return 1
    state = generator.load_state(host)
    if remove:
        if not state["driver_loaded"]:
            return 0
        if host.read_int("sys/module/metax/refcnt", default=0) > 0:
            sys.stderr.write("modprobe: FATAL: Module metax is in use.\n")
            return 1
        generator.unload_driver(host)
        return 0
    if state["driver_loaded"]:
        return 0
    disk = state.get("disk_driver", {"version": state["driver_version"], "broken": False})
    if disk is None:
        sys.stderr.write("modprobe: FATAL: Module metax not found in directory /lib/modules\n")
        return 1
    state["driver_version"] = disk["version"]
    generator.save_state(host, state)
    generator.load_driver(host)
    for param in params:            # the kernel shows module parameters there
        key, value = param.split("=", 1)
        os.makedirs(host.join("sys/module/metax/parameters"), exist_ok=True)
        host.write_file_atomic("sys/module/metax/parameters/" + key, (value + "\n").encode())
    if disk.get("broken"):
        # loads, but probes nothing: no control device, no GPU bound
        state = generator.load_state(host)
        for gpu in state["gpus"]:
            for sysfs_dir, card in generator._functions(gpu):  # pylint: disable=protected-access
                generator._unbind(host, sysfs_dir, card)  # pylint: disable=protected-access
        if os.path.lexists(host.join("dev/mxcd")):
            os.unlink(host.join("dev/mxcd"))
    return 0


def _modinfo(host: HostRoot, args: List[str]) -> int:
    """``modinfo -p metax``: the parameters of the module on disk (kmod's format, name:description)."""
    names = [a for a in args if not a.startswith("-")]
    if names != ["metax"] or generator.load_state(host).get("disk_driver", {"version": None}) is None:
        sys.stderr.write("modinfo: ERROR: Module %s not found.\n" % (names[0] if names else ""))
        return 1
    if "-p" in args or "--parameters" in args:
        sys.stdout.write("".join("%s:%s\n" % item for item in MODULE_PARAMS))
    return 0


def main(tool: str, argv: List[str], root: str) -> int:
    host = HostRoot(root)
    try:
        if tool == "modprobe":
            return _modprobe(host, argv)
        if tool == "modinfo":
            return _modinfo(host, argv)
        if tool == "dpkg":
            if len(argv) == 2 and argv[0] in ("-i", "--install"):
                return _install(host, argv[1], "deb")
            if len(argv) == 2 and argv[0] in ("-r", "--remove", "-P", "--purge"):
                return _remove(host, argv[1], "deb")
        elif tool == "dpkg-query":
            fmt = "${Status} ${Version}\n"
            rest = list(argv)
            if rest and rest[0] in ("-W", "--show"):
                rest = rest[1:]
                for i, arg in enumerate(rest):
                    if arg.startswith("-f=") or arg.startswith("--showformat="):
                        fmt = arg.split("=", 1)[1]
                        rest = rest[:i] + rest[i + 1:]
                        break
                    if arg in ("-f", "--showformat"):
                        fmt = rest[i + 1]
                        rest = rest[:i] + rest[i + 2:]
                        break
                if len(rest) == 1:
                    return _query(host, rest[0], fmt, "deb")
        elif tool == "rpm":
            flags = [a for a in argv if a.startswith("-")]
            args = [a for a in argv if not a.startswith("-")]
            if "-q" in flags:
                fmt = "%{VERSION}\n"
                if "--qf" in argv:
                    fmt = argv[argv.index("--qf") + 1]
                    args = [a for a in args if a != fmt]
                if len(args) == 1:
                    return _query(host, args[0], fmt, "rpm")
            elif ("-U" in flags or "-i" in flags or "-Uvh" in flags) and len(args) == 1:
                return _install(host, args[0], "rpm")
            elif "-e" in flags and len(args) == 1:
                return _remove(host, args[0], "rpm")
        elif tool == "run":
            # argv: <the .run file> [args]; ``--uninstall`` removes
            manifest = read_manifest(argv[0]) if argv else None
            if manifest is None:
                sys.stderr.write("not a simulated .run package\n")
                return 2
            if "--uninstall" in argv[1:]:
                return _remove(host, manifest["name"], "run")
            return _install(host, argv[0], "run")
    except generator.SimError as exc:
        sys.stderr.write("%s: %s\n" % (tool, exc))
        return 2
    sys.stderr.write("%s (simulated): unsupported arguments %s\n" % (tool, " ".join(argv)))
    return 2
