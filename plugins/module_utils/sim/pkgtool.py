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
* a vendor ``.run`` package is an executable script that calls back here;
* a prebuilt payload (MetaX's driver image, :func:`make_prebuilt`): a tree
  whose ``lib/modules/<release>/extra/metax/metax.ko`` the driver module
  copies onto the node, then runs ``depmod``, which makes it what the next
  ``modprobe metax`` loads.

A simulated package file (:func:`make_package`) or module carries a JSON
manifest line (name, version, kind, ``broken``, ``driver_version``: the
kernel driver it installs, which MetaX's payloads number apart from their
own version). A broken driver loads, but creates no ``/dev/mxcd`` and binds
no GPU: what a driver built for the wrong kernel looks like, and what the
upgrade playbook's validation must catch. :func:`make_payload` writes a whole
driver payload (the payload image's ``/payload``) in any of the layouts.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Dict, List, Optional, Sequence

from ..driver.package import DECLARATION_SUFFIX, PREBUILT, format_declaration
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
    "depmod": "usr/sbin/depmod",
    "modinfo": "usr/sbin/modinfo",
}
# The kernel release a simulated node reports (proc/sys/kernel/osrelease), written by install_tools
# when the root has none; a simulated prebuilt payload carries modules for it and for this machine's.
SIM_KERNEL_RELEASE = "5.15.0-105-generic"
KERNEL_RELEASE = "proc/sys/kernel/osrelease"
LAYOUTS = ("deb", "rpm", "run", PREBUILT)
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
    for tool in KIND_TOOLS[kind] + ("modprobe", "depmod", "modinfo"):
        _write_tool(host, TOOL_PATHS[tool], tool)
        written.append(TOOL_PATHS[tool])
    _write_tool(host, TOOL_HOOK, "run")
    if not host.exists(KERNEL_RELEASE):
        os.makedirs(os.path.dirname(host.join(KERNEL_RELEASE)), exist_ok=True)
        host.write_file_atomic(KERNEL_RELEASE, (SIM_KERNEL_RELEASE + "\n").encode())
        state["kernel_release_written"] = True
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
    if state.pop("kernel_release_written", False) and os.path.lexists(host.join(KERNEL_RELEASE)):
        os.unlink(host.join(KERNEL_RELEASE))
        for rel in ("proc/sys/kernel", "proc/sys", "proc"):     # the directories only it needed
            if os.path.isdir(host.join(rel)) and not os.listdir(host.join(rel)):
                os.rmdir(host.join(rel))
    generator.save_state(host, state)


def _manifest(name: str, version: str, kind: str, broken: bool, driver_version: Optional[str]) -> str:
    return json.dumps({"name": name, "version": version, "kind": kind, "broken": broken,
                       "driver_version": driver_version or version}, sort_keys=True)


def make_package(directory: str, kind: str, version: str, name: str = DEFAULT_PACKAGE,
                 broken: bool = False, driver_version: Optional[str] = None) -> str:
    """Write a simulated driver package file; returns its path.

    File names follow each format's convention, which the driver module parses:
    ``name_version_amd64.deb``, ``name-version-1.x86_64.rpm``,
    ``name-version-x86_64.run``. ``driver_version``: the kernel driver it
    installs (what ``sys/module/metax/version`` says once loaded), when it is
    not ``version`` (MetaX's payload 2.29.0.13 installs 2.12.13).
    """
    manifest = _manifest(name, version, kind, broken, driver_version)
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


def make_declaration(directory: str, version: str, driver_version: Optional[str] = None,
                     name: str = DEFAULT_PACKAGE, per_version: bool = False) -> str:
    """Write a payload's declaration (``name.version``; ``name-<version>.version`` with ``per_version``,
    for a directory that holds several payloads' packages); returns its path."""
    filename = "%s-%s%s" % (name, version, DECLARATION_SUFFIX) if per_version else name + DECLARATION_SUFFIX
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, filename)
    with open(path, "w") as handle:
        handle.write(format_declaration(version, driver_version))
    return path


