# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""What every scale benchmark (benchmarks/scale_*.py) sets up the same way.

Importing it puts the collection and tests/ (and tests/integration, for the
private control plane) on ``sys.path``, so that a benchmark runs as a plain
script from the checkout. :func:`arguments` gives the common ``--sizes`` and
``--json`` options, :func:`write_json` the figures' file.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import ssl
import sys
import urllib.request
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
for _path in (os.path.join(REPO, ".build", "collections"), os.path.join(REPO, "tests"),
              os.path.join(REPO, "tests", "integration")):
    if _path not in sys.path:
        sys.path.insert(0, _path)


def arguments(doc: Optional[str], sizes: bool = True) -> argparse.ArgumentParser:
    """A parser with the benchmark's first docstring paragraph, ``--json`` and (by default) ``--sizes``."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n", maxsplit=1)[0])
    if sizes:
        parser.add_argument("--sizes", default="500,1000,2000", type=size_list,
                            help="fake node counts, ascending (default %(default)s)")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    return parser


def size_list(text: str) -> List[int]:
    return sorted(int(s) for s in text.split(",") if s.strip())


def write_json(path: Optional[str], rows: Any) -> None:
    if path:
        with open(path, "w", encoding="utf-8") as out:
            json.dump(rows, out, indent=1)


WRITES = ("POST", "PUT", "PATCH", "DELETE", "APPLY")


def apiserver_requests(port: int, token: str, by_resource: bool = False) -> Dict[str, float]:
    """The API server's ``apiserver_request_total`` on 127.0.0.1:``port``, summed by verb; writes
    by verb and resource ("PATCH nodes"), or every verb so with ``by_resource``."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    req = urllib.request.Request("https://127.0.0.1:%d/metrics" % port, headers={"Authorization": "Bearer " + token})
    with urllib.request.urlopen(req, context=ctx, timeout=30) as resp:
        text = resp.read().decode()
    out: Dict[str, float] = {}
    for match in re.finditer(r'^apiserver_request_total\{([^}]*)\}\s+(\S+)$', text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
        verb = labels.get("verb", "?")
        if by_resource or verb in WRITES:
            verb += " " + labels.get("resource", "?")
        out[verb] = out.get(verb, 0.0) + float(match.group(2))
    return out
