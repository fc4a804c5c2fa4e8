# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Who started the running local cluster, and may this checkout reuse it?

`cluster.sh up` records in the state dir the source tree it ran from, a hash
of the cluster scripts and the node presets (NODES). A later `up` (a test
session runs one too) compares that record with its own: a cluster started by
another checkout, by other cluster scripts or with other nodes is never
reused silently -- it is taken down and replaced, and the reason is logged.
METAX_CLUSTER_REUSE=1 reuses a foreign cluster on purpose (logged as such),
e.g. several worktrees sharing the one cluster of a machine.

Usage: identity.py record FILE REPO SCRIPTS_DIR[:DIR...] NODES
       identity.py check FILE REPO SCRIPTS_DIR NODES   -> prints "fresh", "reuse[: why]" or "replace: why"

Standard library only: it runs before the project's venv may exist.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from typing import Dict, Optional, Tuple

FIELDS = ("source", "scripts_sha256", "nodes")


def scripts_hash(scripts_dir: str) -> str:
    """sha256 over the names and contents of the cluster scripts (what decides how a cluster is built).

    SCRIPTS_DIR may name several directories separated by ":" (cluster.sh passes scripts/cluster and the
    Python package tests/localcluster it runs); one directory hashes as it always did.
    """
    dirs = scripts_dir.split(os.pathsep)
    digest = hashlib.sha256()
    for i, top in enumerate(dirs):
        prefix = "" if len(dirs) == 1 else "%d:" % i
        for root, subdirs, files in os.walk(top):
            subdirs[:] = sorted(d for d in subdirs if d != "__pycache__")
            for name in sorted(files):
                if name.endswith((".pyc", ".pyo")):
                    continue
                path = os.path.join(root, name)
                digest.update((prefix + os.path.relpath(path, top)).encode() + b"\0")
                with open(path, "rb") as fh:
                    digest.update(fh.read())
                digest.update(b"\0")
    return digest.hexdigest()


def current(repo: str, scripts_dir: str, nodes: str) -> Dict[str, str]:
    return {"source": os.path.realpath(repo), "scripts_sha256": scripts_hash(scripts_dir),
            "nodes": " ".join(nodes.split())}


def decide(recorded: Optional[Dict[str, str]], running: bool, mine: Dict[str, str],
           allow_foreign: bool = False) -> Tuple[str, str]:
    """("fresh" | "reuse" | "replace", reason) for a cluster `up` about to start.

    recorded: the running cluster's record (None when it has none); running:
    whether a cluster's state is there at all.
    """
    if not running:
        return "fresh", ""
    if not recorded:
        why = "the running cluster has no record of who started it (an older cluster.sh)"
    else:
        diffs = []
        if recorded.get("source") != mine["source"]:
            diffs.append("started from %s, not from this checkout %s" % (recorded.get("source"), mine["source"]))
        if recorded.get("scripts_sha256") != mine["scripts_sha256"]:
            diffs.append("built by other cluster scripts (sha256 %.12s, these are %.12s)"
                         % (recorded.get("scripts_sha256") or "?", mine["scripts_sha256"]))
        if recorded.get("nodes") != mine["nodes"]:
            diffs.append('its nodes are "%s", NODES asks for "%s"' % (recorded.get("nodes"), mine["nodes"]))
        if not diffs:
            return "reuse", ""
        why = "; ".join(diffs)
    if allow_foreign and (not recorded or recorded.get("nodes") == mine["nodes"]):
        return "reuse", "METAX_CLUSTER_REUSE=1 although " + why
    return "replace", why


def load(path: str) -> Optional[Dict[str, str]]:
    try:
        with open(path) as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def main(argv) -> int:
    if len(argv) != 6 or argv[1] not in ("record", "check"):
        sys.stderr.write(__doc__)
        return 2
    action, path, repo, scripts_dir, nodes = argv[1:]
    mine = current(repo, scripts_dir, nodes)
    if action == "record":
        tmp = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".tmp")
        with open(tmp, "w") as fh:
            json.dump(mine, fh, indent=2, sort_keys=True)
            fh.write("\n")
        os.replace(tmp, path)
        return 0
    running = os.path.isdir(os.path.dirname(path)) and os.path.exists(
        os.path.join(os.path.dirname(path), "node-table"))
    allow = os.environ.get("METAX_CLUSTER_REUSE", "") not in ("", "0")
    verdict, why = decide(load(path), running, mine, allow)
    print(verdict + (": " + why if why else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
