# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The MetaX kernel driver on one node: observe -> plan -> apply -> verify.

Standard library only and no Ansible import: the ``metax.gpu.driver`` module
and a later in-cluster driver manager share it unchanged.

* :func:`observe` reads what is there: the loaded module's version
  (``sys/module/metax/version``), the package database of the node's own tool
  (dpkg or rpm; a ``.run`` install is recorded in :data:`RUN_RECORD`), the
  offline packages found at ``src``, ``/dev/mxcd``.
* :func:`plan` is a pure function of that observation and the request: the
  steps (unload, remove, install, load), the versions from and to, or an
  error. Check mode stops here.
* :func:`apply` runs the steps through an injected runner, then
  :func:`verify` checks version, ``/dev/mxcd`` and ``mx-smi``.

Commands: a bare name (``dpkg``, ``modprobe``) is the node's own tool. With
``host_root`` ``/`` it runs as is; on a simulated root it is the executable
the root carries (sim.pkgtool); under any other root (a node mounted at
``/host``) it runs through ``chroot``. A command whose first word is a path
runs as given: that is how tests and special nodes replace the load command.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..errors import MetaxGpuError
from ..host import HostRoot, HostRootError
from . import inuse
from .package import Package, candidates, choose, kind_of, parse, version_key

STATES = ("present", "absent", "latest")
POLICIES = ("IfNotPresent", "Always", "Never")
DEFAULT_PACKAGE = "metax-driver"
DEFAULT_LOAD = ("modprobe", "metax")
DEFAULT_UNLOAD = ("modprobe", "-r", "metax")
# Where the module records a driver installed from the vendor .run (it has no package database).
RUN_RECORD = "var/lib/metax-gpu/driver-run.json"
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

    @property
    def installed(self) -> bool:
        return self.package_version is not None or self.loaded_version is not None

    @property
    def version(self) -> Optional[str]:
        return self.package_version or self.loaded_version

    def summary(self) -> Dict[str, object]:
        return {"version": self.version, "loaded_version": self.loaded_version,
                "package_version": self.package_version, "package_kind": self.package_kind,
                "loaded": self.loaded_version is not None, "mxcd": self.mxcd}


