# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""metax-docker (roles/metax_docker/files/metax-docker) in front of the real engines: installed by its role
(and removed), podman 4.3 with CDI over a simulated node, and Debian's Docker 20.10 (no CDI) through flags.

Not marked ``cluster``: it runs beside the cluster tests (scripts/run-tests.sh). It was a unit module until
the podman and dockerd runs (100-360 s) bounded the unit phase. Its command-line logic is unit-tested in
tests/unit/cdi/test_metax_docker.py; the helpers for the engines live beside that
(tests/unit/cdi/podman_cdi.py, docker_engine.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from ansible_collections.metax.gpu.plugins.module_utils import names
from ansible_collections.metax.gpu.plugins.module_utils.cdi import writer
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator
from ansible_collections.metax.gpu.plugins.module_utils.sim.maca import install_maca, maca_dir

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "unit"))
from cdi.docker_engine import DOCKER, SKIP_REASON as DOCKER_SKIP, needs_docker, start_docker  # noqa: E402
from cdi.metax_docker_script import SCRIPT_ARGV, md  # noqa: E402
from cdi.podman_cdi import BASE_IMAGE, PROBE, SKIP_REASON, needs_podman, podman_env  # noqa: E402
import role_runner


# -- the role, and real podman -------------------------------------------------------------
def run_role(tmp_path, **extra):
    return role_runner.run_role(tmp_path, "metax_docker", **extra)[0]


def engine_wrapper(tmp_path, spec_dir):
    """podman, in a mount namespace where spec_dir is its only CDI directory (see podman_cdi.py)."""
    empty = tmp_path / "empty"
    empty.mkdir(exist_ok=True)
    wrapper = tmp_path / "podman-cdi"
    wrapper.write_text(
        "#!/bin/sh\nexec unshare --mount --propagation private sh -c "
        "'mount --bind \"$0\" /run/cdi && { [ ! -d /etc/cdi ] || mount --bind \"$1\" /etc/cdi; } "
        "&& shift && exec \"$@\"' %s %s podman \"$@\"\n" % (spec_dir, empty))
    wrapper.chmod(0o755)
    os.makedirs("/run/cdi", exist_ok=True)
    return str(wrapper)


@pytest.fixture
def installed(make_node, tmp_path):
    """A node with MACA and its spec, metax-docker installed by the role in front of podman."""
    yield from install(make_node("8xC500"), tmp_path)


def install(host, tmp_path, twice=True):
    """metax-docker installed by the role over ``host`` (with MACA 3.0.0.8), its spec written by its own
    refresh: no spec exists before the first run. ``twice``: and the role run again changes nothing."""
    install_maca(host, "3.0.0.8")
    spec_dir = str(tmp_path / "cdi")
    os.makedirs(spec_dir)
    settings = {"metax_docker_bin_dir": str(tmp_path / "bin"), "metax_docker_config_path": str(tmp_path / "etc" / "md.conf"),
                "metax_docker_engine": engine_wrapper(tmp_path, spec_dir), "metax_docker_spec_dirs": [spec_dir],
                "metax_docker_lib_dir": str(tmp_path / "lib"), "metax_docker_host_root": host.path}
    (tmp_path / "bin").mkdir()
    # its directory, its settings, the writer's directories and files, the executable
    assert run_role(tmp_path, **settings) == 5
    assert not twice or run_role(tmp_path, **settings) == 0
    installed_text = (tmp_path / "bin" / "metax-docker").read_text()
    assert installed_text.startswith("#!/usr/bin/env python3\n")
    assert 'DEFAULT_CONFIG = "%s"' % settings["metax_docker_config_path"] in installed_text
    yield host, str(tmp_path / "bin" / "metax-docker"), settings
    assert run_role(tmp_path, metax_docker_state="absent", **settings) == 1
    assert not any(os.path.exists(str(tmp_path / p)) for p in ("bin/metax-docker", "etc/md.conf", "lib"))


def metax_docker(binary, *args, **env):
    argv = list(binary) if isinstance(binary, list) else [binary]
    return subprocess.run(argv + list(args), capture_output=True, text=True, check=False, timeout=300,
                          env=dict(podman_env(), **env), stdin=subprocess.DEVNULL)


def probe(text):
    out = text.rstrip("\n").splitlines()
    return {"dri": out[0].split(), "mxcd": out[1], "maca": out[2], "env": out[3:5], "maca_mount": out[5:]}


