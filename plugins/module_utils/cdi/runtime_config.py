# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""What a node's container runtime needs changed to read CDI (pure: texts in, new file contents out).

- containerd 2.x reads CDI by default: nothing. An explicit ``enable_cdi =
  false`` is the administrator's and is left alone (gpu-device then falls
  back to device nodes).
- containerd 1.7 (config version 2): a drop-in,
  ``/etc/containerd/conf.d/99-metax-gpu-cdi.toml``, and the main config's
  ``imports`` naming it when no import covers it already. containerd 1.x
  replaces a plugin's whole section with an imported one rather than merging
  the keys, so the drop-in carries a copy of the main config's CRI tables with
  ``enable_cdi`` and ``cdi_spec_dirs`` added: every other CRI setting stays
  as it was, a vendor's runtimes and default runtime included (copied, never
  set). containerd reads its config only at start: a restart, which running
  containers survive (their shims keep them).
- containerd before 1.7: cannot read CDI; nothing to change.
- Docker 25+: ``"features": {"cdi": true}`` in ``/etc/docker/daemon.json``;
  dockerd reads it only at start, and a restart stops every container unless
  ``live-restore`` is on, so it is safe only then.
- Docker before 25: cannot read CDI; nothing to change.

Nothing here ever sets a default runtime. The edits are applied and reverted
byte-identically by :mod:`.runtime_state`. Standard library only.
"""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from .mode import Runtime, containerd_cdi_setting, parse_runtime

CONTAINERD_CONFIG = "/etc/containerd/config.toml"
CONTAINERD_DROPIN = "/etc/containerd/conf.d/99-metax-gpu-cdi.toml"
DOCKER_DAEMON_JSON = "/etc/docker/daemon.json"
CDI_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
CRI_V2 = 'plugins."io.containerd.grpc.v1.cri"'
_HEADER = re.compile(r"^\s*\[+\s*(.+?)\s*\]+\s*(?:#.*)?$")
_IMPORTS = re.compile(r"^(\s*imports\s*=\s*\[)(.*)\](\s*(?:#.*)?)$")
_VERSION = re.compile(r"^\s*version\s*=\s*(\d+)")
DROPIN_HEADER = ("# Written by metax.gpu (container-runtime): CDI for MetaX GPUs. A copy of the CRI tables\n"
                 "# of %s (containerd 1.x replaces a plugin's section with an imported one)\n"
                 "# with enable_cdi and cdi_spec_dirs added. Removed, and the import with it, when the\n"
                 "# component is removed.\n" % CONTAINERD_CONFIG)


@dataclass(frozen=True)
class Edit:
    path: str
    content: Optional[bytes]        # None: the file must not exist


@dataclass(frozen=True)
class Plan:
    """The edits a runtime needs, and whether (and how safely) it must restart to read them."""

    edits: Tuple[Edit, ...]
    reason: str
    restart: Optional[str] = None   # the service to restart after the edits: "containerd", "docker"
    restart_safe: bool = True       # False: a restart would stop running containers

    @property
    def paths(self) -> Tuple[str, ...]:
        return tuple(e.path for e in self.edits)


def _config_version(text: str) -> int:
    for line in text.splitlines():
        if _HEADER.match(line):
            break
        match = _VERSION.match(line)
        if match:
            return int(match.group(1))
    return 1


def cri_tables(text: str, prefix: str = CRI_V2) -> List[str]:
    """The lines of every table whose name is ``prefix`` or under it, in order."""
    out: List[str] = []
    inside = False
    for line in text.splitlines():
        header = _HEADER.match(line)
        if header:
            name = header.group(1)
            inside = name == prefix or name.startswith(prefix + ".")
        if inside:
            out.append(line)
    return out


def containerd_dropin(config: str) -> str:
    """The drop-in: the main config's CRI tables with enable_cdi and cdi_spec_dirs set."""
    ours = ["  enable_cdi = true", "  cdi_spec_dirs = %s" % json.dumps(list(CDI_SPEC_DIRS))]
    lines = cri_tables(config)
    body: List[str] = []
    in_main = False
    placed = False
    for line in lines:
        header = _HEADER.match(line)
        if header:
            in_main = header.group(1) == CRI_V2
            body.append(line)
            if in_main:
                body.extend(ours)
                placed = True
            continue
        if in_main and re.match(r"^\s*(enable_cdi|cdi_spec_dirs)\s*=", line):
            continue        # ours replace the main config's own values of these two keys
        body.append(line)
    if not placed:
        body = ["[%s]" % CRI_V2] + ours + ([""] + body if body else [])
    return DROPIN_HEADER + "\nversion = 2\n\n" + "\n".join(body).rstrip("\n") + "\n"


def _parse_imports(value: str) -> List[str]:
    """The strings of a TOML array's text (basic or literal strings)."""
    return [a or b for a, b in re.findall(r'"([^"]*)"|\'([^\']*)\'', value)]


