"""scripts/deps.sh, the deps phase: one list, nothing done when all is present, clear failures."""
from __future__ import annotations

import os
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
DEPS_SH = os.path.join(REPO, "scripts", "deps.sh")


def _run(tmp_path, listing, *args):
    scratch = tmp_path / "system.txt"
    scratch.write_text(listing)
    env = dict(os.environ, METAX_SYSTEM_DEPS=str(scratch), METAX_CACHE_DIR=str(tmp_path / "cache"))
    return subprocess.run(["bash", DEPS_SH] + list(args), env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def test_nothing_to_do_when_everything_is_present(tmp_path):
    # bash and dpkg are on every Debian machine: the real dpkg-query answers
    proc = _run(tmp_path, "deb bash   # the shell\ndeb dpkg\n")
    assert proc.returncode == 0, proc.stderr
    assert "everything in requirements/system.txt is present" in proc.stderr
    assert "installed" not in proc.stderr.replace("is present", "")


def test_check_names_what_is_missing_and_installs_nothing(tmp_path):
    proc = _run(tmp_path, "deb bash\ngo helm\n", "--check")
    assert proc.returncode == 1, proc.stderr
    assert "missing Go build: helm (scripts/cluster/build-helm.sh)" in proc.stdout
    assert not (tmp_path / "cache" / "helm").exists()


def test_an_unknown_entry_fails_naming_it(tmp_path):
    proc = _run(tmp_path, "deb bash\ngo frobnicator\n")
    assert proc.returncode != 0
    assert "unknown go entry 'frobnicator'" in proc.stderr


def test_the_project_list_has_every_kind_and_only_known_kinds():
    kinds = set()
    with open(os.path.join(REPO, "requirements", "system.txt")) as handle:
        for line in handle:
            fields = line.split("#")[0].split()
            if fields:
                assert len(fields) == 2, line
                kinds.add(fields[0])
    assert kinds == {"deb", "go", "gomod", "image"}
