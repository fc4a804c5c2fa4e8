"""What the scripts that generate checked-in files share: the staleness test and the command line.

scripts/gen_operator_values.py and scripts/gen_node_agent_policy.py each
compute the files they own (path relative to the root -> content); this module
compares them with the tree, writes what differs, and gives both the same
``--check`` / ``--root`` interface, so CI and a developer see one behaviour.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Iterable, List, Mapping, Sequence, Tuple, Type, Union

Content = Union[str, bytes]


def _as_bytes(content: Content) -> bytes:
    return content.encode("utf-8") if isinstance(content, str) else content


def stale_paths(root: str, want: Mapping[str, Content], extra: Iterable[str] = ()) -> List[str]:
    """Paths of ``want`` whose file differs or is missing, plus ``extra`` (files that should not be there)."""
    stale = []
    for rel, content in want.items():
        try:
            with open(os.path.join(root, rel), "rb") as handle:
                if handle.read() == _as_bytes(content):
                    continue
        except OSError:
            pass
        stale.append(rel)
    return sorted(set(stale).union(extra))


def bring_up_to_date(root: str, want: Mapping[str, Content], stale: Sequence[str]) -> List[str]:
    """Write each stale path that ``want`` has, remove the others; returns ``stale``."""
    for rel in stale:
        path = os.path.join(root, rel)
        if rel in want:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as handle:
                handle.write(_as_bytes(want[rel]))
        else:
            os.unlink(path)
    return list(stale)


def main(argv: Sequence[str], doc: str, default_root: str, script: str,
         out_of_date: Callable[[str], List[str]], write: Callable[[str], List[str]],
         errors: Tuple[Type[Exception], ...]) -> int:
    """The generators' command line: write what is out of date, or with ``--check`` only name it (exit 1)."""
    name = os.path.splitext(os.path.basename(script))[0]
    parser = argparse.ArgumentParser(description=doc.split("\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="only report files out of date (exit 1 if any)")
    parser.add_argument("--root", default=default_root, help="the collection's root (default: this checkout)")
    args = parser.parse_args(argv)
    try:
        if args.check:
            stale = out_of_date(args.root)
            for rel in stale:
                print("out of date: %s (run %s)" % (rel, script))
            return 1 if stale else 0
        for rel in write(args.root):
            print("wrote %s" % rel)
    except errors as exc:
        print("%s: %s" % (name, exc), file=sys.stderr)
        return 2
    return 0
