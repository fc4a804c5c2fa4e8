# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Push an xz-compressed docker archive in one pass: xz -> diff_id -> compress -> digest -> registry.

Order of work (see docs/registry.md, "The vendor's .xz MACA images"):

1. The archive's key (size, mtime, first and last MiB) finds an earlier push
   in the cache: the manifests are known without decompressing anything, and
   an unchanged image costs one ``HEAD`` per tag.
2. Otherwise the archive is read once, in order.  Each layer tar is streamed
   into an upload session as it comes by; the repository is the one the cache
   or the file name suggests, because ``manifest.json`` (the real name) comes
   at the end of a ``docker save`` tar.  Small members (configs, manifests)
   are kept in memory.
3. At the end, every layer's diff_id is checked against the image config,
   layers are mounted into the image's own repository when the guess was
   wrong, the config is uploaded and the tag written last.  A truncated or
   corrupt archive fails before any tag is written.

A connection cut mid-layer cannot rewind the xz stream: the pass restarts
from the start of the archive, layers already uploaded are only read past,
and the cut layer goes again in a new session (docker-registry 2.8 cancels a
session whose PATCH died, so there is nothing to resume there).
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from ansible_collections.metax.gpu.plugins.module_utils import archive as A
from ansible_collections.metax.gpu.plugins.module_utils.backoff import Backoff
from ansible_collections.metax.gpu.plugins.module_utils.registry import blobs as B
from ansible_collections.metax.gpu.plugins.module_utils.registry import layerstream as LS
from ansible_collections.metax.gpu.plugins.module_utils.registry import reference as R
from ansible_collections.metax.gpu.plugins.module_utils.registry import xzsource as X
from ansible_collections.metax.gpu.plugins.module_utils.registry.client import Registry
from ansible_collections.metax.gpu.plugins.module_utils.registry.errors import (
    ArtifactError, RegistryError, TransientError)
from ansible_collections.metax.gpu.plugins.module_utils.registry.sources import _split_ref

ALL_MANIFEST_TYPES = (B.OCI_MANIFEST, B.DOCKER_MANIFEST, B.OCI_INDEX, B.DOCKER_LIST)
PROGRESS_EVERY = 10.0   # seconds between progress samples kept for the module's output


@dataclass
class XzOptions:
    project: str                 # PROJECT path below the registry ("" = none)
    compression: str = "gzip"
    repository: str = ""         # override of the image's own name
    tag: str = ""                # override of the image's own tag
    cache_dir: str = ""
    check_mode: bool = False
    retries: int = 5
    threads: int = 0             # compression threads (0 = up to 4, the CPUs this process may use)
    xz_tool: str = "auto"        # auto | xz | python
    progress: Optional[Callable[[str, str, int, int], None]] = None


@dataclass
class _Pass:
    """What one read of the archive found."""
    small: Dict[str, bytes] = field(default_factory=dict)
    links: Dict[str, str] = field(default_factory=dict)
    layers: Dict[str, X.LayerRef] = field(default_factory=dict)
    bytes_uploaded: int = 0
    blobs_uploaded: int = 0
    records: List[Dict[str, Any]] = field(default_factory=list)   # one per streamed layer
    samples: List[str] = field(default_factory=list)


def repo_of(project: str, name: str) -> str:
    return "%s/%s" % (project, name) if project else name


def manifest_of(image: X.ImageRef, compression: str) -> Tuple[bytes, str]:
    """The manifest for ``image``: Docker schema 2 for gzip/none (a docker archive, docker 18.09 pulls it),
    OCI for zstd (the only media type that has it); the same bytes every time for the same image."""
    docker = compression != "zstd"
    media_type = B.DOCKER_MANIFEST if docker else B.OCI_MANIFEST
    manifest = {
        "schemaVersion": 2,
        "mediaType": media_type,
        "config": {"mediaType": B.DOCKER_CONFIG if docker else B.OCI_CONFIG,
                   "digest": B.sha256_digest(image.config), "size": len(image.config)},
        "layers": [{"mediaType": B.layer_media_type(compression, docker), "digest": l.digest, "size": l.size}
                   for l in image.layers],
    }
    return json.dumps(manifest, indent=2).encode(), media_type