def make_prebuilt(directory: str, version: str, driver_version: Optional[str] = None,
                  kernels: Optional[List[str]] = None, name: str = DEFAULT_PACKAGE, broken: bool = False,
                  mx_smi: bool = True) -> str:
    """Write a prebuilt payload tree, as MetaX's driver image ships it; returns ``directory``.

    ``lib/modules/<release>/extra/metax/metax.ko`` for each of ``kernels``
    (default: the simulated node's release and this machine's), ``usr/bin/mx-smi``
    (the simulator's), and the declaration ``name.version``.
    """
    releases = list(kernels) if kernels is not None else sorted({SIM_KERNEL_RELEASE, os.uname().release})
    manifest = _manifest(name, version, PREBUILT, broken, driver_version)
    for release in releases:
        module_dir = os.path.join(directory, "lib", "modules", release, "extra", "metax")
        os.makedirs(module_dir, exist_ok=True)
        with open(os.path.join(module_dir, "metax.ko"), "w") as handle:
            handle.write("%s%s\n" % (MANIFEST_MARK, manifest))
    if mx_smi:
        source = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mx_smi.py")
        os.makedirs(os.path.join(directory, "usr", "bin"), exist_ok=True)
        target = os.path.join(directory, "usr", "bin", "mx-smi")
        with open(source) as src, open(target, "w") as handle:
            handle.write("#!/usr/bin/env python3\n" + src.read())
        os.chmod(target, 0o755)
    make_declaration(directory, version, driver_version, name)
    return directory


def make_payload(root: str, version: str, driver_version: Optional[str] = None,
                 layouts: Sequence[str] = ("deb", "rpm", "run"), broken: Sequence[str] = (),
                 name: str = DEFAULT_PACKAGE) -> str:
    """Write a driver payload (the payload image's ``/payload``) in ``layouts``; returns ``root``.

    Packages go to ``root/<kind>/``; ``prebuilt`` makes ``root`` itself the
    tree (``lib/modules``, ``usr/bin/mx-smi``). The declaration ``name.version``
    at ``root`` says the kernel driver every layout installs (written whenever
    ``driver_version`` is given or a prebuilt tree needs it). ``broken``: the
    layouts whose driver loads but never comes up.
    """
    unknown = [kind for kind in layouts if kind not in LAYOUTS]
    if unknown:
        raise generator.SimError("payload layout(s) %s: expected %s" % (", ".join(unknown), ", ".join(LAYOUTS)))
    for kind in layouts:
        if kind == PREBUILT:
            make_prebuilt(root, version, driver_version, name=name, broken=kind in broken)
        else:
            make_package(os.path.join(root, kind), kind, version, name=name, broken=kind in broken,
                         driver_version=driver_version)
    if driver_version:
        make_declaration(root, version, driver_version, name)
    return root


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
    driver = manifest.get("driver_version") or manifest["version"]
    db = _load_db(host)
    db[manifest["name"]] = {"version": manifest["version"], "kind": kind, "broken": manifest["broken"],
                            "driver_version": driver}
    _save_db(host, db)
    state = generator.load_state(host)
    state["disk_driver"] = {"version": driver, "broken": manifest["broken"]}
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


def _depmod(host: HostRoot, args: List[str]) -> int:
    """What the next ``modprobe metax`` loads: a metax.ko under ``lib/modules/<release>`` (the release
    given, else the node's), else the installed package's module, else none."""
    releases = [a for a in args if not a.startswith("-")]
    release = releases[0] if releases else (host.read_attribute(KERNEL_RELEASE, default="")
                                            if host.exists(KERNEL_RELEASE) else "") or os.uname().release
    module = None
    base = host.join("lib/modules/" + release)
    for dirpath, _dirs, files in os.walk(base):
        for name in sorted(files):
            if name.startswith("metax.ko"):
                module = read_manifest(os.path.join(dirpath, name))
                if module is not None:
                    break
        if module is not None:
            break
    state = generator.load_state(host)
    if module is not None:
        state["disk_driver"] = {"version": module.get("driver_version") or module["version"],
                                "broken": bool(module.get("broken"))}
    else:
        entry = _load_db(host).get(DEFAULT_PACKAGE)
        state["disk_driver"] = {"version": entry.get("driver_version") or entry["version"],
                                "broken": bool(entry.get("broken"))} if entry else None
    generator.save_state(host, state)
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
        if tool == "depmod":
            return _depmod(host, argv)
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
