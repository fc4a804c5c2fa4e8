# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""registry_push against skopeo: push a ~1 GiB, 4-layer docker-archive of incompressible data.

    PYTHONPATH=.build/collections .venv/bin/python benchmarks/registry_push_bench.py [--mib 1024] [--json FILE]

Starts Debian's docker-registry on an ephemeral port (temp dir), then in the
same run: ``skopeo copy docker-archive:... docker://...`` (gzip, its default;
and zstd), our push in each compression with a cold layer cache, and the
unchanged re-push.  Prints seconds, MiB/s and the ratio to skopeo's gzip
throughput (issue 13 targets: >= 1.5x at gzip, re-push <= 0.1 s).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, ".build", "collections"))
sys.path.insert(0, os.path.join(ROOT, "tests", "unit", "registry"))

from registry_fixtures import layer_tar, make_docker_archive, start_registry  # noqa: E402

from ansible_collections.metax.gpu.plugins.module_utils.registry import api  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.registry import blobs  # noqa: E402


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=1024, help="total layer size")
    parser.add_argument("--json", default="")
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="regbench.")
    reg = None
    try:
        per_layer = (args.mib << 20) // 4
        layers = [layer_tar({"data/%d.bin" % i: os.urandom(per_layer)}) for i in range(4)]
        archive = os.path.join(work, "image.tar")
        make_docker_archive(archive, "bench/image:1", layers)
        del layers
        size_mib = os.path.getsize(archive) / (1 << 20)
        reg = start_registry(os.path.join(work, "registry"))
        rows = []

        def skopeo(fmt: str, repo: str) -> None:
            # a registry of its own: skopeo's blob-info cache would otherwise reuse the other run's blobs
            own = start_registry(os.path.join(work, "registry-" + repo))
            try:
                cmd = ["skopeo", "copy", "-q", "--dest-tls-verify=false"]
                if fmt != "gzip":
                    cmd += ["--dest-compress-format", fmt]
                subprocess.run(cmd + ["docker-archive:" + archive, "docker://%s/%s:1" % (own.host, repo)],
                               check=True, capture_output=True)
            finally:
                own.stop()

        # registry start-up is inside skopeo's time: measure it alone and subtract
        startup, _out = timed(lambda: start_registry(os.path.join(work, "registry-probe")).stop())
        secs, _out = timed(lambda: skopeo("gzip", "skopeo-gzip"))
        base = secs - startup
        rows.append(("skopeo copy (gzip, default)", base))
        secs, _out = timed(lambda: skopeo("zstd", "skopeo-zstd"))
        rows.append(("skopeo copy (zstd)", secs - startup))
        repush = {}
        for comp in ("gzip", "zstd", "none"):
            cache = os.path.join(work, "cache-" + comp)
            req = api.PushRequest(src=archive, registry="%s/ours-%s" % (reg.host, comp), plain_http=True,
                                  compression=comp, cache_dir=cache, concurrency=args.concurrency)
            secs, result = timed(lambda: api.push(req))
            assert result["changed"]
            rows.append(("registry_push %s (cold cache)" % comp, secs))
            secs, result = timed(lambda: api.push(req))
            assert not result["changed"]
            repush[comp] = secs
        print("archive: %.0f MiB, 4 layers of random data; isal=%s zstandard=%s; %d CPUs"
              % (size_mib, blobs.HAS_ISAL, blobs.HAS_ZSTD, os.cpu_count() or 0))
        print("%-34s %9s %9s %18s" % ("push", "seconds", "MiB/s", "vs skopeo gzip"))
        for name, secs in rows:
            print("%-34s %9.2f %9.1f %17.2fx" % (name, secs, size_mib / secs, base / secs))
        for comp, secs in repush.items():
            label = "registry_push %s unchanged re-push" % comp
            print("%-34s %9.3f %9s %18s" % (label, secs, "-", "target <= 0.1 s"))
        if args.json:
            with open(args.json, "w") as handle:
                json.dump({"mib": size_mib, "rows": rows, "repush": repush}, handle, indent=2)
    finally:
        if reg:
            reg.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
