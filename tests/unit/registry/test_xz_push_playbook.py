"""ansible-playbook metax.gpu.push_artifacts with the vendor's .xz MACA archives next to (here: instead of) the bundle."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from registry_fixtures import NEW, OLD, make_xz, random_layers, skopeo_inspect

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "modules"))
from module_runner import run_module  # noqa: E402

from ansible_collections.metax.gpu.plugins.modules import registry_push  # noqa: E402


def test_module_xz_check_mode_push_and_unchanged(tmp_path, registry):
    info = make_xz(tmp_path, OLD[0], OLD[1], random_layers(2, 100_000))
    args = {"src": info["path"], "registry": registry.host, "project": "metax", "insecure": True,
            "cache_dir": str(tmp_path / "cache")}
    failed, plan = run_module(registry_push, args, check_mode=True)
    assert not failed and plan["changed"] is True
    failed, done = run_module(registry_push, args)
    assert not failed and done["changed"] is True
    (art,) = done["artifacts"]
    assert art["ref"] == registry.host + "/metax/maca-c500:2.23.0.4"
    assert [l["diff_id"] for l in art["layers"]] == info["diff_ids"]
    assert all(l["mib_per_s"] > 0 and l["uncompressed"] > 0 for l in art["layers"])
    assert skopeo_inspect(art["ref"])["digest"] == art["digest"]
    failed, plan2 = run_module(registry_push, args, check_mode=True)
    assert not failed and plan2["changed"] is False
    failed, again = run_module(registry_push, args)
    assert not failed and again["changed"] is False


def test_push_artifacts_playbook_pushes_both_generations(tmp_path, registry):
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    old = make_xz(tmp_path / "old", OLD[0], OLD[1], random_layers(2, 100_000, seed=1))
    new = make_xz(tmp_path / "new", NEW[0], NEW[1], random_layers(2, 100_000, seed=2))
    extra = {"push_artifacts_registry": registry.host, "push_artifacts_project": "metax",
             "push_artifacts_insecure": True, "push_artifacts_maca_archives": [old["path"], new["path"]]}
    cmd = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,", "-c", "local",
           "-e", "ansible_python_interpreter=" + sys.executable, "-e", json.dumps(extra), "metax.gpu.push_artifacts"]
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"), ANSIBLE_NOCOLOR="1")
    runs = [subprocess.run(cmd, capture_output=True, text=True, check=False, env=env) for _run in range(2)]
    for proc in runs:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"localhost\s*: ok=\d+\s+changed=1 ", runs[0].stdout), runs[0].stdout
    assert re.search(r"localhost\s*: ok=\d+\s+changed=0 ", runs[1].stdout), runs[1].stdout
    assert "ETA" in runs[0].stdout   # the progress samples of the streamed layers
    for ref in ("metax/maca-c500:2.23.0.4", "metax/mxc500-maca:2.23.0.5"):
        assert skopeo_inspect(registry.host + "/" + ref)["digest"].startswith("sha256:")
