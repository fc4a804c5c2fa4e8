# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Finding the helm binary and rendering the collection's charts in tests."""

from __future__ import annotations

import functools
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
    # a file named in ``extra`` may change between renders: those are not kept
    own_chart = not any(os.path.exists(arg) for arg in extra)
    rc, stdout, stderr = template(tuple(args), yaml.safe_dump(values), own_chart)
    objects = load_all(stdout) if rc == 0 else []
    return rc, objects, stderr


# libyaml's parser when PyYAML has it: the same safe constructor, a tenth of the time (parsing
# helm's output in pure Python was most of the chart tests' CPU time)
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_all(text: str) -> List[Any]:
    """The non-empty documents of a multi-document YAML text (helm's output), safely loaded."""
    return [doc for doc in yaml.load_all(text, Loader=_LOADER) if doc]  # nosec B506: a safe loader


def template(args: Tuple[str, ...], stdin: str, keep: bool = True) -> Tuple[int, str, str]:
    """(rc, stdout, stderr) of a ``helm template`` command line with ``stdin``.

    With ``keep``, renders of the repository's own charts are kept for the test session (tests
    render the same defaults again and again; nothing changes the repository's charts during a
    run). A chart anywhere else (a test's modified copy) is rendered each time."""
    if keep and any(arg.startswith(str(CHARTS) + os.sep) for arg in args):
        return _template_cached(args, stdin)
    return _run_template(args, stdin)


@functools.lru_cache(maxsize=None)
def _template_cached(args: Tuple[str, ...], stdin: str) -> Tuple[int, str, str]:
    return _run_template(args, stdin)


def _run_template(args: Tuple[str, ...], stdin: str) -> Tuple[int, str, str]:
    proc = subprocess.run(list(args), input=stdin, capture_output=True, text=True, timeout=60, check=False)
    return proc.returncode, proc.stdout, proc.stderr
