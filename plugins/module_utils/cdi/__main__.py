# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""CLI: ``python -m ansible_collections.metax.gpu.plugins.module_utils.cdi``.

refresh [--host-root R] [--spec-dir D] [--maca-root M]   write the node's spec if it changed
        (exit 1: no usable device, the spec removed; 2: it could not be written)
watch   ... --interval S                                 refresh every S seconds (one JSON line per change)
print   [--host-root R] [--maca-root M]                  print the spec without writing it

``--host-prefix`` is where the runtime sees the host root when it differs
(an agent container that mounts the node under /host).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import List, Optional

from ..host import HostRoot
from ..names import CDI_SPEC_DIR
from . import writer
from .spec import render


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="metax-cdi", description="CDI spec of this node's MetaX GPUs")
    parser.add_argument("command", choices=("refresh", "watch", "print"))
    parser.add_argument("--host-root", default="/")
    parser.add_argument("--host-prefix", default=None)
    parser.add_argument("--spec-dir", default=CDI_SPEC_DIR)
    parser.add_argument("--maca-root", default=writer.MACA_ROOT, help="'' for no MXMACA in containers")
    parser.add_argument("--interval", type=float, default=5.0)
    return parser


def _report(result: writer.Refresh) -> str:
    names = [d["name"] for d in (result.spec or {}).get("devices", [])]
    return json.dumps({"changed": result.changed, "path": result.path, "devices": names,
                       "warnings": result.warnings, "time": time.time()})


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    host = HostRoot(args.host_root, host_prefix=args.host_prefix)
    maca_root = args.maca_root or None
    if args.command == "print":
        current = writer.node_spec(host, maca_root)
        for warning in current.warnings:
            sys.stderr.write("warning: %s\n" % warning)
        if current.spec is None:
            return 1
        sys.stdout.write(render(current.spec).decode("utf-8"))
        return 0
    if args.command == "refresh":
        try:
            result = writer.refresh(host, args.spec_dir, maca_root)
        except OSError as exc:      # e.g. not root: metax-docker reports this line
            sys.stderr.write("error: cannot write the spec in %s: %s\n" % (args.spec_dir, exc))
            return 2
        sys.stdout.write(_report(result) + "\n")
        return 0 if result.spec is not None else 1

    def changed(result: writer.Refresh) -> None:
        if result.changed:
            sys.stdout.write(_report(result) + "\n")
            sys.stdout.flush()

    try:
        writer.watch(host, args.spec_dir, args.interval, maca_root, on_refresh=changed)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
