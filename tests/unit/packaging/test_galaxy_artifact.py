"""The galaxy artifact: built with ansible-galaxy, listed, compared with what users need."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile

import pytest
import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
DEVELOPER_ONLY = re.compile(
    r"^(tests|benchmarks|scripts|\.hypothesis|\.mypy_cache|\.build|\.venv|\.ci|\.git|changelogs/fragments)(/|$)"
    r"|(^|/)(__pycache__|[^/]*\.pyc)$|^(Makefile|pytest\.ini|mypy\.ini|\.gitignore|\.yamllint|\.ansible-lint)$")


def _tracked():
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, stdout=subprocess.PIPE, universal_newlines=True, check=False)
    if out.returncode != 0:
        pytest.skip("not a git checkout")
    return [line for line in out.stdout.splitlines() if os.path.exists(os.path.join(ROOT, line))]


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    galaxy = shutil.which("ansible-galaxy") or os.path.join(os.path.dirname(sys.executable), "ansible-galaxy")
    out = tmp_path_factory.mktemp("artifact")
    proc = subprocess.run([galaxy, "collection", "build", ROOT, "--output-path", str(out)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, check=False)
    assert proc.returncode == 0, proc.stdout
    with open(os.path.join(ROOT, "galaxy.yml")) as handle:
        meta = yaml.safe_load(handle)
    path = out / ("%s-%s-%s.tar.gz" % (meta["namespace"], meta["name"], meta["version"]))
    with tarfile.open(str(path)) as tar:
        return sorted(m.name for m in tar.getmembers() if m.isfile())


def test_artifact_holds_no_developer_files(artifact):
    leaked = [name for name in artifact if DEVELOPER_ONLY.search(name)]
    assert not leaked, leaked


def test_artifact_holds_what_users_need(artifact):
    for required in ("MANIFEST.json", "FILES.json", "README.md", "LICENSE", "meta/runtime.yml",
                     "plugins/modules/gpu_facts.py", "plugins/doc_fragments/host_root.py",
                     "plugins/module_utils/host.py", "plugins/module_utils/names.py"):
        assert required in artifact, required
    # every tracked file a user needs is in: plugins, roles, playbooks, charts and image sources, docs
    shipped_trees = ("plugins/", "roles/", "playbooks/", "files/", "docs/", "meta/", "extensions/")
    tracked = [f for f in _tracked() if f.startswith(shipped_trees) and not DEVELOPER_ONLY.search(f)]
    missing = [f for f in tracked if f not in artifact]
    assert not missing, missing
    assert any(f.startswith("files/images/") for f in artifact)
    charts = [f for f in tracked if f.startswith("files/charts/")]
    assert all(f in artifact for f in charts)


def test_artifact_is_only_tracked_content(artifact):
    """Nothing untracked (caches, local outputs) rides along; galaxy adds only its two manifests."""
    tracked = set(_tracked())
    extra = [name for name in artifact if name not in tracked and name not in ("MANIFEST.json", "FILES.json")]
    assert not extra, extra
