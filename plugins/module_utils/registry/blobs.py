# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Layer compression, digests and the converted-layer cache.

A layer converted to another compression is written once to a cache keyed by
(uncompressed digest, compression); an unchanged re-push finds it there and
reads nothing but the archive's manifest and config.  The fastest compressor
available is used: isal's threaded igzip, then zlib-ng, then the standard
library (all produce valid gzip; the digest of a cached layer is what counts).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import tempfile
import zlib
from typing import IO, Callable, Dict, Optional, Tuple

from ansible_collections.metax.gpu.plugins.module_utils.registry.errors import ArtifactError

try:  # pragma: no cover - depends on the environment
    from isal import igzip_threaded as _igzip_threaded  # type: ignore[import-not-found,import-untyped,unused-ignore]
    from isal import igzip as _igzip  # type: ignore[import-not-found,import-untyped,unused-ignore]
    HAS_ISAL = True
except ImportError:  # pragma: no cover
    _igzip_threaded = None
    _igzip = None
    HAS_ISAL = False

try:  # pragma: no cover
    import zstandard as _zstd  # type: ignore[import-not-found,import-untyped,unused-ignore]
    HAS_ZSTD = True
except ImportError:  # pragma: no cover
    _zstd = None
    HAS_ZSTD = False

CHUNK = 1 << 20
COMPRESSIONS = ("gzip", "zstd", "none")

# media types by compression
OCI_LAYER = {
    "none": "application/vnd.oci.image.layer.v1.tar",
    "gzip": "application/vnd.oci.image.layer.v1.tar+gzip",
    "zstd": "application/vnd.oci.image.layer.v1.tar+zstd",
}
DOCKER_LAYER = {
    "none": "application/vnd.docker.image.rootfs.diff.tar",
    "gzip": "application/vnd.docker.image.rootfs.diff.tar.gzip",
}
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)
MANIFEST_TYPES = (OCI_MANIFEST, DOCKER_MANIFEST)


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical_json(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()


def compression_of(media_type: str, head: bytes = b"") -> str:
    """The compression of a layer, from its media type or (failing that) its first bytes."""
    if media_type.endswith("gzip"):
        return "gzip"
    if media_type.endswith("zstd"):
        return "zstd"
    if media_type.endswith(".tar") or media_type.endswith("diff.tar"):
        return "none"
    if head[:2] == b"\x1f\x8b":
        return "gzip"
    if head[:4] == b"\x28\xb5\x2f\xfd":
        return "zstd"
    return "none"


def layer_media_type(compression: str, docker: bool) -> str:
    if docker and compression in DOCKER_LAYER:
        return DOCKER_LAYER[compression]
    return OCI_LAYER[compression]


def _decompressor(compression: str, raw: IO[bytes]) -> IO[bytes]:
    if compression == "gzip":
        if HAS_ISAL:
            return _igzip.IGzipFile(fileobj=raw, mode="rb")  # type: ignore[union-attr]
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if compression == "zstd":
        if not HAS_ZSTD:
            raise ArtifactError("a zstd-compressed layer needs the Python package zstandard (pip install zstandard)")
        return _zstd.ZstdDecompressor().stream_reader(raw, read_across_frames=True)  # type: ignore[union-attr]
    return raw


class _HashingWriter:
    """A file writer that also hashes and counts what passes through it."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.hash = hashlib.sha256()
        self.size = 0

    def write(self, data) -> int:
        self.hash.update(data)
        self.size += len(data)
        return self.out.write(data)

    def flush(self) -> None:
        self.out.flush()

    def close(self) -> None:  # the caller owns self.out
        pass

    @property
    def closed(self) -> bool:
        return False

    def writable(self) -> bool:
        return True


def _compressor(compression: str, out: _HashingWriter, threads: int) -> Tuple[object, Callable[[], None]]:
    """A writable object compressing into ``out`` and the function that finishes it."""
    if compression == "gzip":
        if HAS_ISAL:
            # mtime=0: the same input gives the same blob (and digest) every time
            if threads > 1:
                gz = _igzip_threaded.open(out, "wb", compresslevel=1, threads=threads)  # type: ignore[union-attr]
            else:
                gz = _igzip.IGzipFile(fileobj=out, mode="wb", compresslevel=1, mtime=0)  # type: ignore[union-attr]
        else:
            gz = gzip.GzipFile(fileobj=out, mode="wb", compresslevel=1, mtime=0)  # type: ignore[arg-type]
        return gz, gz.close
    if compression == "zstd":
        if not HAS_ZSTD:
            raise ArtifactError("compression zstd needs the Python package zstandard (pip install zstandard)")
        cctx = _zstd.ZstdCompressor(level=3, threads=max(threads, 1) if threads > 1 else 0)  # type: ignore[union-attr]
        writer = cctx.stream_writer(out, closefd=False)

        def finish() -> None:
            writer.flush(_zstd.FLUSH_FRAME)  # type: ignore[union-attr]
            writer.close()
        return writer, finish

    class _Plain:
        write = out.write
    return _Plain(), lambda: None


class LayerCache:
    """Converted layers on disk: ``<dir>/<compression>/<diff-id hex>`` plus an index of their digests."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def _index_path(self, compression: str, diff_id: str) -> str:
        return os.path.join(self.directory, compression, diff_id.split(":", 1)[-1] + ".json")

    def lookup(self, compression: str, diff_id: str) -> Optional[Dict[str, object]]:
        try:
            with open(self._index_path(compression, diff_id)) as handle:
                entry = json.load(handle)
            if os.path.getsize(entry["path"]) == entry["size"]:
                return entry
        except (OSError, ValueError, KeyError, TypeError):
            pass
        return None

    def convert(self, opener: Callable[[], IO[bytes]], source_compression: str, target: str,
                diff_id: Optional[str], threads: int = 1) -> Dict[str, object]:
        """Re-compress a layer into the cache; checks its uncompressed digest against ``diff_id``."""
        if diff_id:
            cached = self.lookup(target, diff_id)
            if cached:
                return cached
        folder = os.path.join(self.directory, target)
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".layer.")
        try:
            with os.fdopen(fd, "wb") as raw_out:
                out = _HashingWriter(raw_out)
                comp, finish = _compressor(target, out, threads)
                plain_hash = hashlib.sha256()
                with opener() as raw_in:
                    src = _decompressor(source_compression, raw_in)
                    while True:
                        block = src.read(CHUNK)
                        if not block:
                            break
                        plain_hash.update(block)
                        comp.write(block)  # type: ignore[attr-defined]
                finish()
            actual = "sha256:" + plain_hash.hexdigest()
            if diff_id and actual != diff_id:
                raise ArtifactError("layer content is %s but the image config says %s (corrupt archive?)" % (actual, diff_id))
            digest = "sha256:" + out.hash.hexdigest()
            final = os.path.join(folder, digest.split(":", 1)[1])
            os.replace(tmp, final)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        entry: Dict[str, object] = {"path": final, "digest": digest, "size": out.size, "diff_id": actual}
        index = self._index_path(target, actual)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".index.")
        with os.fdopen(fd, "w") as handle:
            json.dump(entry, handle)
        os.replace(tmp, index)
        return entry


def default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "metax-gpu", "layers")


def hash_stream(stream: IO[bytes]) -> Tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    while True:
        block = stream.read(CHUNK)
        if not block:
            break
        h.update(block)
        size += len(block)
    return "sha256:" + h.hexdigest(), size


def zlib_available() -> bool:  # stdlib fallback is always there; kept for the docs/benchmark
    return zlib is not None
