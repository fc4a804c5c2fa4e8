# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Debian's real Docker engine (docker.io 20.10: no CDI), started for a test session on a socket of its own.

No network changes (``--iptables=false --bridge=none``: containers run with
``--network none``), vfs storage, data and exec roots in a temporary
directory; the project's base image is loaded from podman. Stopped by its
PID file at the end; nothing of it stays on the machine.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Iterator, Optional

import pytest

from .podman_cdi import BASE_IMAGE, podman_env

DOCKERD = shutil.which("dockerd")
# Debian's client, not whatever else is first on PATH
DOCKER = "/usr/bin/docker" if os.access("/usr/bin/docker", os.X_OK) else shutil.which("docker")


def _can_run() -> Optional[str]:
    if os.geteuid() != 0:
        return "dockerd needs root"
    if DOCKERD is None or DOCKER is None:
        return "docker.io missing (requirements/system.txt)"
    return None


SKIP_REASON = _can_run()
needs_docker = pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or "")


@dataclass
class DockerEngine:
    directory: str
    host: str          # DOCKER_HOST

    def env(self) -> dict:
        return dict(os.environ, DOCKER_HOST=self.host)

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([str(DOCKER)] + list(args), capture_output=True, text=True, env=self.env(),
                              timeout=timeout, stdin=subprocess.DEVNULL, check=False)


def start_docker() -> Iterator[DockerEngine]:
    # short: containerd's socket lives below the exec root (108-byte limit)
    directory = tempfile.mkdtemp(prefix="mxd.", dir="/tmp")
    sock = os.path.join(directory, "docker.sock")
    pidfile = os.path.join(directory, "docker.pid")
    log = open(os.path.join(directory, "dockerd.log"), "wb")
    proc = subprocess.Popen([str(DOCKERD), "--data-root", os.path.join(directory, "data"),
                             "--exec-root", os.path.join(directory, "exec"), "-H", "unix://" + sock,
                             "--pidfile", pidfile, "--iptables=false", "--ip-masq=false", "--bridge=none",
                             "--storage-driver=vfs", "--default-ulimit", "nofile=20000:20000"],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    engine = DockerEngine(directory, "unix://" + sock)
    try:
        deadline = time.monotonic() + 60
        while engine.run("info", timeout=30).returncode != 0:
            if proc.poll() is not None or time.monotonic() > deadline:
                with open(os.path.join(directory, "dockerd.log")) as handle:
                    raise RuntimeError("dockerd did not start: %s" % handle.read()[-2000:])
            time.sleep(0.3)
        save = subprocess.Popen(["podman", "save", BASE_IMAGE], stdout=subprocess.PIPE, env=podman_env())
        loaded = subprocess.run([str(DOCKER), "load"], stdin=save.stdout, capture_output=True, text=True,
                                env=engine.env(), check=False)
        save.wait()
        if loaded.returncode != 0 or save.returncode != 0:
            raise RuntimeError("cannot load %s into docker: %s" % (BASE_IMAGE, loaded.stderr))
        yield engine
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(directory, ignore_errors=True)
