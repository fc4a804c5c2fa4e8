# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Layer compression, digests and the converted-layer cache.

A layer converted to another compression is written once to a cache keyed by
(uncompressed digest, compression); an unchanged re-push finds it there and
reads nothing but the archive's manifest and config.  gzip uses isal (ISA-L,
~10x the standard library's zlib at level 1 on this machine) when installed,
else zlib; zstd uses the zstandard package.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import tempfile
import zlib
from typing import IO, Any, Callable, Dict, Iterator, Optional, Tuple

from ansible_collections.metax.gpu.plugins.module_utils.registry import reference as R
from ansible_collections.metax.gpu.plugins.module_utils.registry.errors import ArtifactError

try:  # pragma: no cover - depends on the environment
    from isal import igzip as _igzip  # type: ignore[import-not-found,import-untyped,unused-ignore]
    from isal import isal_zlib as _isal_zlib  # type: ignore[import-not-found,import-untyped,unused-ignore]
    HAS_ISAL = True
except ImportError:  # pragma: no cover
    _igzip = _isal_zlib = None  # type: ignore[assignment]
    HAS_ISAL = False

try:  # pragma: no cover
    import zstandard as _zstd  # type: ignore[import-not-found,import-untyped,unused-ignore]
    HAS_ZSTD = True
except ImportError:  # pragma: no cover
    _zstd = None  # type: ignore[assignment]
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


def _decompressor(compression: str, raw: IO[bytes]) -> Any:
    if compression == "gzip":
        if HAS_ISAL:
            return _igzip.IGzipFile(fileobj=raw, mode="rb")
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if compression == "zstd":
        if not HAS_ZSTD:
            raise ArtifactError("a zstd-compressed layer needs the Python package zstandard (pip install zstandard)")
        return _zstd.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
    return raw


def _compressobj(compression: str):
    """An object with compress(data) -> bytes and flush() -> bytes; deterministic output (gzip mtime 0)."""
    if compression == "gzip":
        # wbits 31: a gzip member; level 1 is isal's fastest that never expands incompressible data
        return _isal_zlib.compressobj(1, _isal_zlib.DEFLATED, 31) if HAS_ISAL else zlib.compressobj(1, zlib.DEFLATED, 31)
    if compression == "zstd":
        if not HAS_ZSTD:
            raise ArtifactError("compression zstd needs the Python package zstandard (pip install zstandard)")
        return _zstd.ZstdCompressor(level=3).compressobj()
    return None


class Converter:
    """Streams one layer re-compressed to ``target``: yields the compressed bytes, hashing both sides.

    After the stream ends, ``digest``/``size`` describe the compressed blob and
    ``error`` is set (instead of raising inside the HTTP layer) when the
    uncompressed content does not match ``diff_id``.
    """

    def __init__(self, opener: Callable[[], IO[bytes]], source: str, target: str, diff_id: Optional[str],
                 origin: str = "") -> None:
        self.opener = opener
        self.source = source
        self.target = target
        self.diff_id = diff_id
        self.origin = origin
        self.digest = ""
        self.size = 0
        self.plain_digest = ""
        self.error: Optional[Exception] = None
        self.progress: Optional[Callable[[int], None]] = None

    def chunks(self) -> Iterator[bytes]:
        out_hash = hashlib.sha256()
        plain_hash = hashlib.sha256()
        comp = _compressobj(self.target)
        size = 0
        with self.opener() as raw:
            src = _decompressor(self.source, raw)
            while True:
                block = src.read(CHUNK)
                if not block:
                    break
                plain_hash.update(block)
                data = comp.compress(block) if comp is not None else block
                if self.progress:
                    self.progress(len(block))
                if data:
                    out_hash.update(data)
                    size += len(data)
                    yield data
        if comp is not None:
            data = comp.flush()
            out_hash.update(data)
            size += len(data)
            if data:
                yield data
        self.plain_digest = "sha256:" + plain_hash.hexdigest()
        if self.diff_id and self.plain_digest != self.diff_id:
            self.error = ArtifactError("%s: layer content is %s but the image config says %s (corrupt archive?)"
                                       % (self.origin or "archive", self.plain_digest, self.diff_id))
        self.digest = "sha256:" + out_hash.hexdigest()
        self.size = size


class LayerCache:
    """Digests of converted layers, keyed by (compression, uncompressed digest); optionally the blobs too.

    A push streams conversions straight to the registry and records only the
    digest, so an unchanged re-push knows the manifest without compressing; the
    bundle writer keeps the blob files (``convert``).
    """

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def _index_path(self, compression: str, diff_id: str) -> str:
        # diff_id comes from an image config: a digest by the grammar before it names a file
        return os.path.join(self.directory, compression, R.digest(diff_id, "diff_id").split(":", 1)[-1] + ".json")

    def lookup(self, compression: str, diff_id: str, need_file: bool = False) -> Optional[Dict[str, Any]]:
        try:
            with open(self._index_path(compression, diff_id)) as handle:
                entry = json.load(handle)
            if not need_file or (entry.get("path") and os.path.getsize(entry["path"]) == entry["size"]):
                return entry
        except (OSError, ValueError, KeyError, TypeError):
            pass
        return None

    def record(self, compression: str, diff_id: str, digest: str, size: int, path: str = "") -> Dict[str, Any]:
        folder = os.path.join(self.directory, compression)
        os.makedirs(folder, exist_ok=True)
        entry: Dict[str, Any] = {"digest": digest, "size": size, "diff_id": diff_id}
        if path:
            entry["path"] = path
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".index.")
        with os.fdopen(fd, "w") as handle:
            json.dump(entry, handle)
        os.replace(tmp, self._index_path(compression, diff_id))
        return entry

    def convert(self, opener: Callable[[], IO[bytes]], source_compression: str, target: str,
                diff_id: Optional[str], origin: str = "") -> Dict[str, Any]:
        """Re-compress a layer into a cached file; checks its uncompressed digest against ``diff_id``."""
        if diff_id:
            cached = self.lookup(target, diff_id, need_file=True)
            if cached:
                return cached
        folder = os.path.join(self.directory, target)
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".layer.")
        conv = Converter(opener, source_compression, target, diff_id, origin)
        try:
            with os.fdopen(fd, "wb") as out:
                for data in conv.chunks():
                    out.write(data)
            if conv.error:
                raise conv.error
            final = os.path.join(folder, conv.digest.split(":", 1)[1])
            os.replace(tmp, final)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        return self.record(target, conv.plain_digest, conv.digest, conv.size, final)


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
