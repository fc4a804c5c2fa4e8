# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Keep a node's CDI spec current: read the node, write the spec only when it changes.

Runtimes read a spec when a container is created, so a stale spec is what
makes new containers fail ("unresolvable CDI devices", HAMi#1903). The file
is therefore replaced atomically (temporary file + rename in the same
directory: a reader sees the old or the new spec, never half of one), and
only when its bytes change, so an unchanged node causes no write and no
reload in the runtimes that watch the directory. The temporary file's name
does not end in ``.json``: CDI readers skip it.

Standard library only: this runs on nodes.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from ..gpu.discovery import discover
from ..host import HostRoot, replace_file
from ..names import CDI_SPEC_DIR, CDI_SPEC_FILE
from .spec import MACA_LIBRARY_DIRS, CdiSpecError, Maca, build_spec, devices_of, render

MACA_ROOT = "/opt/maca"


@dataclass
class NodeSpec:
    """The spec for a node now (None when it has no usable device), and why devices were left out."""

    spec: Optional[Dict[str, Any]]
    warnings: List[str] = field(default_factory=list)


def host_maca(host: HostRoot, root: str = MACA_ROOT) -> Optional[Maca]:
    """The host's MXMACA, resolved through symlinks (a versioned directory behind
    ``/opt/maca`` changes the spec when the version switches), or None."""
    if not host.isdir(root):
        return None
    real = host.realpath(root)
    libs = tuple(d for d in MACA_LIBRARY_DIRS if host.isdir("%s/%s" % (real, d)))
    return Maca(host_path=host.host_path(real), library_dirs=libs)


def node_spec(host: HostRoot, maca_root: Optional[str] = MACA_ROOT) -> NodeSpec:
    inventory = discover(host, topology=False)
    devices, skipped = devices_of(inventory)
    maca = host_maca(host, maca_root) if maca_root else None
    warnings = list(inventory.warnings) + skipped
    if maca is None and maca_root:
        warnings.append("no MXMACA at %s: containers get devices only" % host.join(maca_root))
    try:
        return NodeSpec(build_spec(devices, maca, host.host_path), warnings)
    except CdiSpecError as exc:
        return NodeSpec(None, warnings + [str(exc)])


def write_if_changed(path: str, content: bytes, mode: int = 0o644) -> bool:
    """Replace ``path`` atomically with ``content`` unless it already holds it; True if written."""
    try:
        with open(path, "rb") as handle:
            if handle.read() == content:
                return False
    except FileNotFoundError:
        pass
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    replace_file(path, content, mode)
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)        # the rename survives a crash
    finally:
        os.close(dir_fd)
    return True


def remove_spec(path: str) -> bool:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


@dataclass
class Refresh:
    changed: bool
    path: str
    spec: Optional[Dict[str, Any]]
    warnings: List[str]


def refresh(host: HostRoot, spec_dir: str = CDI_SPEC_DIR, maca_root: Optional[str] = MACA_ROOT,
            name: str = CDI_SPEC_FILE) -> Refresh:
    """Bring ``spec_dir/name`` up to date with the node (a local path, not under the host root).

    With no usable device the spec is removed: a spec without devices is
    invalid, and runtimes would reject the whole directory's view of it.
    """
    path = os.path.join(spec_dir, name)
    current = node_spec(host, maca_root)
    if current.spec is None:
        return Refresh(remove_spec(path), path, None, current.warnings)
    return Refresh(write_if_changed(path, render(current.spec)), path, current.spec, current.warnings)


def watch(host: HostRoot, spec_dir: str, interval: float, maca_root: Optional[str] = MACA_ROOT,
          on_refresh: Optional[Callable[[Refresh], None]] = None,
          stop: Callable[[], bool] = lambda: False, sleep: Callable[[float], None] = time.sleep) -> None:
    """Refresh every ``interval`` seconds until ``stop()``.

    The whole node is read each time (not only the PCI functions): a GPU that
    mx-smi reports unavailable changes no sysfs entry but leaves the spec.
    """
    while not stop():
        result = refresh(host, spec_dir, maca_root)
        if on_refresh is not None:
            on_refresh(result)
        sleep(interval)