class XzPusher:
    def __init__(self, registry: Registry, path: str, opts: XzOptions) -> None:
        self.registry = registry
        self.path = path
        self.opts = opts
        self.cache = X.ArchiveCache(opts.cache_dir or B.default_cache_dir())

    # -- entry point ------------------------------------------------------------------------------

    def push(self) -> List[Dict[str, Any]]:
        key = X.archive_key(self.path)
        known = self.cache.lookup(self.opts.compression, key)
        if known is not None:
            images = known["images"]
            results = self._finish(images, known.get("staging") or "", _Pass(), cached=True)
            if results is not None:
                return results
        if self.opts.check_mode:
            return [self._would_push(known)]
        staging = self._staging(known)
        found = self._read_with_restarts(staging, known)
        images = self._images(found)
        results = self._finish(images, staging, found, cached=False)
        if results is None:
            raise RegistryError("registry %s: layers of %s vanished while it was pushed; the tag was not written"
                                % (self.registry.host, self.path))
        self.cache.record(self.opts.compression, key, images, staging)
        return results

    def _named(self, image: X.ImageRef) -> X.ImageRef:
        R.repository(repo_of(self.opts.project, self.opts.repository or image.name), "%s: repository" % self.path)
        R.tag(self.opts.tag or image.tag, "%s: tag" % self.path)
        return X.ImageRef(name=self.opts.repository or image.name, tag=self.opts.tag or image.tag,
                          config=image.config, layers=image.layers)

    def _staging(self, known: Optional[Dict[str, Any]]) -> str:
        """Where layers go before manifest.json says the image's name."""
        if self.opts.repository:
            return repo_of(self.opts.project, self.opts.repository)
        if known and known["images"]:
            return repo_of(self.opts.project, self._named(known["images"][0]).name)
        return repo_of(self.opts.project, X.guess_name(self.path))

    def _would_push(self, known: Optional[Dict[str, Any]]) -> Dict[str, Any]:
        name = self.opts.repository or X.guess_name(self.path)
        return {"ref": "%s/%s" % (self.registry.host, repo_of(self.opts.project, name)),
                "digest": None, "kind": "image", "changed": True, "bytes_uploaded": 0, "blobs_uploaded": 0,
                "blobs_mounted": 0, "blobs_skipped": 0, "source": self.path,
                # the archive's own size: the uncompressed layers are not known without reading it
                "would_upload_bytes": os.path.getsize(self.path) if known is None else 0}

    # -- reading ----------------------------------------------------------------------------------

    def _read_with_restarts(self, staging: str, known: Optional[Dict[str, Any]]) -> _Pass:
        found = _Pass()
        cached_by_member: Dict[str, X.LayerRef] = {}
        if known:
            for image in known["images"]:
                for layer in image.layers:
                    cached_by_member[layer.member] = layer
        backoff = Backoff(initial=0.2, cap=5.0)
        last: Optional[Exception] = None
        for _attempt in range(self.opts.retries + 1):
            try:
                self._read_once(staging, found, cached_by_member)
                return found
            except TransientError as exc:
                last = exc
                time.sleep(backoff.next_delay())
        raise RegistryError("registry %s: pushing %s failed %d times; last error: %s"
                            % (self.registry.host, self.path, self.opts.retries + 1, last))

    def _read_once(self, staging: str, found: _Pass, cached: Dict[str, X.LayerRef]) -> None:
        small_total = 0
        with X.XzReader(self.path, self.opts.xz_tool) as reader:
            try:
                tar = X.open_tar(reader)
                for member in A.members(tar, A.Budget(A.DEFAULT_LIMITS, self.path), container=True):
                    name = X.norm(member.name)
                    if member.issym() or member.islnk():
                        target = member.linkname if member.islnk() else \
                            X.norm(name.rsplit("/", 1)[0] + "/" + member.linkname if "/" in name else member.linkname)
                        found.links[name] = X.norm(target)
                        continue
                    if not member.isfile():
                        continue
                    if name in found.layers:  # uploaded before a restart: read past it
                        continue
                    stream_it = X.is_layer_name(name, member.size) or small_total + member.size > X.SMALL_TOTAL
                    if not stream_it:
                        found.small[name] = X.member_stream(tar, member).read()
                        small_total += member.size
                        continue
                    prior = cached.get(name)
                    if prior is not None and self.registry.blob_exists(staging, prior.digest):
                        found.layers[name] = prior
                        continue
                    found.layers[name] = self._stream_layer(staging, tar, member, found)
                reader.drain()
            except A.ArchiveError as exc:
                raise ArtifactError(str(exc)) from exc
            except (tarfile.TarError, EOFError) as exc:
                raise X.corrupt(self.path, exc) from exc

    def _stream_layer(self, repo: str, tar: tarfile.TarFile, member: tarfile.TarInfo, found: _Pass) -> X.LayerRef:
        name = X.norm(member.name)
        label = "%s (%d MiB)" % (name, member.size >> 20)
        started = time.monotonic()
        last = [started]

        def progress(done: int, total: int) -> None:
            now = time.monotonic()
            if self.opts.progress:
                self.opts.progress(repo, name, done, total)
            if now - last[0] >= PROGRESS_EVERY or done >= total:
                last[0] = now
                found.samples.append(progress_line(label, done, total, now - started))

        stream = LS.LayerStream(X.member_stream(tar, member), self.opts.compression, total=member.size,
                                threads=self.opts.threads, progress=progress)
        location = self.registry.start_upload(repo)
        try:
            self.registry.stream_upload_once(location, repo, stream.chunks(), lambda: _checked(stream))
        except (ArtifactError, RegistryError):
            stream.cancel()
            self.registry.cancel_upload(location, repo)
            if stream.error is not None and not isinstance(stream.error, RegistryError):
                raise _as_artifact_error(self.path, stream.error) from stream.error
            raise
        except BaseException:
            stream.cancel()
            self.registry.cancel_upload(location, repo)
            raise
        found.bytes_uploaded += stream.size
        found.blobs_uploaded += 1
        seconds = max(stream.seconds, 1e-9)
        found.records.append({"member": name, "diff_id": stream.diff_id, "digest": stream.digest,
                              "uncompressed": stream.plain_size, "size": stream.size,
                              "seconds": round(seconds, 3),
                              "mib_per_s": round(stream.plain_size / seconds / (1 << 20), 1)})
        return X.LayerRef(member=name, diff_id=stream.diff_id, digest=stream.digest, size=stream.size,
                          plain_size=stream.plain_size)

    # -- the images of the archive ----------------------------------------------------------------

    def _resolve(self, found: _Pass, name: str) -> str:
        name = X.norm(name)
        for _hop in range(8):
            if name not in found.links:
                return name
            name = found.links[name]
        return name

    def _images(self, found: _Pass) -> List[X.ImageRef]:
        raw = found.small.get("manifest.json")
        if raw is None:
            raise ArtifactError("%s: no manifest.json in the archive: not a docker archive (docker save)" % self.path)
        try:
            entries = json.loads(raw)
        except ValueError as exc:
            raise ArtifactError("%s: manifest.json is not valid JSON (%s)" % (self.path, exc)) from exc
        if not isinstance(entries, list) or not entries:
            raise ArtifactError("%s: manifest.json lists no image" % self.path)
        images = []
        for entry in entries:
            config = found.small.get(self._resolve(found, entry.get("Config", "")))
            if config is None:
                raise ArtifactError("%s: the image config %s is missing" % (self.path, entry.get("Config")))
            try:
                diff_ids = json.loads(config)["rootfs"]["diff_ids"]
            except (ValueError, KeyError, TypeError) as exc:
                raise ArtifactError("%s: the image config has no rootfs.diff_ids" % self.path) from exc
            paths = entry.get("Layers") or []
            if len(paths) != len(diff_ids):
                raise ArtifactError("%s: %d layers but %d diff_ids in the config" % (self.path, len(paths), len(diff_ids)))
            layers = []
            for path, diff_id in zip(paths, diff_ids):
                layer = self._layer(found, self._resolve(found, path))
                if layer.diff_id != diff_id:
                    raise ArtifactError("%s: layer %s is %s but the image config says %s (corrupt archive?)"
                                        % (self.path, path, layer.diff_id, diff_id))
                layers.append(layer)
            tags = entry.get("RepoTags") or []
            name, tag = _split_ref(tags[0]) if tags else (X.guess_name(self.path), "latest")
            if tags:    # RepoTags is the archive's word: checked before it names anything
                R.image_reference(tags[0], "%s: RepoTags" % self.path)
            images.append(X.ImageRef(name=name, tag=tag, config=config, layers=layers))
        if (self.opts.repository or self.opts.tag) and len(images) != 1:
            raise ArtifactError("%s holds %d images: repository/tag overrides need exactly one" % (self.path, len(images)))
        return images

    def _layer(self, found: _Pass, member: str) -> X.LayerRef:
        if member in found.layers:
            return found.layers[member]
        data = found.small.get(member)
        if data is None:
            raise ArtifactError("%s: layer %s is missing (truncated archive?)" % (self.path, member))
        # a small layer that was buffered: compressed now, uploaded with the config in _finish
        stream = LS.LayerStream(io.BytesIO(data), self.opts.compression, total=len(data), threads=1)
        body = b"".join(stream.chunks())
        if stream.error is not None:
            raise _as_artifact_error(self.path, stream.error)
        layer = X.LayerRef(member=member, diff_id=stream.diff_id, digest=stream.digest, size=len(body),
                           plain_size=len(data))
        found.small["blob:" + stream.digest] = body
        found.layers[member] = layer
        return layer

    # -- writing ----------------------------------------------------------------------------------

    def _finish(self, images: List[X.ImageRef], staging: str, found: _Pass, cached: bool) -> Optional[List[Dict[str, Any]]]:
        """Tag every image; None when (from the cache) a layer is not in the registry any more."""
        reg = self.registry
        results = []
        for image in (self._named(i) for i in images):
            repo = repo_of(self.opts.project, image.name)
            body, media_type = manifest_of(image, self.opts.compression)
            digest = B.sha256_digest(body)
            result: Dict[str, Any] = {"ref": "%s/%s:%s" % (reg.host, repo, image.tag), "digest": digest,
                                      "kind": "image", "changed": False, "bytes_uploaded": 0,
                                      "blobs_uploaded": 0, "blobs_mounted": 0, "blobs_skipped": 0,
                                      "would_upload_bytes": 0, "source": self.path,
                                      "layers": [], "progress": []}
            if reg.manifest_digest(repo, image.tag, ALL_MANIFEST_TYPES) == digest:
                result["blobs_skipped"] = len(image.layers) + 1
                results.append(result)
                continue
            result["changed"] = True
            for layer in image.layers:
                how = self._place(repo, staging, layer.digest, found)
                if how is None:
                    if cached:
                        return None
                    raise RegistryError("registry %s: layer %s of %s is missing after its upload; the tag was "
                                        "not written" % (reg.host, layer.digest, result["ref"]))
                result["blobs_" + how] += 1
            if self.opts.check_mode:
                result["would_upload_bytes"] = len(image.config)
                results.append(result)
                continue
            config_digest = B.sha256_digest(image.config)
            how = reg.upload_blob(repo, config_digest, len(image.config), data=image.config)
            result["blobs_uploaded" if how == "uploaded" else "blobs_skipped"] += 1
            result["digest"] = reg.put_manifest(repo, image.tag, body, media_type)
            results.append(result)
        # the streamed layers belong to the first image that was written (bytes are counted once)
        for result in results:
            if result["changed"]:
                result["bytes_uploaded"] += found.bytes_uploaded
                result["blobs_uploaded"] += found.blobs_uploaded
                result["layers"] = found.records
                result["progress"] = found.samples
                break
        return results

    def _place(self, repo: str, staging: str, digest: str, found: _Pass) -> Optional[str]:
        """Make a layer present in ``repo``: 'skipped' (there), 'mounted' (from the staging repository)
        or 'uploaded' (a buffered small layer); None when it is nowhere."""
        reg = self.registry
        if reg.blob_exists(repo, digest):
            return "skipped"
        if self.opts.check_mode:  # HEAD requests only
            return "mounted" if staging and reg.blob_exists(staging, digest) else None
        if staging and staging != repo and reg.mount_blob(repo, digest, staging):
            return "mounted"
        body = found.small.get("blob:" + digest)
        if body is not None and not self.opts.check_mode:
            reg.upload_blob(repo, digest, len(body), data=body)
            found.bytes_uploaded += len(body)
            return "uploaded"
        return None


def _checked(stream: LS.LayerStream) -> str:
    """The digest to commit; a source that failed mid-layer (truncated archive) must not be committed."""
    if stream.error is not None:
        raise _as_artifact_error("archive", stream.error)
    return stream.digest


def _as_artifact_error(path: str, exc: BaseException) -> ArtifactError:
    if isinstance(exc, ArtifactError):
        return exc
    if isinstance(exc, (tarfile.TarError, EOFError, OSError)):
        return X.corrupt(path, exc)
    return ArtifactError("%s: %s" % (path, exc))


def progress_line(label: str, done: int, total: int, seconds: float) -> str:
    """``layer: 1.2 of 9.5 GiB (13%), 180 MiB/s, ETA 47 s`` (uncompressed bytes: what the archive holds)."""
    rate = done / seconds if seconds > 0 else 0.0
    eta = (total - done) / rate if rate > 0 and total > done else 0.0
    pct = 100.0 * done / total if total else 100.0
    return "%s: %.2f of %.2f GiB (%.0f%%), %.0f MiB/s, ETA %.0f s" % (
        label, done / (1 << 30), total / (1 << 30), pct, rate / (1 << 20), eta)
