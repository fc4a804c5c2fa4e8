# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The MACA component's copy of a multi-GB MXMACA tree onto a node (issue 25).

    flock /tmp/metax-heavy.lock env PYTHONPATH=.build/collections \\
        .venv/bin/python benchmarks/maca_copy_bench.py [--gib 3] [--work DIR] [--json FILE]

maca-manager copies the payload image's ``/opt/maca`` (an image volume, so
files on the node's disk) into ``/opt/.maca-<version>.tmp``, renames it to
``/opt/maca-<version>`` and switches ``/opt/maca``: ``maca/install.py``'s
``install(tree=...)``, the code measured here. The tree is generated, never
downloaded: real files (the venv's shared objects and Debian's ``/usr``, as
``realistic_image`` picks them) repeated until ``--gib``, in the shape of an
SDK (many small files, a few large libraries). Measured, each on a cold and
a warm page cache of the source (cold: ``posix_fadvise(DONTNEED)`` on the
tree's own files, nothing else of the machine's cache is dropped):

* ``install(tree=...)`` (copy + rename + switch), MB/s and files/s;
* ``cp -a`` of the same tree, the baseline an init container would have;
* the second ``install`` of the same version (nothing to copy).

A real MACA layer is 5-9.5 GB (manual 1.4.3); in a cluster the kubelet's pull
and unpack of the payload image comes before this copy (containerd's own
figures) and is not measured here.
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
sys.path.insert(0, HERE)

import realistic_image  # noqa: E402

from ansible_collections.metax.gpu.plugins.module_utils.host import HostRoot  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.maca import install as maca_install  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.sim.maca import write_tree  # noqa: E402

MB = 1000 * 1000
BIG_LIBRARY = 512 << 20      # an SDK has a few libraries of hundreds of MB (libmcblas, the LLVM backend)


def make_tree(tree: str, size: int) -> tuple:
    """An MXMACA-shaped tree of ``size`` bytes of real files; (bytes, files)."""
    write_tree(tree, "2.23.0.4", product="C500")
    files = realistic_image.source_files([sys.prefix, "/usr/lib", "/usr/share"])
    total = count = 0
    # a quarter in a few big libraries (real file bytes, concatenated), the rest small files under lib/ and include/
    big = size // 4
    index = 0
    while total < big:
        path = os.path.join(tree, "lib", "libmxbig%d.so" % index)
        with open(path, "wb") as out:
            for src, _name, length in realistic_image._files_until(files, min(BIG_LIBRARY, big - total), index * 997):
                with open(src, "rb") as handle:
                    out.write(handle.read(length))
        total += os.path.getsize(path)
        count += 1
        index += 1
    for src, name, length in realistic_image._files_until(files, size - total, 0):
        dest = os.path.join(tree, "lib" if name.endswith(".so") or ".so." in name else "include", name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        with open(src, "rb") as handle, open(dest, "wb") as out:
            out.write(handle.read(length))
        total += length
        count += 1
    subprocess.run(["sync"], check=True)
    return total, count


def drop_cache(tree: str) -> None:
    """Evict the tree's own pages (cold source), leaving the rest of the machine's cache alone."""
    for base, _dirs, names in os.walk(tree):
        for name in names:
            path = os.path.join(base, name)
            if os.path.islink(path):
                continue
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--gib", type=float, default=3.0)
    parser.add_argument("--work", default=None, help="scratch directory (default: a new one in /var/tmp)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="maca-copy-bench.", dir="/var/tmp")
    tree = os.path.join(work, "payload", "opt", "maca")
    results = {}
    try:
        gen = time.perf_counter()
        size, files = make_tree(tree, int(args.gib * (1 << 30)))
        print("tree: %.2f GB in %d files (generated in %.0f s)" % (size / 1e9, files, time.perf_counter() - gen))
        for cache in ("cold", "warm"):
            node = HostRoot(os.path.join(work, "node-" + cache))
            os.makedirs(node.join("/opt"), exist_ok=True)
            if cache == "cold":
                drop_cache(tree)
            seconds = timed(lambda n=node: maca_install.install(n, None, "2.23.0.4", tree=tree))
            assert os.readlink(node.join("/opt/maca")) == "maca-2.23.0.4"
            again = timed(lambda n=node: maca_install.install(n, None, "2.23.0.4", tree=tree))
            if cache == "cold":
                drop_cache(tree)
            cp_dest = os.path.join(work, "cp-" + cache)
            cp_seconds = timed(lambda d=cp_dest: subprocess.run(["cp", "-a", tree, d], check=True))
            subprocess.run(["sync"], check=True)
            results[cache] = {"install_s": round(seconds, 2), "install_MBps": round(size / MB / seconds),
                              "files_per_s": round(files / seconds), "cp_a_s": round(cp_seconds, 2),
                              "cp_a_MBps": round(size / MB / cp_seconds), "again_s": round(again, 4)}
            print("%s source cache: install(tree=) %.1f s = %d MB/s, %d files/s; cp -a %.1f s = %d MB/s; "
                  "the same version again %.4f s"
                  % (cache, seconds, size / MB / seconds, files / seconds, cp_seconds, size / MB / cp_seconds, again))
            shutil.rmtree(node.path)
            shutil.rmtree(cp_dest)
        results["bytes"], results["files"] = size, files
        if args.json:
            with open(args.json, "w") as handle:
                json.dump(results, handle, indent=2)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