def with_import(config: str, path: str = CONTAINERD_DROPIN) -> Optional[str]:
    """``config`` with ``path`` in its top-level ``imports`` (None: an import already covers it)."""
    lines = config.split("\n")
    first_table = next((i for i, line in enumerate(lines) if _HEADER.match(line)), len(lines))
    for i in range(first_table):
        match = _IMPORTS.match(lines[i])
        if not match:
            continue
        existing = _parse_imports(match.group(2))
        if any(fnmatch.fnmatch(path, pattern) for pattern in existing):
            return None
        items = existing + [path]
        lines[i] = "%s%s]%s" % (match.group(1), ", ".join(json.dumps(p) for p in items), match.group(3))
        return "\n".join(lines)
    # a new top-level key goes before the first table (after the top-level keys, e.g. version)
    insert = first_table
    while insert > 0 and not lines[insert - 1].strip():
        insert -= 1
    lines.insert(insert, "imports = [%s]" % json.dumps(path))
    return "\n".join(lines)


def containerd_plan(runtime: Runtime, config: Optional[str]) -> Plan:
    major, minor = runtime.version[0], runtime.version[1]
    if major >= 2:
        if containerd_cdi_setting([config or ""]) is False:
            return Plan((), "%s: enable_cdi = false is the administrator's; left alone" % runtime.raw)
        return Plan((), "%s reads CDI by default" % runtime.raw)
    if (major, minor) != (1, 7):
        return Plan((), "%s cannot read CDI (1.7 or later): gpu-device passes device nodes" % runtime.raw)
    text = config if config is not None else "version = 2\n"
    if _config_version(text) != 2:
        return Plan((), "%s: config version %d is not supported; set enable_cdi by hand"
                    % (runtime.raw, _config_version(text)))
    if containerd_cdi_setting([text]) is True:
        return Plan((), "%s: its config already enables CDI" % runtime.raw)
    edits = [Edit(CONTAINERD_DROPIN, containerd_dropin(text).encode("utf-8"))]
    imported = with_import(text)
    if imported is not None:
        edits.insert(0, Edit(CONTAINERD_CONFIG, imported.encode("utf-8")))
    return Plan(tuple(edits), "%s: CDI enabled by a drop-in" % runtime.raw, restart="containerd")


def docker_plan(runtime: Runtime, daemon_json: Optional[str]) -> Plan:
    if runtime.version[0] < 25:
        return Plan((), "%s cannot read CDI (25 or later): device flags instead" % runtime.raw)
    try:
        data = json.loads(daemon_json) if daemon_json and daemon_json.strip() else {}
    except ValueError:
        return Plan((), "%s: %s is not JSON; left alone" % (runtime.raw, DOCKER_DAEMON_JSON))
    if not isinstance(data, dict):
        return Plan((), "%s: %s is not a JSON object; left alone" % (runtime.raw, DOCKER_DAEMON_JSON))
    features = data.get("features")
    if isinstance(features, dict) and features.get("cdi") is True:
        return Plan((), "%s: features.cdi already on" % runtime.raw)
    if features is not None and not isinstance(features, dict):
        return Plan((), "%s: features in %s is not an object; left alone" % (runtime.raw, DOCKER_DAEMON_JSON))
    data["features"] = dict(features or {}, cdi=True)
    content = (json.dumps(data, indent=2) + "\n").encode("utf-8")
    return Plan((Edit(DOCKER_DAEMON_JSON, content),), "%s: features.cdi turned on" % runtime.raw,
                restart="docker", restart_safe=data.get("live-restore") is True)


def runtime_version_of(name: str, version_output: str) -> Optional[str]:
    """``containerd://1.7.24`` from ``containerd --version`` or ``docker://26.1.3`` from
    ``docker version --format '{{.Server.Version}}'`` output (None: not understood)."""
    words = version_output.split()
    if name == "containerd" and len(words) >= 3 and words[0] == "containerd":
        version = words[2]
    elif name == "docker" and len(words) == 1:
        version = words[0]
    else:
        return None
    text = "%s://%s" % (name, version.lstrip("v"))
    return text if parse_runtime(text) is not None else None


def plan(runtime_version: str, files: Dict[str, Optional[str]]) -> Plan:
    """The plan for the runtime ``runtime_version`` names, given its config files' texts (None: absent)."""
    runtime = parse_runtime(runtime_version)
    if runtime is None:
        return Plan((), "cannot read the runtime version %r" % runtime_version)
    if runtime.name == "containerd":
        return containerd_plan(runtime, files.get(CONTAINERD_CONFIG))
    if runtime.name == "docker":
        return docker_plan(runtime, files.get(DOCKER_DAEMON_JSON))
    if runtime.name == "cri-o":
        return Plan((), "%s reads CDI by default" % runtime.raw)
    return Plan((), "%s: unknown runtime; nothing changed" % runtime.raw)
