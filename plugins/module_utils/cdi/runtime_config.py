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

The RuntimeClass ``metax`` (real MetaX clusters have it; workloads name
``runtimeClassName: metax``) needs a containerd runtime handler ``metax``.
It is added beside the others, in the same drop-in, as a copy of the default
runtime's tables (runc v2 on a stock node: the GPUs come through CDI or the
device plugin, never through the runtime, so a pod naming it gets what the
same pod gets without it), and never made the default:

- containerd 2.x merges an imported file's tables key by key into the main
  config's: the drop-in holds only the handler (``version`` as the main
  config's: containerd refuses a drop-in of a higher version).
- containerd 1.x replaces the CRI section: the handler goes into the copy of
  the CRI tables (with runc's built-in table when the main config relies on it,
  which the copy would otherwise drop).
- config version 2 (``plugins."io.containerd.grpc.v1.cri"``) and 3
  (``plugins."io.containerd.cri.v1.runtime"``) layouts; version 1 is left alone.
- a ``metax`` runtime the node already has (MetaX's own runtime defines it,
  and makes it the default: samples/kubernetes) is the node's: never touched
  nor duplicated. A default runtime written in a form the copy does not read
  (dotted keys, an inline table) is reported, not guessed.
- without a config.toml (containerd on its built-in defaults) no file is made
  for the handler alone; 1.7 gets one anyway for CDI, and the handler with it.

containerd reads its config only at start: a restart (running containers
keep running). Nothing here ever sets a default runtime. The edits are
applied and reverted byte-identically by :mod:`.runtime_state`. Standard
library only.
"""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from ..names import RUNTIME_HANDLER
from .mode import Runtime, containerd_cdi_setting, parse_runtime

CONTAINERD_CONFIG = "/etc/containerd/config.toml"
CONTAINERD_DROPIN = "/etc/containerd/conf.d/99-metax-gpu-cdi.toml"
DOCKER_DAEMON_JSON = "/etc/docker/daemon.json"
CDI_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
CRI_V2 = 'plugins."io.containerd.grpc.v1.cri"'
# Where a config version keeps the CRI runtimes (version 2: containerd 1.x and 2.x; 3: 2.x).
RUNTIMES = {2: ("plugins", "io.containerd.grpc.v1.cri", "containerd", "runtimes"),
            3: ("plugins", "io.containerd.cri.v1.runtime", "containerd", "runtimes")}
# containerd's built-in default runtime (1.x and 2.x), when a config does not define it.
BUILTIN_RUNTIME = "runc"
BUILTIN_RUNTIME_TYPE = "io.containerd.runc.v2"
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
_KEY_PART = re.compile(r"""\s*(?:"((?:[^"\\]|\\.)*)"|'([^']*)'|([A-Za-z0-9_-]+))\s*(?:\.|$)""")
_DEFAULT_RUNTIME = re.compile(r"""^\s*default_runtime_name\s*=\s*(?:"([^"]*)"|'([^']*)')""")
_HEADER = re.compile(r"^\s*\[+\s*(.+?)\s*\]+\s*(?:#.*)?$")
_IMPORTS = re.compile(r"^(\s*imports\s*=\s*\[)(.*)\](\s*(?:#.*)?)$")
_VERSION = re.compile(r"^\s*version\s*=\s*(\d+)")
DROPIN_HEADER = ("# Written by metax.gpu (container-runtime). A copy of the CRI tables of\n"
                 "# %s (containerd 1.x replaces a plugin's section with an imported one)\n"
                 "# with %%s added.\n# Removed, and the import with it, when the component is removed.\n"
                 % CONTAINERD_CONFIG)
DROPIN_CDI = "enable_cdi and cdi_spec_dirs (CDI for MetaX GPUs)"
DROPIN_HANDLER = ("the runtime handler %s of the RuntimeClass %s\n# (a copy of the default runtime, never the default)"
                  % (RUNTIME_HANDLER, RUNTIME_HANDLER))
HANDLER_HEADER = ("# Written by metax.gpu (container-runtime): the runtime handler %s of the RuntimeClass %s,\n"
                  "# a copy of the default runtime (never the default itself). containerd 2.x merges an\n"
                  "# imported file's tables into %s key by key. Removed, and the import\n"
                  "# with it, when the component is removed.\n" % (RUNTIME_HANDLER, RUNTIME_HANDLER, CONTAINERD_CONFIG))


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
    # whether the runtime reads CDI only after that restart (False: the restart is for the
    # metax runtime handler alone; CDI is read already)
    restart_for_cdi: bool = True

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


