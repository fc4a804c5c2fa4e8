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

Split by job: the node's tools and package database in ``commands.py``, the
records in ``records.py``, payload files and the prebuilt install in
``prebuilt.py``, the errors in ``errors.py``; this module keeps observe, plan,
apply, verify and run, and every name callers use (``backend.X``).
"""

from __future__ import annotations

import os
import stat
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence

from ..host import HostRoot, HostRootError
from . import inuse
# split by job (see the docstring); the names callers use stay importable from here (backend.X)
from .commands import NodeCommands, Runner, node_kind, query_package
from .errors import DriverCommandError, DriverError, DriverInUseError, DriverVerifyError
from .package import (DECLARATION_SUFFIX, MODULE_FILES, PREBUILT, Declaration, DriverPackageError, Package,
                      candidates, choose, declared_drivers, driver_matches, is_declaration, kind_of,
                      parse, parse_declaration, prebuilt, version_key)
from .prebuilt import copy_payload_file, install_prebuilt, remove_prebuilt  # noqa: F401  pylint: disable=unused-import
from .records import (DRIVER_RECORD, PREBUILT_RECORD, RUN_RECORD, declared_driver,  # noqa: F401  pylint: disable=unused-import
                      read_record, run_record, unlink, write_record)

STATES = ("present", "absent", "latest")
POLICIES = ("IfNotPresent", "Always", "Never")
DEFAULT_PACKAGE = "metax-driver"
DEFAULT_LOAD = ("modprobe", "metax")
DEFAULT_UNLOAD = ("modprobe", "-r", "metax")
# The running kernel's release (a prebuilt tree is usable only with modules for it).
KERNEL_RELEASE = "proc/sys/kernel/osrelease"


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
    package_version = query_package(cmds, kind, request.package_name)
    package_kind = kind if package_version else None
    record = run_record(host)
    if package_version is None and record:
        package_version, package_kind = record.get("version"), "run"
    tree_record = read_record(host, PREBUILT_RECORD)
    if package_version is None and tree_record:
        package_version, package_kind = tree_record.get("version"), PREBUILT
    declared = read_record(host, DRIVER_RECORD) or {}
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


# the one refusal, by its public name (driver/reload.py: the remediation ladder's reload)
refuse_in_use = _refuse_in_use


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


def _install(host: HostRoot, cmds: NodeCommands, request: Request, package: Package,
             kernel: Optional[str] = None) -> None:
    if package.kind == PREBUILT:
        install_prebuilt(host, cmds, package, kernel)
    else:
        path = cmds.node_file(package.path)
        if package.kind == "deb":
            cmds.check(["dpkg", "-i", path], "installing %s" % package.path)
        elif package.kind == "rpm":
            cmds.check(["rpm", "-U", "--replacepkgs", "--oldpackage", path], "installing %s" % package.path)
        else:
            cmds.check([path] + list(request.run_install_args), "running %s" % package.path)
            write_record(host, RUN_RECORD, {"version": package.version, "package": package.path,
                                            "driver_version": package.driver})
    # what the loaded module will say: a later run compares it with this, not with the payload's version
    write_record(host, DRIVER_RECORD, {"version": package.version, "driver_version": package.driver,
                                       "kind": package.kind})


def _remove(host: HostRoot, cmds: NodeCommands, request: Request, seen: Observed) -> None:
    _remove_package(host, cmds, request, seen)
    unlink(host, DRIVER_RECORD)


def _remove_package(host: HostRoot, cmds: NodeCommands, request: Request, seen: Observed) -> None:
    if seen.package_kind == PREBUILT:
        remove_prebuilt(host, cmds)
    elif seen.package_kind == "deb":
        cmds.check(["dpkg", "--purge", request.package_name], "removing %s" % request.package_name)
    elif seen.package_kind == "rpm":
        cmds.check(["rpm", "-e", request.package_name], "removing %s" % request.package_name)
    elif seen.package_kind == "run":
        record = run_record(host) or {}
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
