# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The offline bundle's pusher: ``python3 -m ...registry.cli push BUNDLE DOMAIN/PROJECT``.

Runs from the bundle (standard library + requests on the host), never
imports ansible.  Progress per layer goes to stderr when it is a terminal.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Callable, Dict, List, Optional

from ansible_collections.metax.gpu.plugins.module_utils.errors import MetaxGpuError
from ansible_collections.metax.gpu.plugins.module_utils.registry import api
from ansible_collections.metax.gpu.plugins.module_utils.registry.xzpush import progress_line


def _progress_printer() -> Callable[[str, str, int, int], None]:
    """One line per layer, rewritten in place at most twice a second: bytes, rate and ETA."""
    last: Dict[str, float] = {}
    started: Dict[str, float] = {}

    def show(ref: str, label: str, done: int, total: int) -> None:
        now = time.time()
        first = started.setdefault(label, now)
        if done < total and now - last.get(label, 0) < 0.5:
            return
        last[label] = now
        end = "\n" if done >= total else ""
        name = label[7:19] if label.startswith("sha256:") else label[-40:]
        sys.stderr.write("\r%s %s%s" % (ref[-40:], progress_line(name, done, total, now - first), end))
        sys.stderr.flush()
    return show


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="metax-k8s-images.run push")
    parser.add_argument("command", choices=["push"])
    parser.add_argument("bundle", help="the .run bundle (or a docker archive, plain or .xz)")
    parser.add_argument("target", help="DOMAIN[:port]/PROJECT")
    parser.add_argument("--plain-http", action="store_true", default=os.environ.get("METAX_PLAIN_HTTP") == "1")
    parser.add_argument("--insecure", action="store_true", help="do not verify the registry's certificate")
    parser.add_argument("--ca-file", default=os.environ.get("METAX_CA_FILE", ""))
    parser.add_argument("--username", default=os.environ.get("METAX_REGISTRY_USER", ""))
    parser.add_argument("--auth-file", default="")
    parser.add_argument("--compression", default=os.environ.get("METAX_COMPRESSION", "gzip"))
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args(argv)
    req = api.PushRequest(src=args.bundle, registry=args.target, username=args.username,
                          password=os.environ.get("METAX_REGISTRY_PASSWORD", ""), auth_file=args.auth_file,
                          validate_certs=not args.insecure, ca_path=args.ca_file, plain_http=args.plain_http,
                          compression=args.compression, concurrency=args.concurrency,
                          progress=_progress_printer() if sys.stderr.isatty() else None)
    try:
        result = api.push(req)
    except MetaxGpuError as exc:
        sys.stderr.write("error: %s\n" % exc)
        return 1
    for art in result["artifacts"]:
        sys.stdout.write("%s %s@%s (%d bytes uploaded, %d blobs already there)\n" % (
            "pushed " if art["changed"] else "present", art["ref"], art["digest"], art["bytes_uploaded"],
            art["blobs_skipped"]))
    if os.environ.get("METAX_JSON"):
        sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
