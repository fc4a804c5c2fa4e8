# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""What the driver code records on the node (a ``.run`` install, a prebuilt install, every
install's declared kernel driver) under ``var/lib/metax-gpu``, and how it reads them back."""

from __future__ import annotations

import json
import os
from typing import Mapping, Optional

from ..host import HostRoot

# Where the module records a driver installed from the vendor .run (it has no package database).
RUN_RECORD = "var/lib/metax-gpu/driver-run.json"
# A driver installed from a prebuilt tree: its version and the files copied (the uninstaller's list).
PREBUILT_RECORD = "var/lib/metax-gpu/driver-prebuilt.json"
# Every install: the payload's own version and the kernel driver it declared (what the module says).
DRIVER_RECORD = "var/lib/metax-gpu/driver-payload.json"


def read_record(host: HostRoot, rel: str) -> Optional[dict]:
    if not host.exists(rel):
        return None
    try:
        found = json.loads(host.read_text(rel))
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def run_record(host: HostRoot) -> Optional[dict]:
    return read_record(host, RUN_RECORD)


def declared_driver(host: HostRoot, version: Optional[str]) -> Optional[str]:
    """The kernel driver the installed payload ``version`` declared when it was installed
    (:data:`DRIVER_RECORD`); ``version`` itself when the record is of another (our numbering)."""
    record = read_record(host, DRIVER_RECORD) or {}
    if version is not None and record.get("version") == version and record.get("driver_version"):
        return str(record["driver_version"])
    return version


def write_record(host: HostRoot, rel: str, record: Mapping[str, object]) -> None:
    os.makedirs(os.path.dirname(host.join(rel)), exist_ok=True)
    host.write_file_atomic(rel, (json.dumps(dict(record), sort_keys=True) + "\n").encode())


def unlink(host: HostRoot, rel: str) -> None:
    if os.path.lexists(host.join(rel)):
        os.unlink(host.join(rel))
