# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Whether a node's container runtime reads CDI: the choice of gpu-device's Allocate answer (pure).

``cdi``      Allocate names the devices (``cdi_devices``) and the runtime applies
             the node's spec: device nodes, the host's MXMACA, its environment.
``devices``  Allocate carries the device nodes, the MACA mount and the
             environment itself: for runtimes that cannot read CDI.

The kubelet hands ``cdi_devices`` to the runtime over CRI; a runtime that
does not read CDI ignores them, and the container would start without any
GPU. So ``auto`` picks ``cdi`` only where the runtime is known to read it:

- containerd 2.x (``enable_cdi`` defaults to true), unless its config turns it off;
- containerd 1.7 only when its config enables it (``enable_cdi = true``);
- CRI-O 1.23 and later (reads CDI by default);
- Docker (through cri-dockerd) 25 and later with ``features.cdi`` in daemon.json;
- everything else, an unknown runtime or version included: ``devices``,
  which works with every runtime.

The version comes from the Node's ``status.nodeInfo.containerRuntimeVersion``
(``containerd://2.4.0``); the configuration texts from the node's files.
Standard library only: this runs on nodes.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Iterable, Optional, Tuple

MODE_AUTO = "auto"
MODE_CDI = "cdi"
MODE_DEVICES = "devices"
MODES = (MODE_AUTO, MODE_CDI, MODE_DEVICES)

# enable_cdi in containerd's CRI plugin section (1.7: [plugins."io.containerd.grpc.v1.cri"],
# 2.x: [plugins."io.containerd.cri.v1.runtime"]); the last assignment wins, as in TOML merging
# of conf.d drop-ins, which containerd applies after the main file.
_ENABLE_CDI = re.compile(r"^\s*enable_cdi\s*=\s*(true|false)\s*(?:#.*)?$", re.MULTILINE)
_VERSION = re.compile(r"^v?(\d+)(?:\.(\d+))?(?:\.(\d+))?")


@dataclass(frozen=True)
class Runtime:
    """A container runtime as the Node reports it: ``containerd://1.7.24`` -> ("containerd", (1, 7, 24))."""

    name: str
    version: Tuple[int, int, int]
    raw: str


@dataclass(frozen=True)
class Decision:
    mode: str          # MODE_CDI or MODE_DEVICES
    reason: str


def parse_runtime(raw: str) -> Optional[Runtime]:
    """The runtime of a ``containerRuntimeVersion`` string, or None when it has no name and version."""
    name, sep, version = (raw or "").strip().partition("://")
    match = _VERSION.match(version)
    if not sep or not name or not match:
        return None
    parts = tuple(int(p) if p else 0 for p in match.groups())
    return Runtime(name.lower(), (parts[0], parts[1], parts[2]), raw.strip())


def containerd_cdi_setting(config_texts: Iterable[str]) -> Optional[bool]:
    """``enable_cdi`` as containerd would see it over its config files in load order; None if unset."""
    value: Optional[bool] = None
    for text in config_texts:
        for match in _ENABLE_CDI.finditer(text or ""):
            value = match.group(1) == "true"
    return value


def docker_cdi_setting(daemon_json: Optional[str]) -> Optional[bool]:
    """``features.cdi`` of a daemon.json text; None when unset or unreadable."""
    if not daemon_json:
        return None
    try:
        data = json.loads(daemon_json)
    except ValueError:
        return None
    features = data.get("features") if isinstance(data, dict) else None
    value = features.get("cdi") if isinstance(features, dict) else None
    return value if isinstance(value, bool) else None


def reads_cdi(runtime: Runtime, enabled: Optional[bool]) -> Tuple[bool, str]:
    """(whether ``runtime`` reads CDI, why); ``enabled`` is its config's CDI switch (None: not set)."""
    major, minor = runtime.version[0], runtime.version[1]
    if runtime.name == "containerd":
        if major >= 2:
            if enabled is False:
                return False, "%s with enable_cdi = false" % runtime.raw
            return True, "%s reads CDI by default" % runtime.raw
        if (major, minor) == (1, 7):
            if enabled:
                return True, "%s with enable_cdi = true" % runtime.raw
            return False, "%s without enable_cdi = true" % runtime.raw
        return False, "%s predates CDI (1.7)" % runtime.raw
    if runtime.name == "cri-o":
        if (major, minor) >= (1, 23):
            return True, "%s reads CDI" % runtime.raw
        return False, "%s predates CDI (1.23)" % runtime.raw
    if runtime.name == "docker":
        if major >= 25 and enabled:
            return True, "%s with features.cdi" % runtime.raw
        if major >= 25:
            return False, "%s without features.cdi in daemon.json" % runtime.raw
        return False, "%s predates CDI (25)" % runtime.raw
    return False, "%s: not known to read CDI" % runtime.raw


def decide(override: str, runtime_version: Optional[str], enabled: Optional[bool] = None) -> Decision:
    """The mode for a node: ``override`` unless it is ``auto``, else from its runtime (see the module doc)."""
    if override not in MODES:
        raise ValueError("CDI mode %r is not one of %s" % (override, ", ".join(MODES)))
    if override != MODE_AUTO:
        return Decision(override, "set to %s" % override)
    if not runtime_version:
        return Decision(MODE_DEVICES, "the node's container runtime is unknown")
    runtime = parse_runtime(runtime_version)
    if runtime is None:
        return Decision(MODE_DEVICES, "cannot read the runtime version %r" % runtime_version)
    cdi, why = reads_cdi(runtime, enabled)
    return Decision(MODE_CDI if cdi else MODE_DEVICES, why)
