# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""roles/metax_docker/files/metax-docker loaded as a module (it has no .py name), for the unit tests of its
logic and the integration tests that run it in front of the real engines."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "roles" / "metax_docker" / "files" / "metax-docker"


def _load():
    loader = importlib.machinery.SourceFileLoader("metax_docker", str(SCRIPT))
    spec = importlib.util.spec_from_loader("metax_docker", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


md = _load()
# the file in the repository says "python" (sanity's shebang rule); the role installs it with python3
SCRIPT_ARGV = [sys.executable, str(SCRIPT)]
