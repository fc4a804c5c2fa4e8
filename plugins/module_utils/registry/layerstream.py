# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""One layer, one pass: read the uncompressed tar, hash it (diff_id), compress, hash again (blob digest).

A producer thread reads the layer and feeds the compressor; the compressed
bytes come out of a bounded queue as an iterator for the HTTP body.  The
producer and the HTTP sender therefore overlap, the compressor's own threads
(isal's threaded gzip) run beside them, and at most ``QUEUE_DEPTH`` chunks of
compressed data are in memory whatever the layer's size.
"""

from __future__ import annotations

import hashlib
import os
import queue
import threading
import time
import zlib
from typing import IO, Any, Callable, Iterator, Optional

from ansible_collections.metax.gpu.plugins.module_utils import archive as A
from ansible_collections.metax.gpu.plugins.module_utils.registry import blobs as B

try:  # pragma: no cover - depends on the environment
    from isal import igzip_threaded as _igzip_threaded  # type: ignore[import-not-found,import-untyped,unused-ignore]
    HAS_ISAL_THREADED = True
except ImportError:  # pragma: no cover
    _igzip_threaded = None  # type: ignore[assignment]
    HAS_ISAL_THREADED = False

CHUNK = B.CHUNK
QUEUE_DEPTH = 8
_DONE = object()


class _QueueSink:
    """A write-only file object whose writes become items of a bounded queue (the compressor's output)."""

    def __init__(self, out: "queue.Queue[Any]", cancelled: threading.Event) -> None:
        self.out = out
        self.cancelled = cancelled

    def write(self, data) -> int:
        size = len(data)
        if size:
            _put(self.out, bytes(data), self.cancelled)
        return size

    def flush(self) -> None:
        return None


def _put(out: "queue.Queue[Any]", item: Any, cancelled: threading.Event) -> None:
    # a full queue and a sender that gave up must not hang the producer (or isal's writer thread)
    while not cancelled.is_set():
        try:
            out.put(item, timeout=0.1)
            return
        except queue.Full:
            continue


def default_threads() -> int:
    try:
        return max(1, min(4, len(os.sched_getaffinity(0))))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, min(4, os.cpu_count() or 1))


class _Compressor:
    """write/close onto a sink; gzip through isal's threaded writer when present (deterministic: mtime 0,
    1 MiB blocks each primed with the previous block's last 32 KiB, whatever the thread count)."""

    def __init__(self, compression: str, sink: _QueueSink, threads: int) -> None:
        self.sink = sink
        self.writer: Any = None
        self.obj: Any = None
        if compression == "gzip" and HAS_ISAL_THREADED:
            self.writer = _igzip_threaded.open(sink, "wb", compresslevel=1, threads=threads, block_size=CHUNK)
        elif compression != "none":
            self.obj = B._compressobj(compression)  # pylint: disable=protected-access

    def write(self, block: bytes) -> None:
        if self.writer is not None:
            self.writer.write(block)
        elif self.obj is not None:
            self.sink.write(self.obj.compress(block))
        else:
            self.sink.write(block)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        elif self.obj is not None:
            self.sink.write(self.obj.flush())


class _PlainReader:
    """The layer's uncompressed bytes: a docker archive holds plain tars, an OCI layout may hold gzip/zstd.

    At most ``CHUNK`` bytes come out of one read, however well the input compresses: a 1 MiB block of
    gzip can inflate to 1 GiB in one call (issue 39, resource bombs)."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        first = raw.read(CHUNK)
        self.pending = [first] if first else []
        self.tail = b""
        self.decomp: Any = None
        self.stream: Any = None
        if first[:2] == b"\x1f\x8b":
            self.decomp = zlib.decompressobj(47)
        elif first[:4] == b"\x28\xb5\x2f\xfd":
            if not B.HAS_ZSTD:
                raise B.ArtifactError("a zstd-compressed layer needs the Python package zstandard")
            self.pending = []
            source: Any = A.Prefixed(first, raw)
            self.stream = B._zstd.ZstdDecompressor().stream_reader(  # pylint: disable=protected-access
                source, read_across_frames=True)

    def read(self) -> bytes:
        if self.stream is not None:
            return self.stream.read(CHUNK)
        while True:
            if self.tail:
                block, self.tail = self.tail, b""
            else:
                block = self.pending.pop() if self.pending else self.raw.read(CHUNK)
            if self.decomp is None or not block:
                return block
            data = self.decomp.decompress(block, CHUNK)
            self.tail = self.decomp.unconsumed_tail
            if data:
                return data


class LayerStream:
    """Iterate :meth:`chunks` once (the HTTP body); afterwards ``diff_id``, ``digest``, ``size`` are set,
    or ``error`` says why the source failed (a truncated archive): the body then simply ends early,
    and the caller cancels the upload instead of committing it."""

    def __init__(self, source: IO[bytes], compression: str, total: int = 0, threads: int = 0,
                 progress: Optional[Callable[[int, int], None]] = None) -> None:
        self.source = source
        self.compression = compression
        self.total = total
        self.threads = threads or default_threads()
        self.progress = progress
        self.diff_id = ""
        self.digest = ""
        self.size = 0
        self.plain_size = 0
        self.seconds = 0.0
        self.error: Optional[BaseException] = None
        self.cancelled = threading.Event()
        self._queue: "queue.Queue[Any]" = queue.Queue(QUEUE_DEPTH)
        self._thread: Optional[threading.Thread] = None

    def _produce(self) -> None:
        plain = hashlib.sha256()
        done = 0
        try:
            sink = _QueueSink(self._queue, self.cancelled)
            comp = _Compressor(self.compression, sink, self.threads)
            reader = _PlainReader(self.source)
            while not self.cancelled.is_set():
                block = reader.read()
                if not block:
                    break
                plain.update(block)
                comp.write(block)
                done += len(block)
                if self.progress:
                    self.progress(done, self.total)
            comp.close()
            self.diff_id = "sha256:" + plain.hexdigest()
            self.plain_size = done
        except BaseException as exc:  # handed to the sender: it must not raise inside the HTTP layer
            self.error = exc
        finally:
            _put(self._queue, _DONE, self.cancelled)

    def chunks(self) -> Iterator[bytes]:
        start = time.monotonic()
        out = hashlib.sha256()
        size = 0
        self._thread = threading.Thread(target=self._produce, name="layer-producer", daemon=True)
        self._thread.start()
        while True:
            item = self._queue.get()
            if item is _DONE:
                break
            out.update(item)
            size += len(item)
            yield item
        self._thread.join()
        self.digest = "sha256:" + out.hexdigest()
        self.size = size
        self.seconds = time.monotonic() - start

    def cancel(self) -> None:
        """The sender failed: stop the producer (it may wait on a full queue) and wait for it."""
        self.cancelled.set()
        thread = self._thread
        if thread is not None:
            while thread.is_alive():
                try:
                    self._queue.get(timeout=0.1)
                except queue.Empty:
                    pass
            thread.join()