@pytest.fixture
def image_with_maca(tmp_path):
    """The base image plus an /opt/maca of its own (COPY only: nothing runs to build it)."""
    if SKIP_REASON:
        pytest.skip(SKIP_REASON)
    context = tmp_path / "image"
    (context / "maca" / "lib").mkdir(parents=True)
    (context / "maca" / "lib" / "libmxc-runtime64.so").write_text("the image's own MXMACA\n")
    (context / "Containerfile").write_text("FROM %s\nCOPY maca /opt/maca\n" % BASE_IMAGE)
    tag = "localhost/metax-gpu/test-own-maca:%s" % uuid.uuid4().hex[:12]
    proc = subprocess.run(["podman", "build", "--quiet", "--network", "host", "-t", tag, str(context)],
                          capture_output=True, text=True, env=podman_env(), check=False)
    assert proc.returncode == 0, proc.stderr
    yield tag
    subprocess.run(["podman", "rmi", "-f", tag], capture_output=True, env=podman_env(), check=False)


@needs_podman
def test_gpus_by_serial_count_and_all_with_podman(installed):
    host, binary, _settings = installed
    gpus = generator.load_state(host)["gpus"]
    run = ["run", "--rm", "--network", "none"]
    proc = metax_docker(binary, *run, "--gpus", "[%s,%s]" % (gpus[6]["serial"], gpus[1]["serial"]), BASE_IMAGE,
                        "sh", "-c", PROBE)
    assert proc.returncode == 0, proc.stderr
    seen = probe(proc.stdout)
    assert seen["dri"] == ["card1", "card6", "renderD129", "renderD134"] and seen["mxcd"] == "mxcd=yes"
    assert seen["maca"] == "simulated MXMACA 3.0.0.8 runtime" and seen["maca_mount"] == ["ro"]
    assert seen["env"] == ["MACA_PATH=/opt/maca", "LD_LIBRARY_PATH=/opt/maca/lib:/opt/maca/mxgpu_llvm/lib"]
    proc = metax_docker(binary, *run, "--gpus", "2", BASE_IMAGE, "sh", "-c", PROBE)
    assert proc.returncode == 0 and probe(proc.stdout)["dri"] == ["card0", "card1", "renderD128", "renderD129"]
    proc = metax_docker(binary, *run, "--gpus=[%s]" % gpus[3]["uuid"], BASE_IMAGE, "sh", "-c", PROBE)
    assert proc.returncode == 0 and probe(proc.stdout)["dri"] == ["card3", "renderD131"]
    # the same through the fallback flags (an engine without CDI): the same container
    proc = metax_docker(binary, *run, "--gpus", "[%s]" % gpus[6]["serial"], BASE_IMAGE, "sh", "-c", PROBE,
                        METAX_DOCKER_CDI="no")
    assert proc.returncode == 0, proc.stderr
    assert probe(proc.stdout) == dict(seen, dri=["card6", "renderD134"])


@needs_podman
def test_unknown_serial_starts_no_container(installed):
    _host, binary, _settings = installed
    name = "metax-docker-test-%s" % uuid.uuid4().hex[:8]
    proc = metax_docker(binary, "run", "--name", name, "--gpus", "[00-00-00-00-00-00-00-00]", BASE_IMAGE, "true")
    assert proc.returncode == 125
    assert "unknown GPU ID or serial number 00-00-00-00-00-00-00-00" in proc.stderr
    exists = subprocess.run(["podman", "container", "exists", name], env=podman_env(), check=False)
    assert exists.returncode == 1
    # and everything that is not `run` goes to the engine as it is
    proc = metax_docker(binary, "image", "exists", BASE_IMAGE)
    assert proc.returncode == 0


