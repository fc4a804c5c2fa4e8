# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""A private control plane: etcd, kube-apiserver and the garbage collector, nothing else.

For tests of controllers against the real API server (admission, schema
validation, RBAC, server-side apply, ownerReferences and garbage collection)
that need no nodes or pods, so they run without the shared local cluster and
never touch it: own ports (free ones), own data directory, own PKI. The
binaries are the ones the deps phase builds for the local cluster
(scripts/cluster/lib.sh: k8s_bin_dir), etcd is requirements/system.txt's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from typing import List, Optional

from ports import free_port

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
LIB = os.path.join(ROOT, "scripts", "cluster", "lib.sh")


def lib_dir(function: str) -> str:
    """A directory scripts/cluster/lib.sh computes (k8s_bin_dir, helm_bin_dir)."""
    out = subprocess.run(["bash", "-c", 'source "$1"; %s' % function, "lib", LIB], capture_output=True, text=True,
                         check=True, timeout=60)
    return out.stdout.strip().splitlines()[-1]


class ControlPlane:
    """Start with :meth:`start`, stop with :meth:`stop`; :attr:`kubeconfig` is cluster-admin."""

    def __init__(self) -> None:
        self.bin = lib_dir("k8s_bin_dir")
        self.kubectl_path = os.path.join(self.bin, "kubectl")
        self.dir = tempfile.mkdtemp(prefix="metax-controlplane-")
        self.procs: List[subprocess.Popen] = []
        self.port = free_port()
        self.kubeconfig = os.path.join(self.dir, "admin.kubeconfig")

    def _spawn(self, name: str, args: List[str]) -> subprocess.Popen:
        log = open(os.path.join(self.dir, name + ".log"), "w")
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=self.dir)
        self.procs.append(proc)
        return proc

    def log(self, name: str, lines: int = 30) -> str:
        with open(os.path.join(self.dir, name + ".log")) as fh:
            return "".join(fh.readlines()[-lines:])

    def start(self, timeout: float = 90.0) -> "ControlPlane":
        etcd_port, peer_port = free_port(), free_port()
        subprocess.run(["openssl", "genrsa", "-out", "sa.key", "2048"], cwd=self.dir, check=True, capture_output=True)
        subprocess.run(["openssl", "rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"], cwd=self.dir, check=True,
                       capture_output=True)
        with open(os.path.join(self.dir, "tokens.csv"), "w") as fh:
            fh.write("admin-token,admin,admin,system:masters\n")
        self._spawn("etcd", [shutil.which("etcd") or "etcd", "--data-dir", os.path.join(self.dir, "etcd"),
                             "--listen-client-urls", "http://127.0.0.1:%d" % etcd_port,
                             "--advertise-client-urls", "http://127.0.0.1:%d" % etcd_port,
                             "--listen-peer-urls", "http://127.0.0.1:%d" % peer_port,
                             "--initial-advertise-peer-urls", "http://127.0.0.1:%d" % peer_port,
                             "--initial-cluster", "default=http://127.0.0.1:%d" % peer_port])
        self._spawn("kube-apiserver", [
            os.path.join(self.bin, "kube-apiserver"), "--etcd-servers=http://127.0.0.1:%d" % etcd_port,
            "--secure-port=%d" % self.port, "--bind-address=127.0.0.1", "--cert-dir=" + os.path.join(self.dir, "pki"),
            "--token-auth-file=tokens.csv", "--authorization-mode=RBAC", "--allow-privileged=true",
            "--service-account-issuer=https://kubernetes.default.svc", "--service-account-key-file=sa.pub",
            "--service-account-signing-key-file=sa.key", "--service-cluster-ip-range=10.253.0.0/24"])
        self.write_kubeconfig(self.kubeconfig, "admin-token")
        deadline = time.monotonic() + timeout
        while self.kubectl("get", "--raw", "/readyz").returncode != 0:
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                raise RuntimeError("the private kube-apiserver did not come up:\n" + self.log("kube-apiserver"))
            time.sleep(0.5)
        # ownerReferences and foreground deletion need the garbage collector
        self._spawn("kube-controller-manager", [
            os.path.join(self.bin, "kube-controller-manager"), "--kubeconfig=" + self.kubeconfig,
            "--controllers=garbagecollector,namespace", "--leader-elect=false", "--secure-port=0"])
        return self

    def write_kubeconfig(self, path: str, token: str) -> str:
        with open(path, "w") as fh:
            fh.write("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n"
                     "    server: https://127.0.0.1:%d\n    insecure-skip-tls-verify: true\n"
                     "users:\n- name: u\n  user:\n    token: %s\n"
                     "contexts:\n- name: c\n  context: {cluster: c, user: u}\ncurrent-context: c\n"
                     % (self.port, token))
        return path

    def kubectl(self, *args: str, input: Optional[str] = None, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run([self.kubectl_path, "--kubeconfig", self.kubeconfig] + list(args), input=input,
                              capture_output=True, text=True, timeout=timeout, check=False,
                              stdin=None if input is not None else subprocess.DEVNULL)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.terminate()
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)
