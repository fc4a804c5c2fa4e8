# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Benchmark images whose layers compress like real ones, written the way the vendor ships MACA images.

Layers are tars of real files: the collection's own venv (Python, shared
objects) and Debian's ``/usr`` (binaries, libraries, headers, docs), taken in
a fixed order and repeated under new directory names until a layer has its
size, so the same arguments always give the same bytes.  Real image layers
compress 2-4x; this mix gives about 2.5x with gzip -1 (printed by the benchmark).

The docker archive is written like ``docker save`` before docker 25: the
layer tars first (``<diff_id>/layer.tar``), then the config, then
``manifest.json`` last, which is what makes a one-pass reader work hard.
Then ``xz -T0`` compresses it (multi-block, as the vendor's ``.xz`` files are).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import subprocess
import tarfile
import tempfile
from typing import Iterator, List, Optional, Tuple

CHUNK = 1 << 20
MAX_FILE = 64 << 20   # very large files would make one layer a few copies of one file


def source_files(roots: List[str]) -> List[Tuple[str, str, int]]:
    """(path, name in the layer, size) of the regular files under ``roots``, in a fixed order."""
    out = []
    for root in roots:
        for folder, dirs, files in os.walk(root):
            dirs.sort()
            for name in sorted(files):
                path = os.path.join(folder, name)
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                if not stat.S_ISREG(st.st_mode) or not 0 < st.st_size <= MAX_FILE or not os.access(path, os.R_OK):
                    continue
                out.append((path, os.path.relpath(path, "/"), st.st_size))
    if not out:
        raise RuntimeError("no readable files under %s" % ", ".join(roots))
    return out


def _files_until(files: List[Tuple[str, str, int]], size: int, start: int) -> Iterator[Tuple[str, str, int]]:
    """Files in order from ``start`` (wrapping around, each round under its own directory) until ``size``."""
    total = 0
    index = start
    while total < size:
        path, name, length = files[index % len(files)]
        round_no = index // len(files)
        index += 1
        length = min(length, size - total)
        total += length + 512
        yield path, "r%d/%s" % (round_no, name), length


class _Hashing:
    """A file writer that hashes what goes through (the layer's diff_id)."""

    def __init__(self, handle) -> None:
        self.handle = handle
        self.hash = hashlib.sha256()
        self.size = 0

    def write(self, data) -> int:
        self.hash.update(data)
        self.size += len(data)
        return self.handle.write(data)

    def flush(self) -> None:
        self.handle.flush()


def write_layer(path: str, files: List[Tuple[str, str, int]], size: int, start: int = 0) -> Tuple[str, int]:
    """A layer tar of about ``size`` bytes at ``path``; returns (diff_id, size)."""
    with open(path, "wb") as raw:
        sink = _Hashing(raw)
        with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT, bufsize=CHUNK) as tar:  # type: ignore[call-overload]
            for src, name, length in _files_until(files, size, start):
                info = tarfile.TarInfo(name)
                info.size, info.mtime, info.mode = length, 0, 0o755
                try:
                    with open(src, "rb") as handle:
                        tar.addfile(info, _Exactly(handle, length))
                except OSError:
                    continue
    return "sha256:" + sink.hash.hexdigest(), sink.size


class _Exactly:
    """``length`` bytes of a file that may have shrunk meanwhile (zero-padded)."""

    def __init__(self, handle, length: int) -> None:
        self.handle = handle
        self.left = length

    def read(self, amount: int = -1) -> bytes:
        amount = self.left if amount < 0 else min(amount, self.left)
        data = self.handle.read(amount)
        data += b"\0" * (amount - len(data))
        self.left -= len(data)
        return data


def random_layer(path: str, size: int, seed: int) -> Tuple[str, int]:
    """The incompressible case: one file of sha256-chain bytes (deterministic per seed)."""
    with open(path, "wb") as raw:
        sink = _Hashing(raw)
        with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT, bufsize=CHUNK) as tar:  # type: ignore[call-overload]
            info = tarfile.TarInfo("data/random.bin")
            info.size, info.mtime = size, 0
            tar.addfile(info, _RandomStream(size, seed))
    return "sha256:" + sink.hash.hexdigest(), sink.size


class _RandomStream:
    def __init__(self, size: int, seed: int) -> None:
        self.left = size
        self.state = hashlib.sha256(b"seed-%d" % seed).digest()

    def read(self, amount: int = -1) -> bytes:
        amount = self.left if amount < 0 else min(amount, self.left)
        self.state = hashlib.sha512(self.state).digest()
        block = hashlib.shake_256(self.state).digest(amount) if amount else b""
        self.left -= len(block)
        return block


def docker_archive(path: str, ref: str, layer_sizes: List[int], roots: Optional[List[str]] = None,
                   random: bool = False) -> dict:
    """Write the docker archive; returns its diff_ids and uncompressed size."""
    files = [] if random else source_files(roots or [])
    folder = os.path.dirname(os.path.abspath(path))
    diff_ids = []
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as out:
        start = 0
        for i, size in enumerate(layer_sizes):
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=".layer.")
            os.close(fd)
            try:
                if random:
                    diff_id, length = random_layer(tmp, size, i)
                else:
                    diff_id, length = write_layer(tmp, files, size, start)
                    start += len(files) // max(1, len(layer_sizes)) + 7
                info = tarfile.TarInfo("%s/layer.tar" % diff_id.split(":")[1])
                info.size, info.mtime = length, 0
                with open(tmp, "rb") as handle:
                    out.addfile(info, handle)
                diff_ids.append(diff_id)
            finally:
                os.unlink(tmp)
        config = json.dumps({"architecture": "amd64", "os": "linux",
                             "config": {"Cmd": ["/bin/bash"], "Env": ["PATH=/opt/maca/bin:/usr/bin:/bin"]},
                             "rootfs": {"type": "layers", "diff_ids": diff_ids},
                             "history": [{"created_by": "benchmark layer %d" % i} for i in range(len(diff_ids))]}).encode()
        config_name = hashlib.sha256(config).hexdigest() + ".json"
        for name, data in ((config_name, config),
                           ("manifest.json", json.dumps([{"Config": config_name, "RepoTags": [ref], "Layers": [
                               "%s/layer.tar" % d.split(":")[1] for d in diff_ids]}]).encode())):
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            out.addfile(info, io.BytesIO(data))
    return {"diff_ids": diff_ids, "size": os.path.getsize(path)}


def xz_compress(tar_path: str, xz_path: str, level: int = 6) -> None:
    """``xz -T0`` (multi-block) as the vendor's archives; the tar stays for skopeo."""
    with open(xz_path + ".part", "wb") as out:
        subprocess.run(["xz", "-T0", "-%d" % level, "-c", tar_path], stdout=out, check=True)
    os.replace(xz_path + ".part", xz_path)