@needs_podman
def test_an_images_own_maca_is_kept_unless_maca_force(installed, image_with_maca):
    host, binary, _settings = installed
    run = ["run", "--rm", "--network", "none", "--gpus", "[0]"]
    kept = metax_docker(binary, *run, image_with_maca, "sh", "-c", PROBE)
    assert kept.returncode == 0, kept.stderr
    seen = probe(kept.stdout)
    assert seen["maca"] == "the image's own MXMACA" and seen["maca_mount"] == []
    assert seen["dri"] == ["card0", "renderD128"] and seen["mxcd"] == "mxcd=yes"
    forced = metax_docker(binary, *run[:-2], "--maca-force", *run[-2:], image_with_maca, "sh", "-c", PROBE)
    assert forced.returncode == 0, forced.stderr
    assert probe(forced.stdout)["maca"] == "simulated MXMACA 3.0.0.8 runtime"
    assert probe(forced.stdout)["maca_mount"] == ["ro"]
    # --maca PATH: another MACA root on /opt/maca
    other = install_maca(host, "3.1.0.2", activate=False)
    proc = metax_docker(binary, *run, "--maca", host.join(other), BASE_IMAGE, "sh", "-c", PROBE)
    assert proc.returncode == 0, proc.stderr
    assert probe(proc.stdout)["maca"] == "simulated MXMACA 3.1.0.2 runtime"
    assert other == "/" + maca_dir("3.1.0.2")


def all_devices(binary, image=BASE_IMAGE):
    proc = metax_docker(binary, "run", "--rm", "--network", "none", "--gpus", "all", image, "sh", "-c", PROBE)
    assert proc.returncode == 0, proc.stderr
    return probe(proc.stdout)["dri"]


def timed_refresh(binary):
    """A dry run of metax-docker that asks the engine nothing (CDI said yes, the image's MACA overridden):
    seconds from the call to the spec on disk, i.e. what its refresh adds to a run."""
    start = time.monotonic()
    proc = metax_docker(binary, "run", "--rm", "--gpus", "all", "--maca-force", BASE_IMAGE, "true",
                        METAX_DOCKER_DRY_RUN="1", METAX_DOCKER_CDI="yes")
    assert proc.returncode == 0, proc.stderr
    return time.monotonic() - start


@needs_podman
def test_a_vf_change_and_a_gpu_failure_reach_the_next_run(make_node, tmp_path):
    """Issue 26 item 2 on a Docker/podman host: nothing but metax-docker keeps the spec there, and it brings
    it up to date before each run, so the run after a change sees the devices as they are now."""
    installing = install(make_node("2xC550-sriov"), tmp_path, twice=False)
    host, binary, settings = next(installing)
    spec_path = os.path.join(settings["metax_docker_spec_dirs"][-1], names.CDI_SPEC_FILE)
    gpus = generator.load_state(host)["gpus"]
    assert not os.path.exists(spec_path)
    took = {"first": timed_refresh(binary), "unchanged": timed_refresh(binary)}
    # 4 VFs on GPU 0: its PF goes, its VFs come (cards 2-5)
    host.write_attribute(gpus[0]["sysfs"] + "/sriov_numvfs", "4")
    took["vf 0->4"] = timed_refresh(binary)
    want = ["card1", "card2", "card3", "card4", "card5", "renderD129", "renderD130", "renderD131", "renderD132",
            "renderD133"]
    assert all_devices(binary) == want
    # GPU 1 fails (mx-smi reports it unavailable; sysfs unchanged): it leaves the spec, and asking for it
    # by serial starts nothing
    generator.fail_gpu(host, 1, mode="smi")
    took["gpu fails"] = timed_refresh(binary)
    assert all_devices(binary) == [d for d in want if d not in ("card1", "renderD129")]
    proc = metax_docker(binary, "run", "--rm", "--gpus", "[%s]" % gpus[1]["serial"], BASE_IMAGE, "true")
    assert proc.returncode == 125 and "unknown GPU ID or serial number %s" % gpus[1]["serial"] in proc.stderr
    generator.recover_gpu(host, 1)
    took["gpu recovers"] = timed_refresh(binary)
    proc = metax_docker(binary, "run", "--rm", "--network", "none", "--gpus", "[%s]" % gpus[1]["serial"],
                        BASE_IMAGE, "sh", "-c", PROBE)
    assert proc.returncode == 0 and probe(proc.stdout)["dri"] == ["card1", "renderD129"], proc.stderr
    host.write_attribute(gpus[0]["sysfs"] + "/sriov_numvfs", "0")
    took["vf 4->0"] = timed_refresh(binary)
    with open(spec_path) as handle:
        assert [d["name"] for d in json.load(handle)["devices"]][::3] == ["0", "1", "all"]
    assert json.loads(Path(spec_path).read_text()) == writer.node_spec(host).spec
    print("\ndevice change -> spec rewritten by the next metax-docker run (s, metax-docker's start included): %s"
          % ", ".join("%s %.3f" % item for item in took.items()))
    next(installing, None)


