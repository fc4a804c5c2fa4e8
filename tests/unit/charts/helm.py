# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Finding the helm binary and rendering the collection's charts in tests."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
CHARTS = ROOT / "files" / "charts"
CHART = CHARTS / "metax-gpu-extensions"


def find_helm() -> Optional[str]:
    """$METAX_HELM, helm on PATH, else the one scripts/cluster builds into the cache."""
    explicit = os.environ.get("METAX_HELM")
    if explicit:
        return explicit
    on_path = shutil.which("helm")
    if on_path:
        return on_path
    cache = os.environ.get("METAX_CACHE_DIR", os.path.expanduser("~/.cache/metax-gpu"))
    found = sorted(glob.glob(os.path.join(cache, "helm", "*", "bin", "helm")))
    return found[-1] if found else None


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false")


def helm_required(helm: Optional[str]) -> Any:
    """Mark for tests that need helm: skip without it, except in CI, where a missing helm fails loudly.

    scripts/run-tests.sh builds helm before the unit phase; a CI run that has
    none must not pass with the chart untested.
    """
    if helm is None and in_ci():
        raise RuntimeError("helm not found in CI (METAX_HELM, PATH or the cache of scripts/cluster/build-helm.sh)")
    return pytest.mark.skipif(helm is None, reason="helm not found (METAX_HELM, PATH or the cache of "
                                                   "scripts/cluster/build-helm.sh)")


def render(helm: str, values: Dict[str, Any], sets: Sequence[str] = (),
           namespace: str = "metax-gpu", extra: Sequence[str] = (),
           chart: Path = CHART, api_versions: Sequence[str] = ()) -> Tuple[int, List[Dict[str, Any]], str]:
    """(rc, objects, stderr) of `helm template` with ``values`` (a values file), ``--set`` pairs and ``extra`` flags.

    ``api_versions``: what the cluster would serve on top of the built-in
    APIs (``monitoring.coreos.com/v1/ServiceMonitor``), for ``.Capabilities``.
    """
    args = [helm, "template", "metax-gpu-extensions", str(chart), "--namespace", namespace,
            "--values", "-"] + list(extra)
    for pair in sets:
        args += ["--set", pair]
    for api in api_versions:
        args += ["--api-versions", api]
    proc = subprocess.run(args, input=yaml.safe_dump(values), capture_output=True, text=True,
                          timeout=60, check=False)
    objects = [doc for doc in yaml.safe_load_all(proc.stdout) if doc] if proc.returncode == 0 else []
    return proc.returncode, objects, proc.stderr
