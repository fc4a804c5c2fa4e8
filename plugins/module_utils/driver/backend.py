# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The MetaX kernel driver on one node: observe -> plan -> apply -> verify.

Standard library only and no Ansible import: the ``metax.gpu.driver`` module
and a later in-cluster driver manager share it unchanged.

* :func:`observe` reads what is there: the loaded module's version
  (``sys/module/metax/version``), the package database of the node's own tool
  (dpkg or rpm; a ``.run`` install is recorded in :data:`RUN_RECORD`, a
  prebuilt one in :data:`PREBUILT_RECORD`), the payloads found at ``src``
  (package files, prebuilt trees, their declarations), ``/dev/mxcd``, the
  running kernel's release.
* :func:`plan` is a pure function of that observation and the request: the
  steps (unload, remove, install, load), the versions from and to (the
  payload's own, and the kernel driver it declares), or an error. Check mode
  stops here.
* :func:`apply` runs the steps through an injected runner, then
  :func:`verify` checks the loaded module against the declared kernel-driver
  version (``package.driver_matches``), ``/dev/mxcd`` and ``mx-smi``.

A payload's own version (the package database's, the file name's, the
``version`` a caller asks for) and the kernel driver it installs may differ
(MetaX's ``2.29.0.13`` installs ``2.12.13``): every install records both in
:data:`DRIVER_RECORD`, so a later run knows what the loaded module should say.

Commands: a bare name (``dpkg``, ``modprobe``) is the node's own tool. With
``host_root`` ``/`` it runs as is; on a simulated root it is the executable
the root carries (sim.pkgtool); under any other root (a node mounted at
``/host``) it runs through ``chroot``. A command whose first word is a path
runs as given: that is how tests and special nodes replace the load command.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..errors import MetaxGpuError
from ..host import HostRoot, HostRootError
from . import inuse
from .package import (DECLARATION_SUFFIX, MODULE_FILES, PREBUILT, Declaration, DriverPackageError, Package,
                      candidates, choose, declared_drivers, driver_matches, is_declaration, kind_of,
                      parse, parse_declaration, prebuilt, version_key)

STATES = ("present", "absent", "latest")
POLICIES = ("IfNotPresent", "Always", "Never")
DEFAULT_PACKAGE = "metax-driver"
DEFAULT_LOAD = ("modprobe", "metax")
DEFAULT_UNLOAD = ("modprobe", "-r", "metax")
# Where the module records a driver installed from the vendor .run (it has no package database).
RUN_RECORD = "var/lib/metax-gpu/driver-run.json"
# A driver installed from a prebuilt tree: its version and the files copied (the uninstaller's list).
PREBUILT_RECORD = "var/lib/metax-gpu/driver-prebuilt.json"
# Every install: the payload's own version and the kernel driver it declared (what the module says).
DRIVER_RECORD = "var/lib/metax-gpu/driver-payload.json"
# What a prebuilt tree's install copies from lib/modules/<release>/ (compressed modules too).
KERNEL_OBJECTS = (".ko", ".ko.xz", ".ko.zst", ".ko.gz")
# The running kernel's release (a prebuilt tree is usable only with modules for it).
KERNEL_RELEASE = "proc/sys/kernel/osrelease"
TOOL_DIRS = ("usr/bin", "bin", "usr/sbin", "sbin", "usr/local/bin", "usr/local/sbin")

Runner = Callable[[List[str]], Tuple[int, str, str]]


class DriverError(MetaxGpuError):
    """The request cannot be met (bad input, no package, wrong tool); nothing was changed."""


class DriverInUseError(DriverError):
    """The driver would be unloaded while GPUs are in use and ``force`` is off."""


class DriverCommandError(DriverError):
    """A package tool or the load command failed (the node may be half-way)."""


class DriverVerifyError(DriverError):
    """After the change the driver does not check out (version, /dev/mxcd, mx-smi)."""

    def __init__(self, message: str, checks: Dict[str, object]) -> None:
        super().__init__(message)
        self.checks = checks


@dataclass
class Request:
    state: str = "present"
    version: Optional[str] = None
    src: Optional[str] = None              # a package file or a directory of them, node path
    deploy_policy: str = "IfNotPresent"
    force: bool = False
    package_name: str = DEFAULT_PACKAGE
    load_command: Sequence[str] = DEFAULT_LOAD
    unload_command: Sequence[str] = DEFAULT_UNLOAD
    run_install_args: Sequence[str] = ()
    run_uninstall_args: Sequence[str] = ("--uninstall",)
    verify: bool = True

    def validate(self) -> None:
        if self.state not in STATES:
            raise DriverError("state %r: expected one of %s" % (self.state, ", ".join(STATES)))
        if self.deploy_policy not in POLICIES:
            raise DriverError("deploy_policy %r: expected one of %s" % (self.deploy_policy, ", ".join(POLICIES)))
        if self.version is not None and not version_key(self.version)[0:1]:
            raise DriverError("version %r is not a version" % self.version)
        if not self.load_command:
            raise DriverError("load_command must not be empty")
        if self.state == "latest" and self.version is not None:
            raise DriverError("state latest picks the newest package under src; do not also give version")


@dataclass
class Observed:
    node_kind: Optional[str]                 # deb | rpm | None: the node's package tool
    loaded_version: Optional[str]            # sys/module/metax/version
    package_version: Optional[str]           # the package database's view
    package_kind: Optional[str]              # deb | rpm | run
    mxcd: bool
    packages: List[Package] = field(default_factory=list)
    in_use: List[str] = field(default_factory=list)
    # the kernel driver the installed payload declared (DRIVER_RECORD, when it is that payload's)
    package_driver: Optional[str] = None
    kernel: Optional[str] = None            # the running kernel's release

    @property
    def installed(self) -> bool:
        return self.package_version is not None or self.loaded_version is not None

    @property
    def version(self) -> Optional[str]:
        return self.package_version or self.loaded_version

    def summary(self) -> Dict[str, object]:
        return {"version": self.version, "loaded_version": self.loaded_version,
                "package_version": self.package_version, "package_kind": self.package_kind,
                "package_driver_version": self.package_driver, "kernel": self.kernel,
                "loaded": self.loaded_version is not None, "mxcd": self.mxcd}

    def declared_driver(self, version: Optional[str]) -> Optional[str]:
        """The kernel driver the payload ``version`` installs: declared by a payload of it at src, or
        by the install record when it is the installed one; else the same number (our payloads)."""
        if version is None:
            return None
        for pkg in self.packages:
            if pkg.version == version and pkg.driver_version:
                return pkg.driver_version
        if version == self.package_version and self.package_driver:
            return self.package_driver
        return version


@dataclass
class Plan:
    steps: List[str]                   # "unload", "remove", "install", "load"
    from_version: Optional[str]        # payload versions (package database, file names)
    to_version: Optional[str]
    package: Optional[Package] = None
    reason: str = ""
    needs_unload: bool = False
    from_driver: Optional[str] = None  # the loaded module's version before
    to_driver: Optional[str] = None    # the kernel driver ``to_version`` declares (what verify expects)

    @property
    def changed(self) -> bool:
        return bool(self.steps)

    def as_dict(self) -> Dict[str, object]:
        return {"steps": list(self.steps), "from_version": self.from_version,
                "to_version": self.to_version, "from_driver_version": self.from_driver,
                "to_driver_version": self.to_driver, "reason": self.reason,
                "package": asdict(self.package) if self.package else None}


# -- commands -----------------------------------------------------------------
class NodeCommands:
    """Runs the node's own tools (see the module docstring for how names resolve)."""

    def __init__(self, host: HostRoot, runner: Optional[Runner] = None) -> None:
        self.host = host
        self.runner = runner or (lambda argv: host.run(argv, timeout=900))

    def has_tool(self, name: str) -> bool:
        return self.host.which(name, TOOL_DIRS) is not None

    def resolve(self, argv: Sequence[str]) -> List[str]:
        argv = list(argv)
        if "/" in argv[0] or self.host.path == "/":
            return argv
        if self.host.is_simulated():
            local = self.host.which(argv[0], TOOL_DIRS)
            if local is None:
                raise DriverError("%s: no such tool on the node (%s)" % (argv[0], self.host.path))
            return [local] + argv[1:]
        return ["chroot", self.host.path] + argv

    def node_file(self, node_path: str) -> str:
        """A node path as the command that receives it must see it."""
        if self.host.path == "/" or self.host.is_simulated():
            return self.host.join(node_path.lstrip("/"))
        return node_path      # chroot: the node's own view

    def run(self, argv: Sequence[str]) -> Tuple[int, str, str]:
        return self.runner(self.resolve(argv))

    def check(self, argv: Sequence[str], what: str) -> str:
        rc, out, err = self.run(argv)
        if rc != 0:
            raise DriverCommandError("%s failed (rc=%d): %s: %s" % (
                what, rc, " ".join(argv), (err or out).strip()[-400:]))
        return out


# -- observe ------------------------------------------------------------------
def node_kind(cmds: NodeCommands) -> Optional[str]:
    if cmds.has_tool("dpkg-query") and cmds.has_tool("dpkg"):
        return "deb"
    if cmds.has_tool("rpm"):
        return "rpm"
    return None


def _query_package(cmds: NodeCommands, kind: Optional[str], name: str) -> Optional[str]:
    if kind == "deb":
        rc, out, _err = cmds.run(["dpkg-query", "-W", "-f=${Status}\t${Version}", name])
        if rc == 0 and "\t" in out:
            status, version = out.strip().split("\t", 1)
            if status.endswith(" installed") and version:
                return version.split("-", 1)[0]      # upstream version; the file name has no revision
        return None
    if kind == "rpm":
        rc, out, _err = cmds.run(["rpm", "-q", "--qf", "%{VERSION}", name])
        if rc == 0 and out.strip() and "not installed" not in out:
            return out.strip()
    return None


def _record(host: HostRoot, rel: str) -> Optional[dict]:
    if not host.exists(rel):
        return None
    try:
        found = json.loads(host.read_text(rel))
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def _run_record(host: HostRoot) -> Optional[dict]:
    return _record(host, RUN_RECORD)


def declared_driver(host: HostRoot, version: Optional[str]) -> Optional[str]:
    """The kernel driver the installed payload ``version`` declared when it was installed
    (:data:`DRIVER_RECORD`); ``version`` itself when the record is of another (our numbering)."""
    record = _record(host, DRIVER_RECORD) or {}
    if version is not None and record.get("version") == version and record.get("driver_version"):
        return str(record["driver_version"])
    return version


def kernel_release(host: HostRoot) -> Optional[str]:
    """The running kernel's release: the root's procfs, else this machine's (a container on the
    node, or a chroot into it, runs the node's kernel)."""
    found = host.read_attribute(KERNEL_RELEASE, default="") if host.exists(KERNEL_RELEASE) else ""
    return found or os.uname().release or None


def _declaration(host: HostRoot, rel: str) -> Declaration:
    try:
        return parse_declaration(host.read_text(rel), "/" + rel)
    except (DriverPackageError, HostRootError) as exc:
        raise DriverError(str(exc))


def _module_kernels(host: HostRoot, tree_rel: str) -> List[str]:
    """The kernel releases a prebuilt tree has the metax module for (lib/modules/<release>/**/metax.ko)."""
    base = tree_rel.rstrip("/") + "/lib/modules"
    kernels = []
    for release in host.listdir(base) if host.isdir(base) else ():
        for _dirpath, _dirs, files in os.walk(host.join(base + "/" + release)):
            if any(f in MODULE_FILES for f in files):
                kernels.append(release)
                break
    return kernels


def _tree(host: HostRoot, rel: str, name: str) -> Optional[Package]:
    """The prebuilt payload at ``rel``: a directory with ``<name>.version`` and modules; None if it is not one."""
    rel = rel.strip("/")
    if not host.isdir(rel) or not host.exists(rel + "/" + name + DECLARATION_SUFFIX):
        return None
    kernels = _module_kernels(host, rel)
    if not kernels:
        return None              # a declaration beside packages, not a prebuilt tree
    try:
        return prebuilt("/" + rel, _declaration(host, rel + "/" + name + DECLARATION_SUFFIX), kernels)
    except DriverPackageError as exc:
        raise DriverError(str(exc))


def scan_src(host: HostRoot, src: Optional[str], name: str) -> List[Package]:
    """The payloads at ``src`` (node path), every layout under the one interface, oldest first.

    ``src`` is a package file, a prebuilt tree, or a directory holding package
    files, prebuilt trees (``src`` itself or its subdirectories) and
    declarations (``<name>.version``, ``<name>-*.version``) for the packages
    beside them. A file named explicitly must be a package.
    """
    if not src:
        return []
    rel = src.strip("/")
    if not host.exists(rel):
        raise DriverError("src %s: no such file or directory on the node (host_root %s)" % (src, host.path))
    if not host.isdir(rel):
        drivers = declared_drivers(_declarations(host, os.path.dirname(rel), name))
        try:
            return [parse("/" + rel, name, drivers)]
        except DriverPackageError as exc:
            raise DriverError(str(exc))
    entries = sorted(host.listdir(rel))
    trees = [t for t in [_tree(host, rel, name)] + [_tree(host, rel + "/" + e, name) for e in entries
                                                    if host.isdir(rel + "/" + e)] if t is not None]
    drivers = declared_drivers(_declarations(host, rel, name))
    try:
        return candidates(["/" + rel + "/" + e for e in entries], name, drivers, trees)
    except DriverPackageError as exc:
        raise DriverError(str(exc))


def _declarations(host: HostRoot, rel: str, name: str) -> List[Declaration]:
    rel = rel.strip("/")
    if not host.isdir(rel):
        return []
    return [_declaration(host, rel + "/" + e) for e in sorted(host.listdir(rel))
            if is_declaration(e, name) and not host.isdir(rel + "/" + e)]


def observe(host: HostRoot, cmds: NodeCommands, request: Request,
            pods: Sequence[Mapping] = ()) -> Observed:
    kind = node_kind(cmds)
    package_version = _query_package(cmds, kind, request.package_name)
    package_kind = kind if package_version else None
    record = _run_record(host)
    if package_version is None and record:
        package_version, package_kind = record.get("version"), "run"
    tree_record = _record(host, PREBUILT_RECORD)
    if package_version is None and tree_record:
        package_version, package_kind = tree_record.get("version"), PREBUILT
    declared = _record(host, DRIVER_RECORD) or {}
    package_driver = declared.get("driver_version") if package_version and \
        declared.get("version") == package_version else None
    loaded = host.read_attribute("sys/module/metax/version", default="") or None
    packages = scan_src(host, request.src, request.package_name)
    mxcd = False
    try:
        mxcd = stat.S_ISCHR(os.lstat(host.join("dev/mxcd")).st_mode)
    except OSError:
        pass
    return Observed(node_kind=kind, loaded_version=loaded, package_version=package_version,
                    package_kind=package_kind, mxcd=mxcd, packages=packages,
                    in_use=inuse.in_use(host, pods) if loaded else [],
                    package_driver=package_driver, kernel=kernel_release(host))


# -- plan (pure) --------------------------------------------------------------
def plan(request: Request, seen: Observed) -> Plan:
    """What to do; raises DriverError / DriverInUseError. No I/O."""
    request.validate()
    current = seen.version
    if request.state == "absent":
        if request.deploy_policy == "Never":
            raise DriverError("deploy_policy Never: this module does not touch the driver; "
                              "state absent needs IfNotPresent or Always")
        steps = []
        if seen.loaded_version is not None:
            steps.append("unload")
        if seen.package_version is not None:
            steps.append("remove")
        result = Plan(steps=steps, from_version=current, to_version=None,
                      reason="remove the driver" if steps else "no driver installed",
                      needs_unload=seen.loaded_version is not None, from_driver=seen.loaded_version)
        _refuse_in_use(request, seen, result)
        return result

    target: Optional[str] = request.version
    if request.state == "latest":
        best = choose(seen.packages, seen.node_kind, None, seen.kernel)
        if best is None:
            raise DriverError("state latest: no driver package for this node under src %s"
                              % (request.src or "(src not given)"))
        target = best.version

    if request.deploy_policy == "Never":
        if not seen.installed:
            raise DriverError("deploy_policy Never and no MetaX driver is installed on the node")
        if target is not None and seen.package_version != target and \
                not driver_matches(seen.loaded_version, seen.declared_driver(target)):
            raise DriverError("deploy_policy Never: the node has driver %s, %s was asked" % (current, target))
        return Plan(steps=[], from_version=current, to_version=target or current,
                    reason="deploy_policy Never: verify only", from_driver=seen.loaded_version,
                    to_driver=seen.declared_driver(target) if target else seen.loaded_version)

    reinstall = request.deploy_policy == "Always"
    if reinstall or not seen.installed or (target is not None and seen.package_version != target):
        if target is None and not seen.packages and seen.installed and seen.package_version is None:
            # loaded but unknown to any package database, no package given: nothing to install from
            raise DriverError("deploy_policy %s: the driver is not from a package and no src was given"
                              % request.deploy_policy)
        package = choose(seen.packages, seen.node_kind, target, seen.kernel)
        if package is None:
            if not seen.packages and not request.src:
                raise DriverError("no src given: the driver package (deb, rpm, .run or a prebuilt tree) to "
                                  "install must be on the node or copied there first")
            raise DriverError("no %sdriver package for this node (%s tool, kernel %s) under %s; found: %s" % (
                "version %s " % target if target else "", seen.node_kind or "no package", seen.kernel or "?",
                request.src, ", ".join(_describe(p) for p in seen.packages) or "none"))
        if package.kind in ("deb", "rpm") and package.kind != seen.node_kind:
            raise DriverError("%s is a %s package but the node's package tool is %s"
                              % (package.path, package.kind, seen.node_kind or "none"))
        steps = []
        if seen.loaded_version is not None:
            steps.append("unload")
        if seen.package_kind and (seen.package_kind != package.kind or package.kind == PREBUILT):
            # never two installs of one driver side by side (a prebuilt tree's files go before the next's)
            steps.append("remove")
        steps += ["install", "load"]
        why = ("reinstall (deploy_policy Always)" if reinstall and current == package.version
               else "install %s" % package.version if not seen.installed
               else "%s %s -> %s" % ("upgrade" if version_key(package.version) > version_key(current or "0")
                                     else "downgrade", current, package.version))
        if package.driver != package.version:
            why += " (kernel driver %s)" % package.driver
        result = Plan(steps=steps, from_version=current, to_version=package.version, package=package,
                      reason=why, needs_unload=seen.loaded_version is not None, from_driver=seen.loaded_version,
                      to_driver=package.driver)
        _refuse_in_use(request, seen, result)
        return result

    # the package is right; is the running module the kernel driver it declares?
    want = target or seen.package_version
    want_driver = seen.declared_driver(want)
    if seen.loaded_version is None:
        return Plan(steps=["load"], from_version=None, to_version=want, reason="driver installed but not loaded",
                    to_driver=want_driver)
    if want_driver is not None and not driver_matches(seen.loaded_version, want_driver):
        result = Plan(steps=["unload", "load"], from_version=seen.loaded_version, to_version=want,
                      reason="package %s installed but %s still loaded%s" % (
                          want, seen.loaded_version,
                          "" if want_driver == want else " (it installs kernel driver %s)" % want_driver),
                      needs_unload=True, from_driver=seen.loaded_version, to_driver=want_driver)
        _refuse_in_use(request, seen, result)
        return result
    return Plan(steps=[], from_version=current, to_version=current, reason="driver %s present" % current,
                from_driver=seen.loaded_version, to_driver=want_driver or seen.loaded_version)


def _describe(package: Package) -> str:
    if package.kind == PREBUILT:
        return "%s (prebuilt %s for %s)" % (os.path.basename(package.path), package.version,
                                             ", ".join(package.kernels))
    return os.path.basename(package.path)


def _refuse_in_use(request: Request, seen: Observed, result: Plan) -> None:
    if result.needs_unload and seen.in_use and not request.force:
        raise DriverInUseError("the MetaX driver is in use, refusing to %s without force: %s"
                               % (result.reason, "; ".join(seen.in_use)))


def diff(seen: Observed, result: Plan) -> Dict[str, str]:
    before = "driver: %s\nloaded: %s\n" % (seen.version or "absent", seen.loaded_version or "no")
    if not result.changed:
        return {"before": before, "after": before}
    after_version = result.to_version or "absent"
    after = "driver: %s\nloaded: %s\n" % (after_version, result.to_driver or result.to_version or "no")
    return {"before": before, "after": after}


# -- apply ----------------------------------------------------------------------
def apply(host: HostRoot, cmds: NodeCommands, request: Request, seen: Observed, result: Plan) -> None:
    for step in result.steps:
        if step == "unload":
            cmds.check(request.unload_command, "unloading the driver")
        elif step == "remove":
            _remove(host, cmds, request, seen)
        elif step == "install":
            if result.package is None:
                raise DriverError("internal: an install step without a package")
            _install(host, cmds, request, result.package, seen.kernel)
        elif step == "load":
            cmds.check(request.load_command, "loading the driver")


def _write_record(host: HostRoot, rel: str, record: Mapping[str, object]) -> None:
    os.makedirs(os.path.dirname(host.join(rel)), exist_ok=True)
    host.write_file_atomic(rel, (json.dumps(dict(record), sort_keys=True) + "\n").encode())


def _unlink(host: HostRoot, rel: str) -> None:
    if os.path.lexists(host.join(rel)):
        os.unlink(host.join(rel))


def _install(host: HostRoot, cmds: NodeCommands, request: Request, package: Package,
             kernel: Optional[str] = None) -> None:
    if package.kind == PREBUILT:
        _install_prebuilt(host, cmds, package, kernel)
    else:
        path = cmds.node_file(package.path)
        if package.kind == "deb":
            cmds.check(["dpkg", "-i", path], "installing %s" % package.path)
        elif package.kind == "rpm":
            cmds.check(["rpm", "-U", "--replacepkgs", "--oldpackage", path], "installing %s" % package.path)
        else:
            cmds.check([path] + list(request.run_install_args), "running %s" % package.path)
            _write_record(host, RUN_RECORD, {"version": package.version, "package": package.path,
                                             "driver_version": package.driver})
    # what the loaded module will say: a later run compares it with this, not with the payload's version
    _write_record(host, DRIVER_RECORD, {"version": package.version, "driver_version": package.driver,
                                        "kind": package.kind})


def copy_payload_file(source: str, host: HostRoot, rel: str, mode: Optional[int] = None) -> None:
    """Copy one file of a payload (a local path) to ``rel`` under the node's root, atomically.

    The one place a payload's files are unpacked onto a node or into its cache
    (driver-manager's staging, the prebuilt install): an archive extraction
    replacing it later changes this function only.
    """
    # only a regular file, opened without following a link: a payload's link, FIFO or device node
    # would make root read (or block on) whatever it points at
    try:
        src_fd = os.open(source, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise DriverError("payload file %s refused: %s (only regular files are copied)" % (source, exc)) from exc
    with os.fdopen(src_fd, "rb") as src:
        if not stat.S_ISREG(os.fstat(src.fileno()).st_mode):
            raise DriverError("payload file %s refused: not a regular file" % source)
        _copy_payload_stream(src, host, rel, stat.S_IMODE(os.fstat(src.fileno()).st_mode) if mode is None else mode)


def _copy_payload_stream(src, host: HostRoot, rel: str, mode: int) -> None:
    dest = host.join(rel)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    # streamed (a vendor .run is hundreds of MB) into a temporary file beside it, then renamed
    handle, tmp = tempfile.mkstemp(prefix=".metax-copy-", dir=os.path.dirname(dest))
    try:
        with os.fdopen(handle, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
            out.flush()
            os.fsync(out.fileno())
        # never setuid/setgid/sticky from a payload (the archive routine's rule)
        os.chmod(tmp, mode & 0o777)
        os.replace(tmp, dest)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise


def _install_prebuilt(host: HostRoot, cmds: NodeCommands, package: Package, kernel: Optional[str]) -> None:
    """Copy the tree's modules for the running kernel into ``lib/modules/<kernel>/`` (paths kept) and
    its tools (``usr/bin/mx-smi``) where the node has none, record the files, run ``depmod``."""
    if kernel is None or kernel not in package.kernels:
        raise DriverError("%s has no modules for the running kernel %s (it has %s)"
                          % (package.path, kernel or "?", ", ".join(package.kernels)))
    tree = host.join(package.path.strip("/"))
    files: List[str] = []
    modules = os.path.join(tree, "lib", "modules", kernel)
    for dirpath, _dirs, names in os.walk(modules):
        for name in sorted(names):
            source = os.path.join(dirpath, name)
            # kernel objects only: a tree's modules.dep & co. would replace the node's (depmod
            # writes those), and a recorded one would be deleted from the node on removal
            if os.path.islink(source) or not name.endswith(KERNEL_OBJECTS):
                continue
            rel = "lib/modules/%s/%s" % (kernel, os.path.relpath(source, modules))
            copy_payload_file(source, host, rel, 0o644)
            files.append(rel)
    tools = os.path.join(tree, "usr", "bin")
    for name in sorted(os.listdir(tools)) if os.path.isdir(tools) else ():
        rel = "usr/bin/" + name
        if not os.path.isfile(os.path.join(tools, name)) or os.path.islink(os.path.join(tools, name)):
            continue
        if os.path.lexists(host.join(rel)):
            continue                 # the node's own mx-smi (MXMACA's, the administrator's) is never replaced
        copy_payload_file(os.path.join(tools, name), host, rel, 0o755)
        files.append(rel)
    _write_record(host, PREBUILT_RECORD, {"version": package.version, "driver_version": package.driver,
                                          "package": package.path, "kernel": kernel, "files": files})
    cmds.check(["depmod", "-a", kernel], "depmod for the modules of %s" % package.path)


def _remove_prebuilt(host: HostRoot, cmds: NodeCommands) -> None:
    record = _record(host, PREBUILT_RECORD) or {}
    for rel in record.get("files") or ():
        rel = str(rel).strip("/")
        if not (rel.startswith("lib/modules/") or rel.startswith("usr/bin/")) or ".." in rel.split("/"):
            continue                 # only what an install of ours could have written
        _unlink(host, rel)
        parent = os.path.dirname(rel)
        kernel_dir = "lib/modules/%s" % record.get("kernel")
        while parent.startswith(kernel_dir + "/") and host.isdir(parent) and not host.listdir(parent):
            os.rmdir(host.join(parent))      # the directories the tree brought (extra/metax), not the kernel's
            parent = os.path.dirname(parent)
    if record.get("kernel"):
        cmds.check(["depmod", "-a", str(record["kernel"])], "depmod after removing the prebuilt driver")
    _unlink(host, PREBUILT_RECORD)


def _remove(host: HostRoot, cmds: NodeCommands, request: Request, seen: Observed) -> None:
    _remove_package(host, cmds, request, seen)
    _unlink(host, DRIVER_RECORD)


def _remove_package(host: HostRoot, cmds: NodeCommands, request: Request, seen: Observed) -> None:
    if seen.package_kind == PREBUILT:
        _remove_prebuilt(host, cmds)
    elif seen.package_kind == "deb":
        cmds.check(["dpkg", "--purge", request.package_name], "removing %s" % request.package_name)
    elif seen.package_kind == "rpm":
        cmds.check(["rpm", "-e", request.package_name], "removing %s" % request.package_name)
    elif seen.package_kind == "run":
        record = _run_record(host) or {}
        run_file = record.get("package")
        if not run_file or not host.exists(run_file.lstrip("/")):
            raise DriverCommandError("the driver was installed from %s, which is gone: its uninstaller "
                                     "cannot run" % (run_file or "a .run package"))
        cmds.check([cmds.node_file(run_file)] + list(request.run_uninstall_args), "uninstalling %s" % run_file)
        os.unlink(host.join(RUN_RECORD))


# -- verify ---------------------------------------------------------------------
def verify(host: HostRoot, cmds: NodeCommands, version: Optional[str]) -> Dict[str, object]:
    """Version, /dev/mxcd and mx-smi; raises DriverVerifyError listing what failed.

    ``version`` is the kernel-driver version the payload declares (``Plan.to_driver``,
    ``Package.driver``), never a payload version that declares another; None: any.
    """
    loaded = host.read_attribute("sys/module/metax/version", default="") or None
    try:
        mxcd = stat.S_ISCHR(os.lstat(host.join("dev/mxcd")).st_mode)
    except OSError:
        mxcd = False
    smi = host.which("mx-smi")
    smi_ok, smi_msg = False, "mx-smi not found on the node"
    if smi is not None:
        try:
            rc, out, err = cmds.runner([smi] if host.path == "/" or host.is_simulated()
                                       else ["chroot", host.path, "/" + host.relative(smi).lstrip("/")])
            smi_ok, smi_msg = rc == 0, "rc=%d %s" % (rc, (err or "").strip()[-200:]) if rc else "ok"
        except HostRootError as exc:
            smi_msg = str(exc)
    checks: Dict[str, object] = {
        "loaded_version": loaded,
        "version_ok": loaded is not None and (version is None or driver_matches(loaded, version)),
        "mxcd": mxcd, "mx_smi": smi_ok, "mx_smi_message": smi_msg,
    }
    problems = []
    if not checks["version_ok"]:
        problems.append("loaded driver is %s, expected %s" % (loaded or "none", version or "any"))
    if not mxcd:
        problems.append("/dev/mxcd missing")
    if not smi_ok:
        problems.append("mx-smi: %s" % smi_msg)
    if problems:
        raise DriverVerifyError("driver verification failed: " + "; ".join(problems), checks)
    return checks


def run(host: HostRoot, request: Request, check_mode: bool, runner: Optional[Runner] = None,
        pods: Sequence[Mapping] = ()) -> Dict[str, object]:
    """observe -> plan -> (apply -> verify); the module's whole job, as a dict result."""
    request.validate()
    host.check()
    if request.src and kind_of(request.src) is None and not host.isdir(request.src.lstrip("/")) \
            and host.exists(request.src.lstrip("/")):
        raise DriverError("src %s: not a .deb, .rpm or .run file nor a directory (of packages, or a prebuilt "
                          "tree)" % request.src)
    cmds = NodeCommands(host, runner)
    seen = observe(host, cmds, request, pods)
    result = plan(request, seen)
    out: Dict[str, object] = {
        "changed": result.changed, "plan": result.as_dict(), "before": seen.summary(),
        "in_use": seen.in_use, "diff": diff(seen, result),
    }
    if check_mode:
        return out
    apply(host, cmds, request, seen, result)
    after = observe(host, cmds, Request(package_name=request.package_name, src=None))
    out["after"] = after.summary()
    if request.verify and request.state != "absent":
        out["verify"] = verify(host, cmds, result.to_driver)
    return out
