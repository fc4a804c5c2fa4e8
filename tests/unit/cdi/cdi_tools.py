# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The CDI library's own reading of our specs: scripts/cluster/build-cdi-validate.sh's binary."""

from __future__ import annotations

import glob
import json
import os
import subprocess
from typing import Any, Dict, List, Optional

import pytest

CDI_VERSION = "v1.1.1"


def find_cdi_validate() -> Optional[str]:
    """$METAX_CDI_VALIDATE, else the pinned version's build in the cache, else any cached build."""
    explicit = os.environ.get("METAX_CDI_VALIDATE")
    if explicit:
        return explicit
    cache = os.environ.get("METAX_CACHE_DIR", os.path.expanduser("~/.cache/metax-gpu"))
    pinned = os.path.join(cache, "cdi-validate", CDI_VERSION, "bin", "cdi-validate")
    if os.access(pinned, os.X_OK):
        return pinned
    found = sorted(glob.glob(os.path.join(cache, "cdi-validate", "*", "bin", "cdi-validate")))
    return found[-1] if found else None


CDI_VALIDATE = find_cdi_validate()
needs_validator = pytest.mark.skipif(
    CDI_VALIDATE is None, reason="cdi-validate not built (scripts/cluster/build-cdi-validate.sh, the deps phase)")


def validate(*paths: str) -> List[Dict[str, Any]]:
    assert CDI_VALIDATE is not None
    proc = subprocess.run([CDI_VALIDATE] + list(paths), capture_output=True, text=True, check=False)
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout)


def inject(spec_dir: str, *names: str) -> Dict[str, Any]:
    """What the library puts into an OCI spec for ``names``; raises AssertionError with its message."""
    assert CDI_VALIDATE is not None
    proc = subprocess.run([CDI_VALIDATE, "-inject", spec_dir] + list(names), capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)
