# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The vendor's xz-compressed docker archives (MXMACA base images, manual section 1.4.3).

``maca-c500-container-2.23.0.4-ubuntu18.04-amd64.xz`` loads as
``cr.metax-tech.com/library/maca-c500:<version>``; later releases
(``mxc500-maca-<ver>-ubuntu20.04-amd64.container.xz``) as ``mxc500-maca:<version>``.
An xz stream can only be read from the start, so everything here reads the
archive once, in order: the layer tars come first in a ``docker save`` tar,
``manifest.json`` and the config last.
"""

from __future__ import annotations

import base64
import hashlib
import json
import lzma
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass, field
from typing import IO, Any, Dict, List, Optional

from ansible_collections.metax.gpu.plugins.module_utils import archive as A
from ansible_collections.metax.gpu.plugins.module_utils.registry.errors import ArtifactError

XZ_MAGIC = b"\xfd7zXZ\x00"
# a layer is streamed, never buffered; other members up to this size are kept in memory (configs, manifests)
SMALL_MEMBER = 4 << 20
SMALL_TOTAL = 64 << 20
_KEY_SPAN = 1 << 20
# xz -T0 keeps whole uncompressed blocks per thread (24 MiB at -6, 192 MiB at -9): above this it decodes
# with fewer threads, down to one, never refuses; so xz's memory stays bounded whatever the vendor used
XZ_MT_MEMLIMIT = "160MiB"


def is_xz(path: str) -> bool:
    """By the stream header's magic bytes, whatever the file is called."""
    try:
        with open(path, "rb") as handle:
            return handle.read(len(XZ_MAGIC)) == XZ_MAGIC
    except OSError:
        return False


def archive_key(path: str) -> str:
    """Identity of an archive without decompressing it: size, mtime and the first and last MiB.

    The last MiB holds the xz index (every block's sizes) and the last block's
    check; the mtime catches an in-place edit that keeps the sizes.
    """
    st = os.stat(path)
    h = hashlib.sha256(b"%d:%d:" % (st.st_size, st.st_mtime_ns))
    with open(path, "rb") as handle:
        h.update(handle.read(_KEY_SPAN))
        if st.st_size > 2 * _KEY_SPAN:
            handle.seek(st.st_size - _KEY_SPAN)
        h.update(handle.read(_KEY_SPAN))
    return h.hexdigest()


_VERSIONED = re.compile(r"^(?P<name>[a-z0-9][a-z0-9._-]*?)(?:-container)?-\d")


