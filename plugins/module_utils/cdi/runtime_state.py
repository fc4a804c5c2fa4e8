# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Apply a runtime plan (:mod:`.runtime_config`) to a node, and revert it byte-identically.

Before a file is first changed, its original bytes (or its absence) and mode
are recorded in a state file on the node; the state is written before the
file, so a crash in between leaves nothing unrecorded. Revert puts every
recorded file back exactly as it was -- bytes, absence and mode -- when it
still holds what was written. A file someone changed since is left as it is
(with a message): their change would be lost otherwise.

Paths are node paths under a :class:`HostRoot` (``/`` on a node, ``/host``
in the container-runtime pod, a simulated root in tests).
Standard library only: this runs on nodes.
"""

from __future__ import annotations

import base64
import glob
import json
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from ..host import HostRoot, replace_file
from .runtime_config import CONTAINERD_CONFIG, CONTAINERD_DROPIN, DOCKER_DAEMON_JSON, Edit, Plan, imports_of

STATE_FILE = "/var/lib/metax-gpu/container-runtime/state.json"


@dataclass
class Outcome:
    changed: List[str] = field(default_factory=list)     # node paths written, restored or removed
    kept: List[str] = field(default_factory=list)        # changed by someone else since: left alone
    messages: List[str] = field(default_factory=list)


def _read(host: HostRoot, path: str) -> Optional[bytes]:
    try:
        with open(host.join(path), "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def _b64(data: Optional[bytes]) -> Optional[str]:
    return None if data is None else base64.b64encode(data).decode("ascii")


def _unb64(text: Optional[str]) -> Optional[bytes]:
    return None if text is None else base64.b64decode(text)


def config_files(host: HostRoot) -> Dict[str, Optional[str]]:
    """The runtime config files a plan reads, from the node, by node path (None: absent): containerd's
    config.toml and the files it imports (globs expanded; ours left out: the plan writes it), and
    Docker's daemon.json."""
    out: Dict[str, Optional[str]] = {}
    for path in (CONTAINERD_CONFIG, DOCKER_DAEMON_JSON):
        out[path] = host.read_text(path) if host.exists(path) else None
    for pattern in imports_of(out[CONTAINERD_CONFIG] or ""):
        for local in sorted(glob.glob(host.join(pattern))):
            path = "/" + os.path.relpath(local, host.path) if host.path != "/" else local
            if path != CONTAINERD_DROPIN and path not in out and os.path.isfile(local):
                out[path] = host.read_text(path)
    return out


def load_state(host: HostRoot, state_file: str = STATE_FILE) -> Dict[str, Dict[str, object]]:
    data = _read(host, state_file)
    return dict(json.loads(data.decode("utf-8")).get("files", {})) if data else {}


def _save_state(host: HostRoot, files: Dict[str, Dict[str, object]], state_file: str) -> None:
    path = host.join(state_file)
    if not files:
        if os.path.exists(path):
            os.unlink(path)
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    replace_file(path, (json.dumps({"files": files}, indent=2, sort_keys=True) + "\n").encode("utf-8"), 0o600)


def _missing_dirs(host: HostRoot, path: str) -> List[str]:
    """The node directories above ``path`` that do not exist yet, outermost first."""
    out: List[str] = []
    parent = os.path.dirname(path)
    while parent not in ("", "/") and not os.path.isdir(host.join(parent)):
        out.insert(0, parent)
        parent = os.path.dirname(parent)
    return out


def _put(host: HostRoot, path: str, content: Optional[bytes], mode: int) -> None:
    local = host.join(path)
    if content is None:
        if os.path.lexists(local):
            os.unlink(local)
        return
    os.makedirs(os.path.dirname(local), exist_ok=True)
    replace_file(local, content, mode)


def apply(host: HostRoot, plan: Plan, state_file: str = STATE_FILE) -> Outcome:
    """Make the plan's files hold its contents; record each original first. Idempotent."""
    files = load_state(host, state_file)
    outcome = Outcome()
    for edit in plan.edits:
        current = _read(host, edit.path)
        if current == edit.content:
            continue
        if edit.path not in files:        # the first original is the one revert restores
            local = host.join(edit.path)
            mode = os.stat(local).st_mode & 0o7777 if current is not None else 0o644
            # directories made for the file go again with it
            files[edit.path] = {"original": _b64(current), "mode": mode,
                                "made_dirs": _missing_dirs(host, edit.path)}
        files[edit.path]["written"] = _b64(edit.content)
        _save_state(host, files, state_file)
        _put(host, edit.path, edit.content, int(files[edit.path]["mode"]))   # type: ignore[call-overload]
        outcome.changed.append(edit.path)
    return outcome


def revert(host: HostRoot, state_file: str = STATE_FILE) -> Outcome:
    """Put back every file :func:`apply` changed and that still holds what it wrote."""
    files = load_state(host, state_file)
    outcome = Outcome()
    for path in sorted(files):
        record = files[path]
        written = _unb64(record.get("written"))         # type: ignore[arg-type]
        current = _read(host, path)
        if current != written:
            outcome.kept.append(path)
            outcome.messages.append("%s changed since metax.gpu wrote it: left as it is" % path)
            continue
        _put(host, path, _unb64(record.get("original")), int(record["mode"]))   # type: ignore[arg-type,call-overload]
        outcome.changed.append(path)
        for directory in reversed(list(record.get("made_dirs") or [])):   # type: ignore[call-overload]
            try:
                os.rmdir(host.join(directory))
            except OSError:
                break           # not empty: someone else's files are there
    _save_state(host, {}, state_file)
    for directory in (os.path.dirname(state_file), os.path.dirname(os.path.dirname(state_file))):
        try:
            os.rmdir(host.join(directory))      # ours, when nothing else is in it
        except OSError:
            break
    return outcome


def pending(host: HostRoot, plan: Plan) -> List[Edit]:
    """The plan's edits the node does not hold yet (what :func:`apply` would write)."""
    return [e for e in plan.edits if _read(host, e.path) != e.content]