def containerd_dropin(config: str, cdi: bool = True, handler: Sequence[str] = ()) -> str:
    """The containerd 1.x drop-in: the main config's CRI tables, with enable_cdi and cdi_spec_dirs
    set when ``cdi``, and the tables of the runtime handler ``handler`` appended."""
    ours = ["  enable_cdi = true", "  cdi_spec_dirs = %s" % json.dumps(list(CDI_SPEC_DIRS))] if cdi else []
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
        if cdi and in_main and re.match(r"^\s*(enable_cdi|cdi_spec_dirs)\s*=", line):
            continue        # ours replace the main config's own values of these two keys
        body.append(line)
    if not placed and cdi:
        body = ["[%s]" % CRI_V2] + ours + ([""] + body if body else [])
    text = "\n".join(body).rstrip("\n")
    if handler:
        text = (text + "\n\n" if text else "") + "\n".join(handler).rstrip("\n")
    added = " and\n# ".join(([DROPIN_CDI] if cdi else []) + ([DROPIN_HANDLER] if handler else []))
    return DROPIN_HEADER % added + "\nversion = 2\n\n" + text + "\n"


def key_path(text: str) -> Optional[Tuple[str, ...]]:
    """The parts of a TOML dotted key (``plugins."io.containerd.grpc.v1.cri".containerd``); None: not one."""
    parts: List[str] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        match = _KEY_PART.match(text, pos)
        if not match or match.end() == pos:
            return None
        basic, literal, bare = match.groups()
        if basic is not None:
            parts.append(json.loads('"%s"' % basic))
        else:
            parts.append(literal if literal is not None else bare)
        pos = match.end()
    return tuple(parts) or None


def _render_key(parts: Sequence[str]) -> str:
    return ".".join(p if _BARE_KEY.match(p) else json.dumps(p) for p in parts)


def _tables(text: str) -> List[Tuple[Optional[Tuple[str, ...]], List[str]]]:
    """The config's tables in order: (key path of the header, or None before the first; the lines under it)."""
    out: List[Tuple[Optional[Tuple[str, ...]], List[str]]] = [(None, [])]
    for line in text.split("\n"):
        header = _HEADER.match(line)
        if header and not line.lstrip().startswith("[["):
            out.append((key_path(header.group(1)), []))
        else:
            out[-1][1].append(line)
    return out


def default_runtime(text: str, version: int) -> str:
    """The name of the CRI's default runtime in a config of ``version`` (containerd's: runc)."""
    containerd = RUNTIMES[version][:-1]
    for path, lines in _tables(text):
        if path == containerd:
            for line in lines:
                match = _DEFAULT_RUNTIME.match(line)
                if match:
                    return match.group(1) if match.group(1) is not None else match.group(2)
    return BUILTIN_RUNTIME


def _mentions_runtime(text: str, name: str) -> bool:
    """Whether the text names runtime ``name`` in any form: a header, dotted keys, an inline table."""
    return re.search(r"""runtimes\s*\.\s*["']?%s["']?\s*[\].=]""" % re.escape(name), text) is not None or \
        re.search(r"""(^|[{,\s])["']?%s["']?\s*=\s*\{""" % re.escape(name), text, re.MULTILINE) is not None


def imports_of(config: str) -> List[str]:
    """The top-level ``imports`` of a containerd config, as node paths or globs (relative ones resolved
    against the config's directory, as containerd does)."""
    base = CONTAINERD_CONFIG.rsplit("/", 1)[0]
    for line in config.split("\n"):
        if _HEADER.match(line):
            break
        match = _IMPORTS.match(line)
        if match:
            return [p if p.startswith("/") else base + "/" + p for p in _parse_imports(match.group(2))]
    return []


