# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""HostRoot: every node-side file access goes through a root prefix.

On a real node the root is ``/``; inside an agent container it is the host
mount (``/host``); in tests and on the local cluster it is a simulated MetaX
node created by :mod:`.sim`.

A HostRoot has two faces:

* ``path`` -- where this process reads and writes (e.g. ``/host``);
* ``host_prefix`` -- the prefix of paths handed to the kubelet/containerd
  (device nodes in ``Allocate``): ``/`` on a real node, the simulated root's
  directory on the local cluster.

Writes to kernel attributes (``write_attribute``) are the one narrow seam
where a simulated root emulates the kernel's reaction (for example creating
VFs when ``sriov_numvfs`` is written). Callers never know which it is. The
emulator is not imported here: a simulated root carries its own executable
hook (``.metax-sim/kernel``) that this module runs as a separate process, so
no simulator code travels in a module's payload; see docs/simulated-node.md.
"""

from __future__ import annotations

import errno as errno_codes
import os
import subprocess
import tempfile
from typing import List, Optional, Sequence, Tuple

from .errors import MetaxGpuError

# Directory a simulated root carries (state and the kernel hook).
SIM_STATE_DIR = ".metax-sim"
# Executable a simulated root installs to react to attribute writes like the
# kernel. Protocol: ``<hook> write <node-path>`` with the value on stdin; exit
# status 0 on success, else the errno the kernel would have returned, with a
# one-line reason on stderr.
SIM_KERNEL_HOOK = SIM_STATE_DIR + "/kernel"

# Where mx-smi is installed on MetaX nodes (driver package and MACA SDK).
MX_SMI_DIRS = ("usr/bin", "usr/local/bin", "opt/mxdriver/bin", "opt/maca/bin", "usr/sbin")


def replace_file(path: str, content: bytes, mode: int = 0o644, tmp_dir: Optional[str] = None) -> None:
    """Replace ``path`` with ``content`` atomically: a reader sees the old or the new file, never half.

    The temporary file (``.metax-tmp-*``, a name no config reader picks up)
    is written and synced in ``tmp_dir`` (default: beside ``path``; same
    filesystem), then renamed over ``path``; a failure removes it.
    """
    directory = tmp_dir or os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".metax-tmp-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


class HostRootError(MetaxGpuError):
    """A node-side file or command could not be read or run.

    ``errno`` carries the kernel's answer to a failed write (EBUSY, ERANGE,
    EINVAL...) when there is one, so callers can tell "busy" from "invalid".
    """

    def __init__(self, message: str, errno: Optional[int] = None) -> None:
        super().__init__(message)
        self.errno = errno


class HostRoot:
    """File access rooted at ``path``; see the module docstring."""

    def __init__(self, path: str = "/", host_prefix: Optional[str] = None) -> None:
        self.path = os.path.abspath(path or "/")
        self.host_prefix = os.path.abspath(host_prefix) if host_prefix else self.path

    def __repr__(self) -> str:
        return "HostRoot(%r, host_prefix=%r)" % (self.path, self.host_prefix)

    # -- path mapping -------------------------------------------------
    def join(self, rel: str) -> str:
        """Map a node path (``/sys/...`` or ``sys/...``) to a local path."""
        rel = rel.lstrip("/")
        return os.path.join(self.path, rel) if rel else self.path

    def host_path(self, rel: str) -> str:
        """Map a node path to the path the kubelet/containerd must use."""
        rel = rel.lstrip("/")
        return os.path.join(self.host_prefix, rel) if rel else self.host_prefix

    def relative(self, local_path: str) -> str:
        """Inverse of :meth:`join`: the node path (``/...``) of a local path."""
        rel = os.path.relpath(os.path.abspath(local_path), self.path)
        return "/" if rel == "." else "/" + rel

    def check(self) -> None:
        """Fail clearly when the root itself is missing."""
        if not os.path.isdir(self.path):
            raise HostRootError("host root %s does not exist or is not a directory" % self.path)

    # -- reads --------------------------------------------------------
    def exists(self, rel: str) -> bool:
        return os.path.lexists(self.join(rel))

    def isdir(self, rel: str) -> bool:
        return os.path.isdir(self.join(rel))

    def listdir(self, rel: str) -> List[str]:
        try:
            return sorted(os.listdir(self.join(rel)))
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise HostRootError("cannot list %s: %s" % (self.join(rel), exc.strerror or exc))

    def read_text(self, rel: str) -> str:
        path = self.join(rel)
        try:
            with open(path, "r", encoding="utf-8", errors="replace") as handle:
                return handle.read()
        except OSError as exc:
            raise HostRootError("cannot read %s: %s" % (path, exc.strerror or exc))

    def read_attribute(self, rel: str, default: Optional[str] = None) -> str:
        """Read a one-line sysfs attribute, stripped; ``default`` when absent."""
        if default is not None and not self.exists(rel):
            return default
        return self.read_text(rel).strip()

    def read_int(self, rel: str, default: Optional[int] = None, base: int = 0) -> int:
        """Read an integer attribute (``0x``-prefixed hex accepted); raises when absent without a default."""
        if not self.exists(rel):
            if default is not None:
                return default
            raise HostRootError("cannot read %s: no such file" % self.join(rel))
        raw = self.read_text(rel).strip()
        try:
            return int(raw, base)
        except ValueError:
            raise HostRootError("%s: expected an integer, got %r" % (self.join(rel), raw[:80]))

    def readlink(self, rel: str) -> Optional[str]:
        try:
            return os.readlink(self.join(rel))
        except OSError:
            return None

    def realpath(self, rel: str) -> str:
        """Resolve symlinks inside the root; returns a node path (``/...``).

        Absolute link targets are re-rooted, so a link to ``/sys/devices/x``
        in a simulated root resolves inside that root.
        """
        parts = [p for p in rel.split("/") if p]
        resolved: List[str] = []
        hops = 0
        while parts:
            part = parts.pop(0)
            if part == ".":
                continue
            if part == "..":
                if resolved:
                    resolved.pop()
                continue
            candidate = "/".join(resolved + [part])
            target = self.readlink(candidate)
            if target is None:
                resolved.append(part)
                continue
            hops += 1
            if hops > 40:
                raise HostRootError("too many levels of symbolic links at %s" % self.join(candidate))
            if target.startswith("/"):
                resolved = []
            parts = [p for p in target.split("/") if p] + parts
        return "/" + "/".join(resolved)

    # -- writes -------------------------------------------------------
    def kernel_hook(self) -> Optional[str]:
        """The simulated root's kernel hook, or None on anything that may be a real node.

        Never for ``/``, and never when ``<root>/sys`` is a mount point (a
        real sysfs, e.g. ``/host/sys`` in an agent container): a stray
        ``.metax-sim`` directory on a real node cannot divert writes.
        """
        if self.path == "/" or os.path.ismount(self.join("sys")):
            return None
        hook = self.join(SIM_KERNEL_HOOK)
        if os.path.isfile(hook) and os.access(hook, os.X_OK):
            return hook
        return None

    def is_simulated(self) -> bool:
        return self.kernel_hook() is not None

    def write_attribute(self, rel: str, value: str) -> None:
        """Write a kernel attribute (sysfs). The kernel reacts; so does a simulated root's hook.

        Raises HostRootError with ``errno`` set to the kernel's answer.
        """
        path = self.join(rel)
        hook = self.kernel_hook()
        if hook is not None:
            self._write_through_hook(hook, rel, value, path)
            return
        try:
            with open(path, "w") as handle:
                handle.write(value)
        except OSError as exc:
            raise HostRootError("cannot write %r to %s: %s" % (value, path, exc.strerror or exc),
                                errno=exc.errno)

    def _write_through_hook(self, hook: str, rel: str, value: str, path: str) -> None:
        try:
            proc = subprocess.run(
                [hook, "write", "/" + rel.lstrip("/")], input=value.encode("utf-8"),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60, check=False,
                env=dict(os.environ, METAX_HOST_ROOT=self.path, LC_ALL="C"),
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise HostRootError("cannot write %r to %s: simulated kernel hook %s failed: %s"
                                % (value, path, hook, exc))
        if proc.returncode == 0:
            return
        code = proc.returncode if 0 < proc.returncode < 256 else errno_codes.EIO
        reason = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        raise HostRootError("cannot write %r to %s: %s" % (
            value, path, reason[-1] if reason else os.strerror(code)), errno=code)

    def write_file_atomic(self, rel: str, content: bytes, mode: int = 0o644,
                          tmp_dir: Optional[str] = None) -> None:
        """Replace a regular file atomically (temp file + rename).

        ``tmp_dir`` lets callers keep the temporary file out of watched
        directories (e.g. the kubelet's static-pod path, where a stray file
        would be run as a pod); it must be on the same filesystem.
        """
        replace_file(self.join(rel), content, mode, tmp_dir)

    # -- commands -----------------------------------------------------
    def which(self, name: str, dirs: Sequence[str] = MX_SMI_DIRS) -> Optional[str]:
        """Find an executable under the root; returns the local path."""
        for directory in dirs:
            candidate = self.join(os.path.join(directory, name))
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                return candidate
        return None

    def run(self, argv: Sequence[str], timeout: float = 30.0) -> Tuple[int, str, str]:
        """Run a command found under the root; never raises for a non-zero exit."""
        try:
            proc = subprocess.run(
                list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                timeout=timeout, check=False,
                env=dict(os.environ, METAX_HOST_ROOT=self.path, LC_ALL="C"),
            )
        except FileNotFoundError:
            raise HostRootError("command not found: %s" % argv[0])
        except PermissionError:
            raise HostRootError("command not executable: %s" % argv[0])
        except subprocess.TimeoutExpired:
            raise HostRootError("command timed out after %ss: %s" % (timeout, " ".join(argv)))
        return (proc.returncode,
                proc.stdout.decode("utf-8", "replace"),
                proc.stderr.decode("utf-8", "replace"))
