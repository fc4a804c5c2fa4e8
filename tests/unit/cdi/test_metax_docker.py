# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""metax-docker (roles/metax_docker/files/metax-docker): its command lines and the files its role installs.

The runs in front of the real engines (the role, podman with CDI, Docker 20.10 through flags) are
integration tests: tests/integration/test_metax_docker_engines.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import yaml

from ansible_collections.metax.gpu.plugins.module_utils import names

from .metax_docker_script import ROOT, md


def test_its_names_are_the_collections():
    assert md.KIND == names.CDI_KIND and md.MACA_CONTAINER_PATH == names.MACA_CONTAINER_PATH
    assert md.ALL == names.CDI_ALL


@pytest.mark.parametrize("args, ours, passed, rest", [
    (["--rm", "-it", "--gpus", "all", "img", "sh"], {"gpus": "all"}, ["--rm", "-it"], ["img", "sh"]),
    (["--gpus=[0,1]", "-e", "A=1", "-p8080:80", "-v", "/a:/b", "img"], {"gpus": "[0,1]"},
     ["-e", "A=1", "-p8080:80", "-v", "/a:/b"], ["img"]),
    (["--name", "x", "--maca", "/m", "--maca-force", "img", "app", "--gpus", "9"],
     {"maca": "/m", "maca_force": True}, ["--name", "x"], ["img", "app", "--gpus", "9"]),
    (["-dit", "--network=none", "img"], {}, ["-dit", "--network=none"], ["img"]),
])
def test_run_arguments_are_split_at_the_image(args, ours, passed, rest):
    got_ours, got_passed, got_rest = md.split_run(args)
    assert {k: v for k, v in got_ours.items() if v not in (None, False)} == ours
    assert (got_passed, got_rest) == (passed, rest)


SPEC = {
    "kind": "metax-tech.com/gpu", "cdiVersion": "0.5.0",
    "containerEdits": {"deviceNodes": [{"path": "/dev/mxcd"}],
                       "mounts": [{"hostPath": "/opt/maca-3", "containerPath": "/opt/maca", "options": ["ro"]}],
                       "env": ["MACA_PATH=/opt/maca"]},
    "devices": [
        {"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/dri/card0"}, {"path": "/dev/dri/renderD128"}]}},
        {"name": "GPU-a", "containerEdits": {"deviceNodes": [{"path": "/dev/dri/card0"},
                                                             {"path": "/dev/dri/renderD128"}]}},
        {"name": "1", "containerEdits": {"deviceNodes": [{"path": "/dev/dri/card1"}, {"path": "/dev/dri/renderD129"}]}},
        {"name": "all", "containerEdits": {"deviceNodes": []}},
    ],
}


def test_gpus_select_by_all_count_id_and_serial():
    assert md.select(SPEC, "all") == ["all"]
    assert md.select(SPEC, "2") == ["0", "1"]
    assert md.select(SPEC, "[GPU-a]") == ["GPU-a"] and md.select(SPEC, "1,0") == ["1", "0"]
    for bad, message in (("3", "this host has 2 MetaX GPU"), ("[9]", "unknown GPU ID or serial number 9"),
                         ("[all]", "unknown"), ("[0", "unbalanced"), ("[]", "names no GPU")):
        with pytest.raises(md.MetaxDockerError, match=re.escape(message)):
            md.select(SPEC, bad)


def test_cdi_names_only_for_the_hosts_maca_else_flags():
    assert md.flags_for(SPEC, ["GPU-a"], True, "") == ["--device", "metax-tech.com/gpu=GPU-a"]
    fallback = ["--device", "/dev/mxcd:/dev/mxcd", "--device", "/dev/dri/card0:/dev/dri/card0",
                "--device", "/dev/dri/renderD128:/dev/dri/renderD128"]
    assert md.flags_for(SPEC, ["0", "GPU-a"], False, "") == fallback + [
        "-v", "/opt/maca-3:/opt/maca:ro", "-e", "MACA_PATH=/opt/maca"]
    # the image keeps its own MACA: devices only, even with CDI
    assert md.flags_for(SPEC, ["0"], True, None) == fallback
    assert md.flags_for(SPEC, ["0"], True, "/other")[-4:] == ["-v", "/other:/opt/maca:ro", "-e", "MACA_PATH=/opt/maca"]
    # --maca without --gpus: MACA, no device
    assert md.flags_for(SPEC, [], True, "") == ["-v", "/opt/maca-3:/opt/maca:ro", "-e", "MACA_PATH=/opt/maca"]


def test_everything_else_passes_through_unchanged(tmp_path):
    env = {"METAX_DOCKER_ENGINE": "docker", "METAX_DOCKER_CONFIG": str(tmp_path / "none")}
    for argv in (["ps", "-a"], ["--host", "unix:///x", "images"], ["run", "--rm", "img", "--gpus", "all"],
                 ["-H", "unix:///x", "run", "-it", "img"], ["build", "--gpus", "all", "."]):
        assert md.command_line(argv, env) == ["docker"] + argv


def test_unknown_serial_is_an_error_before_any_engine_call(tmp_path, capsys):
    spec_dir = tmp_path / "cdi"
    spec_dir.mkdir()
    (spec_dir / "metax.json").write_text(json.dumps(SPEC))
    env = {"METAX_DOCKER_ENGINE": str(tmp_path / "no-such-engine"), "METAX_DOCKER_SPEC_DIRS": str(spec_dir),
           "METAX_DOCKER_CONFIG": str(tmp_path / "none"), "METAX_DOCKER_CDI": "yes"}
    assert md.main(["run", "--gpus", "[4d-58-ff]", "img"], env) == 125
    assert "unknown GPU ID or serial number 4d-58-ff" in capsys.readouterr().err
    assert md.main(["run", "--gpus", "all", "img"], dict(env, METAX_DOCKER_SPEC_DIRS=str(tmp_path))) == 125
    assert "no CDI spec of kind metax-tech.com/gpu" in capsys.readouterr().err


def test_the_role_installs_the_writers_whole_import_closure():
    """The refresh before each run imports only what the role installs (vars/main.yml)."""
    package = "ansible_collections.metax.gpu.plugins.module_utils"
    proc = subprocess.run([sys.executable, "-c", "import sys, %s.cdi.__main__; print(' '.join(sys.modules))" % package],
                          capture_output=True, text=True, check=True)
    loaded = {m for m in proc.stdout.split() if m.startswith(package + ".")}
    wanted = set()
    for module in loaded:
        rel = os.path.join(*module[len(package) + 1:].split("."))
        wanted.add(rel + "/__init__.py" if (ROOT / "plugins" / "module_utils" / rel).is_dir() else rel + ".py")
    role_vars = yaml.safe_load((ROOT / "roles" / "metax_docker" / "vars" / "main.yml").read_text())
    assert sorted(role_vars["metax_docker_writer_files"]) == sorted(wanted)
    assert role_vars["metax_docker_writer_package"].replace("/", ".") == package
