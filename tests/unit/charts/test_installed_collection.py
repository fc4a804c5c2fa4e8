# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The galaxy artifact as an administrator installs it: chart, image sources, roles, playbooks.

Builds the artifact, installs it into an empty collections path (no network:
dependencies come from the test environment), and runs the playbooks by FQCN
with --syntax-check, and helm lint / helm template on the installed chart.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .helm import ROOT, find_helm, helm_required


def _tool(name: str) -> str:
    return shutil.which(name) or os.path.join(os.path.dirname(sys.executable), name)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("artifact")
    proc = subprocess.run([_tool("ansible-galaxy"), "collection", "build", str(ROOT), "--output-path", str(out)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    meta = yaml.safe_load((ROOT / "galaxy.yml").read_text(encoding="utf-8"))
    tarball = out / ("%s-%s-%s.tar.gz" % (meta["namespace"], meta["name"], meta["version"]))
    path = tmp_path_factory.mktemp("collections")
    proc = subprocess.run([_tool("ansible-galaxy"), "collection", "install", "--no-deps", "--force", "-p", str(path),
                           str(tarball)], capture_output=True, text=True, env=_env(path), check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return path


def _env(path: Path):
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)   # only the installed copy, not the checkout, may be found
    env["ANSIBLE_COLLECTIONS_PATH"] = str(path)
    env["ANSIBLE_LOCAL_TEMP"] = str(path / ".ansible-tmp")
    return env


def test_artifact_carries_chart_and_image_sources(installed):
    root = installed / "ansible_collections" / "metax" / "gpu"
    for rel in ("files/charts/metax-gpu-extensions/Chart.yaml", "files/charts/metax-gpu-extensions/values.schema.json",
                "files/charts/metax-gpu-extensions/templates/gpu-device.yaml", "files/images/agent/Containerfile",
                "files/images/agent/entrypoint", "requirements/agents.txt",
                "roles/agent_images/meta/argument_specs.yml", "roles/gpu_extensions/meta/argument_specs.yml",
                "roles/verify/meta/argument_specs.yml", "roles/uninstall/meta/argument_specs.yml",
                "roles/gpu_aware/meta/argument_specs.yml", "plugins/modules/scheduler_extender.py",
                "playbooks/site.yml", "playbooks/verify.yml", "plugins/filter/gpu_extensions.py"):
        assert (root / rel).is_file(), rel


@pytest.mark.parametrize("playbook", ["verify", "install", "uninstall", "site", "enable_gpu_aware", "disable_gpu_aware"])
def test_playbooks_run_by_fqcn_from_the_installed_collection(installed, playbook, tmp_path):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {"kube_control_plane": {"hosts": {"cp": None}},
                                                              "gpu_nodes": {"hosts": {"vm": None}}}}}))
    proc = subprocess.run([_tool("ansible-playbook"), "-i", str(inventory), "--syntax-check", "metax.gpu." + playbook],
                          capture_output=True, text=True, env=_env(installed), cwd=str(tmp_path), check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert str(installed) in proc.stdout     # resolved from the installed copy


@helm_required(find_helm())
def test_installed_chart_lints_and_renders(installed):
    helm = find_helm()
    chart = installed / "ansible_collections" / "metax" / "gpu" / "files" / "charts" / "metax-gpu-extensions"
    proc = subprocess.run([helm, "lint", "--strict", str(chart)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = subprocess.run([helm, "template", "x", str(chart), "-n", "metax-gpu", "--set", "deployExtenderGPUAware=true"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0 and "name: gpu-aware-plugin" in proc.stdout, proc.stderr