# -- Debian's Docker 20.10: no CDI, so the flags path -----------------------------------------
@pytest.fixture(scope="module")
def docker():
    if DOCKER_SKIP or SKIP_REASON:
        pytest.skip(DOCKER_SKIP or SKIP_REASON)
    yield from start_docker()


@pytest.fixture
def docker_node(make_node, tmp_path, docker):
    host = make_node("8xC500")
    install_maca(host, "3.0.0.8")
    spec_dir = str(tmp_path / "cdi")
    writer.refresh(host, spec_dir)
    env = {"DOCKER_HOST": docker.host, "METAX_DOCKER_ENGINE": str(DOCKER), "METAX_DOCKER_SPEC_DIRS": spec_dir,
           "METAX_DOCKER_CONFIG": str(tmp_path / "none")}
    return host, env


@needs_docker
def test_docker_20_has_no_cdi_and_gets_the_same_container_through_flags(docker, docker_node, monkeypatch):
    host, env = docker_node
    monkeypatch.setenv("DOCKER_HOST", docker.host)
    assert docker.run("info", "--format", "{{.ServerVersion}}").stdout.startswith("20.10")
    assert not md.engine_reads_cdi(str(DOCKER))
    gpus = generator.load_state(host)["gpus"]
    proc = metax_docker(SCRIPT_ARGV, "run", "--rm", "--network", "none", "--gpus", "[%s]" % gpus[4]["serial"],
                        BASE_IMAGE, "sh", "-c", PROBE, **env)
    assert proc.returncode == 0, proc.stderr
    seen = probe(proc.stdout)
    assert seen["dri"] == ["card4", "renderD132"] and seen["mxcd"] == "mxcd=yes"
    assert seen["maca"] == "simulated MXMACA 3.0.0.8 runtime" and seen["maca_mount"] == ["ro"]
    assert seen["env"] == ["MACA_PATH=/opt/maca", "LD_LIBRARY_PATH=/opt/maca/lib:/opt/maca/mxgpu_llvm/lib"]
    dry = metax_docker(SCRIPT_ARGV, "run", "--rm", "--gpus", "1", BASE_IMAGE, "true",
                       METAX_DOCKER_DRY_RUN="1", **env)
    assert "metax-tech.com/gpu=" not in dry.stdout and "/dev/dri/card0:/dev/dri/card0" in dry.stdout
    # an unknown serial: exit 125, and Docker has no container at all
    before = docker.run("ps", "-aq").stdout
    proc = metax_docker(SCRIPT_ARGV, "run", "--gpus", "[ff-ff]", BASE_IMAGE, "true", **env)
    assert proc.returncode == 125 and "unknown GPU ID or serial number ff-ff" in proc.stderr
    assert docker.run("ps", "-aq").stdout == before == ""


@needs_docker
def test_docker_keeps_an_images_own_maca_unless_maca_force(docker, docker_node, tmp_path):
    _host, env = docker_node
    context = tmp_path / "image"
    (context / "maca" / "lib").mkdir(parents=True)
    (context / "maca" / "lib" / "libmxc-runtime64.so").write_text("the image's own MXMACA\n")
    (context / "Dockerfile").write_text("FROM %s\nCOPY maca /opt/maca\n" % BASE_IMAGE)
    tag = "localhost/metax-gpu/test-own-maca:docker"
    built = docker.run("build", "-q", "-t", tag, str(context))
    assert built.returncode == 0, built.stderr
    try:
        run = ["run", "--rm", "--network", "none", "--gpus", "[0]"]
        kept = metax_docker(SCRIPT_ARGV, *run, tag, "sh", "-c", PROBE, **env)
        assert kept.returncode == 0, kept.stderr
        assert probe(kept.stdout)["maca"] == "the image's own MXMACA" and probe(kept.stdout)["dri"] == \
            ["card0", "renderD128"]
        forced = metax_docker(SCRIPT_ARGV, *run, "--maca-force", tag, "sh", "-c", PROBE, **env)
        assert forced.returncode == 0, forced.stderr
        assert probe(forced.stdout)["maca"] == "simulated MXMACA 3.0.0.8 runtime"
        # the probe's container is gone
        assert docker.run("ps", "-aq").stdout == ""
    finally:
        docker.run("rmi", "-f", tag)
