# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""scripts/cluster/lib.sh ``ensure_go``: a machine without Go >= 1.26 gets the pinned toolchain.

The Go module proxy is a real HTTP server on loopback serving a toolchain zip
laid out as proxy.golang.org serves ``golang.org/toolchain`` (its ``go`` is a
shell script answering ``go env GOVERSION``).
"""

from __future__ import annotations

import hashlib
import http.server
import os
import subprocess
import threading
import zipfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
LIB_SH = os.path.join(REPO, "scripts", "cluster", "lib.sh")
VERSION = "go1.26.99"


class _Proxy(http.server.SimpleHTTPRequestHandler):
    requests: list[str] = []

    def log_message(self, *args):  # keep pytest's output clean
        pass

    def do_GET(self):
        _Proxy.requests.append(self.path)
        super().do_GET()


@pytest.fixture()
def proxy(tmp_path):
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine)
    if arch is None:
        pytest.skip("no pinned toolchain for %s" % os.uname().machine)
    root = tmp_path / "proxy"
    zip_dir = root / "golang.org" / "toolchain" / "@v"
    zip_dir.mkdir(parents=True)
    path = zip_dir / ("v0.0.1-%s.linux-%s.zip" % (VERSION, arch))
    prefix = "golang.org/toolchain@v0.0.1-%s.linux-%s/" % (VERSION, arch)
    with zipfile.ZipFile(path, "w") as z:
        go = zipfile.ZipInfo(prefix + "bin/go")
        go.external_attr = 0o100755 << 16
        z.writestr(go, '#!/bin/sh\n[ "$1 $2" = "env GOVERSION" ] && echo %s\n' % VERSION)
        z.writestr(prefix + "VERSION", VERSION + "\n")
    _Proxy.requests = []
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), lambda *a, **kw: _Proxy(*a, directory=str(root), **kw))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield {"url": "http://127.0.0.1:%d" % server.server_address[1],
           "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    server.shutdown()
    server.server_close()


def _ensure_go(tmp_path, proxy, go="", sha256=""):
    cache = tmp_path / "cache"
    sha = sha256 or proxy["sha256"]
    env = dict(os.environ, METAX_CACHE_DIR=str(cache), GO_TOOLCHAIN_VERSION=VERSION,
               GO_TOOLCHAIN_SHA256_amd64=sha, GO_TOOLCHAIN_SHA256_arm64=sha,
               GOPROXY="off|%s/,direct" % proxy["url"],
               GO=go or str(cache / "go-toolchain" / VERSION / "bin" / "go"))
    proc = subprocess.run(["bash", "-c", 'source "$0" && ensure_go && echo "$GO" && "$GO" env GOVERSION', LIB_SH],
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    return proc, cache / "go-toolchain"


def test_fetches_checks_and_unpacks_the_pinned_toolchain(tmp_path, proxy):
    proc, toolchains = _ensure_go(tmp_path, proxy)
    assert proc.returncode == 0, proc.stderr
    go = toolchains / VERSION / "bin" / "go"
    assert proc.stdout.split() == [str(go), VERSION]
    assert os.access(go, os.X_OK)
    assert (toolchains / VERSION / "VERSION").read_text() == VERSION + "\n"
    assert os.listdir(toolchains) == [VERSION]            # no temp dir, no zip left
    assert len(_Proxy.requests) == 1

    again = _ensure_go(tmp_path, proxy)[0]                # present: nothing fetched
    assert again.returncode == 0, again.stderr
    assert len(_Proxy.requests) == 1


def test_refuses_a_zip_whose_checksum_differs(tmp_path, proxy):
    proc, toolchains = _ensure_go(tmp_path, proxy, sha256="0" * 64)
    assert proc.returncode != 0
    assert "SHA-256 differs from the pinned GO_TOOLCHAIN_SHA256_" in proc.stderr
    assert os.listdir(toolchains) == []


def test_never_replaces_a_go_the_caller_chose(tmp_path, proxy):
    old = tmp_path / "go1.19"
    old.write_text('#!/bin/sh\necho go1.19.8\n')
    old.chmod(0o755)
    proc, toolchains = _ensure_go(tmp_path, proxy, go=str(old))
    assert proc.returncode != 0
    assert "is not a usable Go >= 1.26 (go1.19.8)" in proc.stderr
    assert _Proxy.requests == [] and not toolchains.exists()


def test_an_unset_goproxy_means_the_go_module_proxy(tmp_path):
    """A fresh machine has no GOPROXY: under the scripts' `set -u` the fetch goes to the default proxy.

    A fake curl on PATH records the URL and fails, so nothing is downloaded.
    """
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "curl").write_text('#!/bin/sh\nfor a; do url=$a; done\necho "$url" > "%s"\nexit 22\n'
                                 % (tmp_path / "url"))
    (bindir / "curl").chmod(0o755)
    cache = tmp_path / "cache"
    env = {k: v for k, v in os.environ.items() if k != "GOPROXY"}
    env.update(PATH="%s:%s" % (bindir, os.environ["PATH"]), METAX_CACHE_DIR=str(cache), GO_TOOLCHAIN_VERSION=VERSION,
               GO=str(cache / "go-toolchain" / VERSION / "bin" / "go"))
    proc = subprocess.run(["bash", "-c", 'set -euo pipefail; source "$0"; ensure_go', LIB_SH],
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode != 0
    assert "unbound variable" not in proc.stderr
    assert "cannot download https://proxy.golang.org/golang.org/toolchain/@v/v0.0.1-%s.linux-" % VERSION \
        in proc.stderr
    assert (tmp_path / "url").read_text().startswith("https://proxy.golang.org/golang.org/toolchain/@v/")
