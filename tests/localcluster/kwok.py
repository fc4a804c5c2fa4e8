# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""kwok: the controller that keeps the scale profile's fake nodes alive.

kwok (sigs.k8s.io/kwok, built by scripts/cluster/build-kwok.sh) runs on the
host against the local cluster's apiserver with the admin kubeconfig. It
manages only the nodes labelled ``type=kwok`` (fakenodes.FAKE_LABEL), so the
three real nodes and their kubelets are never touched: it marks the fake
nodes Ready, renews their Leases, and runs the pods bound to them (Running at
once, removed when deleted), with kwok's own stage definitions.

Pure parts (:func:`config_text`, :func:`argv`) are unit-tested; :class:`Kwok`
starts and stops the one process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Optional, Sequence

from .settings import Settings

KWOK_VERSION = "v0.8.0"   # lib.sh's KWOK_VERSION
# The stage files build-kwok.sh copies out of kwok's module, in the order of the config.
STAGE_FILES = ("node-initialize.yaml", "node-heartbeat-with-lease.yaml", "pod-ready.yaml", "pod-complete.yaml",
               "pod-delete.yaml")
# Pod IPs kwok writes into the status of its pods: only strings in the API, no
# traffic goes there; a /12 leaves room for 1,000s of pods (the default /24 has 254).
POD_CIDR = "10.192.0.0/12"
RUN_DIR = "/run/metax-gpu-scale"


class KwokError(Exception):
    """kwok is not built or did not start."""


@dataclass(frozen=True)
class KwokSpec:
    bin_dir: str              # <cache>/kwok/<version>/bin
    kubeconfig: str
    selector: str             # label selector of the nodes kwok manages
    run_dir: str = RUN_DIR

    @property
    def binary(self) -> str:
        return os.path.join(self.bin_dir, "kwok")

    @property
    def stages_dir(self) -> str:
        return os.path.join(os.path.dirname(self.bin_dir), "stages")

    @property
    def config(self) -> str:
        return os.path.join(self.run_dir, "kwok.yaml")

    @property
    def pid_file(self) -> str:
        return os.path.join(self.run_dir, "kwok.pid")

    @property
    def log(self) -> str:
        return os.path.join(self.run_dir, "kwok.log")


def spec(settings: Settings, selector: str, version: str = KWOK_VERSION) -> KwokSpec:
    return KwokSpec(bin_dir=os.path.join(settings.cache_dir, "kwok", version, "bin"),
                    kubeconfig=settings.admin_conf, selector=selector)


def config_text(stages: Sequence[str]) -> str:
    """kwok's --config: its stage documents, one YAML stream."""
    return "---\n".join(s if s.endswith("\n") else s + "\n" for s in stages)


def argv(kspec: KwokSpec) -> list[str]:
    return [kspec.binary, "--kubeconfig", kspec.kubeconfig, "--config", kspec.config,
            "--manage-all-nodes=false", "--manage-nodes-with-label-selector", kspec.selector,
            "--cidr", POD_CIDR, "--node-lease-duration-seconds", "40",
            # INFO logs every heartbeat patch of every node: gigabytes at 2,000 nodes
            "--v", "WARN"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        with open("/proc/%d/stat" % pid, encoding="utf-8") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class Kwok:
    """The one kwok process of the scale profile (pid file in ``run_dir``)."""

    def __init__(self, kspec: KwokSpec) -> None:
        self.spec = kspec

    def pid(self) -> Optional[int]:
        try:
            with open(self.spec.pid_file, encoding="utf-8") as fh:
                pid = int(fh.read().strip())
        except (OSError, ValueError):
            return None
        return pid if _alive(pid) else None

    def up(self) -> int:
        """Start kwok unless it runs; returns its pid."""
        running = self.pid()
        if running is not None:
            return running
        if not os.access(self.spec.binary, os.X_OK):
            raise KwokError("%s not built: run scripts/cluster/build-kwok.sh (or scripts/deps.sh)" % self.spec.binary)
        stages = []
        for name in STAGE_FILES:
            with open(os.path.join(self.spec.stages_dir, name), encoding="utf-8") as fh:
                stages.append(fh.read())
        os.makedirs(self.spec.run_dir, exist_ok=True)
        with open(self.spec.config, "w", encoding="utf-8") as fh:
            fh.write(config_text(stages))
        with open(self.spec.log, "ab") as log:
            proc = subprocess.Popen(argv(self.spec), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        time.sleep(0.5)
        if proc.poll() is not None:
            raise KwokError("kwok exited at once (%s); see %s" % (proc.returncode, self.spec.log))
        with open(self.spec.pid_file, "w", encoding="utf-8") as fh:
            fh.write("%d\n" % proc.pid)
        return proc.pid

    def down(self, timeout: float = 10.0) -> None:
        pid = self.pid()
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
        for path in (self.spec.pid_file, self.spec.config):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