def guess_name(path: str) -> str:
    """The repository the archive most likely loads as, from its file name (both vendor generations).

    Only a guess to start uploading before ``manifest.json`` (at the end of the
    archive) is read; the image's own name always wins.
    """
    base = os.path.basename(path)
    for suffix in (".xz", ".container", ".tar"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
    found = _VERSIONED.match(base.lower())
    return found.group("name") if found else (base.lower() or "image")


class XzReader:
    """The decompressed archive as a readable stream: Debian's ``xz -dc -T0`` in a pipe (multi-block
    archives decompress on every core) or Python's lzma (one core); ``tool`` is auto, xz or python."""

    def __init__(self, path: str, tool: str = "auto") -> None:
        self.path = path
        self.proc: Optional[subprocess.Popen] = None
        self._stderr: Optional[IO[bytes]] = None
        xz = shutil.which("xz") if tool in ("auto", "xz") else None
        if tool == "xz" and xz is None:
            raise ArtifactError("xz_tool=xz but the xz program is not on PATH (Debian package xz-utils)")
        if xz:
            self._stderr = tempfile.TemporaryFile()
            self.proc = subprocess.Popen([xz, "-dc", "-T0", "--memlimit-mt-decompress=" + XZ_MT_MEMLIMIT, "--", path],
                                         stdout=subprocess.PIPE, stderr=self._stderr, bufsize=0)
            self.stream: IO[bytes] = self.proc.stdout  # type: ignore[assignment]
            _grow_pipe(self.stream)
        else:
            self.stream = lzma.open(path, "rb")
        self.tool = "xz" if xz else "python"

    def read(self, amount: int = -1) -> bytes:
        try:
            return self.stream.read(amount)
        except (lzma.LZMAError, EOFError) as exc:
            raise corrupt(self.path, exc) from exc

    def drain(self) -> None:
        """Read to the end and check the stream: a damaged tail after the tar's end still fails."""
        while self.read(1 << 20):
            pass
        if self.proc is not None:
            if self.proc.wait() != 0:
                raise corrupt(self.path, self.error_text())

    def error_text(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        return self._stderr.read().decode("utf-8", "replace").strip()

    def close(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.stdout.close()  # type: ignore[union-attr]
            self.proc.wait()
        else:
            self.stream.close()
        if self._stderr is not None:
            self._stderr.close()

    def __enter__(self) -> "XzReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _grow_pipe(stream: IO[bytes]) -> None:
    """A 1 MiB pipe instead of 64 KiB: xz runs further ahead and each read is one system call."""
    try:
        import fcntl
        fcntl.fcntl(stream.fileno(), getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
    except (ImportError, OSError):  # not Linux, or above /proc/sys/fs/pipe-max-size
        pass


def corrupt(path: str, why: Any) -> ArtifactError:
    return ArtifactError("%s: truncated or corrupt xz archive (%s); nothing was tagged" % (path, why or "xz failed"))


class _NoClose:
    """A tar member's stream for the layer producer; closing it must not close the archive."""

    def __init__(self, handle: IO[bytes]) -> None:
        self.handle = handle

    def read(self, amount: int = -1) -> bytes:
        return self.handle.read(amount)


def open_tar(reader: XzReader, limits: A.Limits = A.DEFAULT_LIMITS) -> tarfile.TarFile:
    """The decompressed archive as a forward-only tar whose extended headers are bounded (issue 39);
    iterate it with :func:`archive.members`, which keeps no header."""
    return A.open_stream(reader, limits)  # type: ignore[arg-type]


def member_stream(tar: tarfile.TarFile, member: tarfile.TarInfo) -> IO[bytes]:
    handle = tar.extractfile(member)
    if handle is None:
        raise AssertionError("only regular files are streamed")
    return _NoClose(handle)  # type: ignore[return-value]


def is_layer_name(name: str, size: int) -> bool:
    """Stream this member as a layer: ``<id>/layer.tar`` (classic docker save), or any large blob."""
    if name == "layer.tar" or name.endswith("/layer.tar"):
        return True
    if name.endswith(".json") or name in ("repositories", "oci-layout") or name.endswith("/json") \
            or name.endswith("/VERSION"):
        return False
    return size > SMALL_MEMBER


def norm(name: str) -> str:
    return os.path.normpath(name).lstrip("/")


# ---------------------------------------------------------------------------------------------
# what the archive holds, once read: kept in the cache so that a re-push reads nothing

@dataclass
class LayerRef:
    member: str          # path inside the archive
    diff_id: str
    digest: str          # of the blob in the requested compression
    size: int
    plain_size: int = 0


@dataclass
class ImageRef:
    name: str
    tag: str
    config: bytes
    layers: List[LayerRef] = field(default_factory=list)

    def as_json(self) -> Dict[str, Any]:
        return {"name": self.name, "tag": self.tag, "config": base64.b64encode(self.config).decode(),
                "layers": [l.__dict__ for l in self.layers]}

    @classmethod
    def from_json(cls, doc: Dict[str, Any]) -> "ImageRef":
        return cls(name=doc["name"], tag=doc["tag"], config=base64.b64decode(doc["config"]),
                   layers=[LayerRef(**l) for l in doc["layers"]])


class ArchiveCache:
    """``<cache_dir>/archives/<compression>/<archive key>.json``: the images of an archive with their
    blob digests in one compression, and the repository the layers were uploaded to."""

    def __init__(self, directory: str) -> None:
        self.directory = os.path.join(directory, "archives")

    def _path(self, compression: str, key: str) -> str:
        return os.path.join(self.directory, compression, key + ".json")

    def lookup(self, compression: str, key: str) -> Optional[Dict[str, Any]]:
        try:
            with open(self._path(compression, key)) as handle:
                doc = json.load(handle)
            doc["images"] = [ImageRef.from_json(i) for i in doc["images"]]
            return doc
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def record(self, compression: str, key: str, images: List[ImageRef], staging: str) -> None:
        folder = os.path.join(self.directory, compression)
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".archive.")
        with os.fdopen(fd, "w") as handle:
            json.dump({"staging": staging, "images": [i.as_json() for i in images]}, handle)
        os.replace(tmp, self._path(compression, key))