def runtime_handler(text: str, version: int, with_builtin: bool = False,
                    imported: Optional[Dict[str, str]] = None) -> Tuple[Optional[List[str]], str]:
    """The tables of the runtime handler ``metax`` for a config of ``version``, a copy of its default
    runtime's, and why; None (with the reason) when it is not to be added. ``with_builtin``: also the
    built-in default runtime's table when the config relies on it (containerd 1.x, whose imported CRI
    section replaces the main one, would lose it). ``imported``: the texts of the files the config
    imports (not ours), by path: a metax defined there is the node's too."""
    if version not in RUNTIMES:
        return None, "config version %d: no runtime handler %s (versions 2 and 3 are supported)" % (
            version, RUNTIME_HANDLER)
    if _mentions_runtime(text, RUNTIME_HANDLER):
        return None, "its own runtime %s is kept as it is (the RuntimeClass %s runs on it)" % (
            RUNTIME_HANDLER, RUNTIME_HANDLER)
    for name, other in sorted((imported or {}).items()):
        if _mentions_runtime(other, RUNTIME_HANDLER):
            return None, "its own runtime %s (%s) is kept as it is (the RuntimeClass %s runs on it)" % (
                RUNTIME_HANDLER, name, RUNTIME_HANDLER)
    runtimes = RUNTIMES[version]
    default = default_runtime(text, version)
    own = runtimes + (default,)
    copied: List[str] = []
    for path, lines in _tables(text):
        if path is not None and path[:len(own)] == own:
            body = list(lines)
            while body and not body[-1].strip():
                body.pop()
            renamed = runtimes + (RUNTIME_HANDLER,) + path[len(own):]
            copied += ["[%s]" % _render_key(renamed)] + body + [""]
    if copied:
        return copied[:-1], "runtime handler %s added, a copy of the default runtime %s" % (RUNTIME_HANDLER, default)
    if _mentions_runtime(text, default):
        return None, ("its default runtime %s is written in a form container-runtime does not copy (dotted keys "
                      "or an inline table): no runtime handler %s; add one by hand" % (default, RUNTIME_HANDLER))
    if default != BUILTIN_RUNTIME:
        return None, "its default runtime %s is not defined in %s: no runtime handler %s" % (
            default, CONTAINERD_CONFIG, RUNTIME_HANDLER)
    tables = ["[%s]" % _render_key(runtimes + (RUNTIME_HANDLER,)), '  runtime_type = "%s"' % BUILTIN_RUNTIME_TYPE]
    if with_builtin:
        tables = ["[%s]" % _render_key(own), '  runtime_type = "%s"' % BUILTIN_RUNTIME_TYPE, ""] + tables
    return tables, "runtime handler %s added, a copy of the built-in default runtime %s" % (RUNTIME_HANDLER, default)


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


def containerd_plan(runtime: Runtime, config: Optional[str], imported: Optional[Dict[str, str]] = None) -> Plan:
    """``imported``: the texts of the other files the config imports, by node path (see :func:`imported_paths`)."""
    major, minor = runtime.version[0], runtime.version[1]
    text = config if config is not None else ("version = 3\n" if major >= 2 else "version = 2\n")
    version = _config_version(text)
    cdi = False
    if major >= 2:
        if containerd_cdi_setting([text]) is False:
            why = "%s: enable_cdi = false is the administrator's; left alone" % runtime.raw
        else:
            why = "%s reads CDI by default" % runtime.raw
    elif (major, minor) != (1, 7):
        why = "%s cannot read CDI (1.7 or later): gpu-device passes device nodes" % runtime.raw
    elif version != 2:
        why = "%s: config version %d is not supported; set enable_cdi by hand" % (runtime.raw, version)
    elif containerd_cdi_setting([text]) is True:
        why = "%s: its config already enables CDI" % runtime.raw
    else:
        cdi = True
        why = "%s: CDI enabled by a drop-in" % runtime.raw
    if config is None and not cdi:
        # containerd on its built-in defaults: no main config is made for the handler alone
        handler, handler_why = None, "no %s: no runtime handler %s" % (CONTAINERD_CONFIG, RUNTIME_HANDLER)
    elif major < 2 and version != 2:
        handler, handler_why = None, "config version %d: no runtime handler %s" % (version, RUNTIME_HANDLER)
    else:
        handler, handler_why = runtime_handler(text, version, with_builtin=major < 2, imported=imported)
    why = "%s; %s" % (why, handler_why)
    if not cdi and not handler:
        return Plan((), why)
    if major >= 2:
        dropin = HANDLER_HEADER + "\nversion = %d\n\n" % version + "\n".join(handler or ()).rstrip("\n") + "\n"
    else:
        dropin = containerd_dropin(text, cdi=cdi, handler=handler or ())
    edits = [Edit(CONTAINERD_DROPIN, dropin.encode("utf-8"))]
    main = with_import(text)
    if main is not None:
        edits.insert(0, Edit(CONTAINERD_CONFIG, main.encode("utf-8")))
    return Plan(tuple(edits), why, restart="containerd", restart_for_cdi=cdi)


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
    """The plan for the runtime ``runtime_version`` names, given its config files' texts (None: absent):
    containerd's config.toml, Docker's daemon.json, and the files config.toml imports other than ours
    (:func:`cdi.runtime_state.config_files` reads them all)."""
    runtime = parse_runtime(runtime_version)
    if runtime is None:
        return Plan((), "cannot read the runtime version %r" % runtime_version)
    if runtime.name == "containerd":
        imported = {p: t for p, t in files.items()
                    if p not in (CONTAINERD_CONFIG, CONTAINERD_DROPIN, DOCKER_DAEMON_JSON) and t is not None}
        return containerd_plan(runtime, files.get(CONTAINERD_CONFIG), imported)
    if runtime.name == "docker":
        return docker_plan(runtime, files.get(DOCKER_DAEMON_JSON))
    if runtime.name == "cri-o":
        return Plan((), "%s reads CDI by default" % runtime.raw)
    return Plan((), "%s: unknown runtime; nothing changed" % runtime.raw)