@dataclass
class Plan:
    steps: List[str]                   # "unload", "remove", "install", "load"
    from_version: Optional[str]
    to_version: Optional[str]
    package: Optional[Package] = None
    reason: str = ""
    needs_unload: bool = False

    @property
    def changed(self) -> bool:
        return bool(self.steps)

    def as_dict(self) -> Dict[str, object]:
        return {"steps": list(self.steps), "from_version": self.from_version,
                "to_version": self.to_version, "reason": self.reason,
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


def _run_record(host: HostRoot) -> Optional[dict]:
    if not host.exists(RUN_RECORD):
        return None
    try:
        return json.loads(host.read_text(RUN_RECORD))
    except ValueError:
        return None


def _list_src(host: HostRoot, src: Optional[str]) -> List[str]:
    if not src:
        return []
    rel = src.lstrip("/")
    if host.isdir(rel):
        return ["/" + rel.rstrip("/") + "/" + name for name in host.listdir(rel)]
    if host.exists(rel):
        return ["/" + rel]
    raise DriverError("src %s: no such file or directory on the node (host_root %s)" % (src, host.path))


def observe(host: HostRoot, cmds: NodeCommands, request: Request,
            pods: Sequence[Mapping] = ()) -> Observed:
    kind = node_kind(cmds)
    package_version = _query_package(cmds, kind, request.package_name)
    package_kind = kind if package_version else None
    record = _run_record(host)
    if package_version is None and record:
        package_version, package_kind = record.get("version"), "run"
    loaded = host.read_attribute("sys/module/metax/version", default="") or None
    srcs = _list_src(host, request.src)
    if request.src and host.exists(request.src.lstrip("/")) and not host.isdir(request.src.lstrip("/")):
        packages = [parse(srcs[0], request.package_name)]      # a file named explicitly must parse
    else:
        packages = candidates(srcs, request.package_name)
    mxcd = False
    try:
        mxcd = stat.S_ISCHR(os.lstat(host.join("dev/mxcd")).st_mode)
    except OSError:
        pass
    return Observed(node_kind=kind, loaded_version=loaded, package_version=package_version,
                    package_kind=package_kind, mxcd=mxcd, packages=packages,
                    in_use=inuse.in_use(host, pods) if loaded else [])


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
                      needs_unload=seen.loaded_version is not None)
        _refuse_in_use(request, seen, result)
        return result

    target: Optional[str] = request.version
    if request.state == "latest":
        best = choose(seen.packages, seen.node_kind, None)
        if best is None:
            raise DriverError("state latest: no driver package for this node under src %s"
                              % (request.src or "(src not given)"))
        target = best.version

    if request.deploy_policy == "Never":
        if not seen.installed:
            raise DriverError("deploy_policy Never and no MetaX driver is installed on the node")
        if target is not None and current != target:
            raise DriverError("deploy_policy Never: the node has driver %s, %s was asked" % (current, target))
        return Plan(steps=[], from_version=current, to_version=current,
                    reason="deploy_policy Never: verify only")

    reinstall = request.deploy_policy == "Always"
    if reinstall or not seen.installed or (target is not None and seen.package_version != target):
        if target is None and not seen.packages and seen.installed and seen.package_version is None:
            # loaded but unknown to any package database, no package given: nothing to install from
            raise DriverError("deploy_policy %s: the driver is not from a package and no src was given"
                              % request.deploy_policy)
        package = choose(seen.packages, seen.node_kind, target)
        if package is None:
            if not seen.packages and not request.src:
                raise DriverError("no src given: the driver package (deb, rpm or .run) to install "
                                  "must be on the node or copied there first")
            raise DriverError("no %sdriver package for this node (%s tool) under %s; found: %s" % (
                "version %s " % target if target else "", seen.node_kind or "no package",
                request.src, ", ".join(os.path.basename(p.path) for p in seen.packages) or "none"))
        if package.kind in ("deb", "rpm") and package.kind != seen.node_kind:
            raise DriverError("%s is a %s package but the node's package tool is %s"
                              % (package.path, package.kind, seen.node_kind or "none"))
        steps = []
        if seen.loaded_version is not None:
            steps.append("unload")
        if seen.package_kind and seen.package_kind != package.kind:
            steps.append("remove")          # never two installs of one driver side by side
        steps += ["install", "load"]
        why = ("reinstall (deploy_policy Always)" if reinstall and current == package.version
               else "install %s" % package.version if not seen.installed
               else "%s %s -> %s" % ("upgrade" if version_key(package.version) > version_key(current or "0")
                                     else "downgrade", current, package.version))
        result = Plan(steps=steps, from_version=current, to_version=package.version, package=package,
                      reason=why, needs_unload=seen.loaded_version is not None)
        _refuse_in_use(request, seen, result)
        return result

    # the package is right; is the running module?
    want = target or seen.package_version
    if seen.loaded_version is None:
        return Plan(steps=["load"], from_version=None, to_version=want, reason="driver installed but not loaded")
    if want is not None and seen.loaded_version != want:
        result = Plan(steps=["unload", "load"], from_version=seen.loaded_version, to_version=want,
                      reason="package %s installed but %s still loaded" % (want, seen.loaded_version),
                      needs_unload=True)
        _refuse_in_use(request, seen, result)
        return result
    return Plan(steps=[], from_version=current, to_version=current, reason="driver %s present" % current)


def _refuse_in_use(request: Request, seen: Observed, result: Plan) -> None:
    if result.needs_unload and seen.in_use and not request.force:
        raise DriverInUseError("the MetaX driver is in use, refusing to %s without force: %s"
                               % (result.reason, "; ".join(seen.in_use)))


def diff(seen: Observed, result: Plan) -> Dict[str, str]:
    before = "driver: %s\nloaded: %s\n" % (seen.version or "absent", seen.loaded_version or "no")
    if not result.changed:
        return {"before": before, "after": before}
    after_version = result.to_version or "absent"
    after = "driver: %s\nloaded: %s\n" % (after_version, result.to_version or "no")
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
            _install(host, cmds, request, result.package)
        elif step == "load":
            cmds.check(request.load_command, "loading the driver")


def _install(host: HostRoot, cmds: NodeCommands, request: Request, package: Package) -> None:
    path = cmds.node_file(package.path)
    if package.kind == "deb":
        cmds.check(["dpkg", "-i", path], "installing %s" % package.path)
    elif package.kind == "rpm":
        cmds.check(["rpm", "-U", "--replacepkgs", "--oldpackage", path], "installing %s" % package.path)
    else:
        cmds.check([path] + list(request.run_install_args), "running %s" % package.path)
        record = {"version": package.version, "package": package.path}
        os.makedirs(os.path.dirname(host.join(RUN_RECORD)), exist_ok=True)
        host.write_file_atomic(RUN_RECORD, (json.dumps(record, sort_keys=True) + "\n").encode())


def _remove(host: HostRoot, cmds: NodeCommands, request: Request, seen: Observed) -> None:
    if seen.package_kind == "deb":
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
    """Version, /dev/mxcd and mx-smi; raises DriverVerifyError listing what failed."""
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
        "loaded_version": loaded, "version_ok": loaded is not None and (version is None or loaded == version),
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
        raise DriverError("src %s: not a .deb, .rpm or .run file nor a directory" % request.src)
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
        out["verify"] = verify(host, cmds, result.to_version)
    return out
