# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Plan and push artifacts: convert layers to the chosen compression, upload what is missing, then tag.

Order per artifact: the tag's current digest is compared first (an unchanged
re-push costs one HEAD); then every missing blob is uploaded (in parallel,
each restartable alone), every blob is confirmed present, child manifests
are written by digest, and only then the tag.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

from ansible_collections.metax.gpu.plugins.module_utils.registry import blobs as B
from ansible_collections.metax.gpu.plugins.module_utils.registry import reference as R
from ansible_collections.metax.gpu.plugins.module_utils.registry.client import Registry
from ansible_collections.metax.gpu.plugins.module_utils.registry.errors import RegistryError, StreamRefused
from ansible_collections.metax.gpu.plugins.module_utils.registry.sources import Artifact, Slice

ALL_MANIFEST_TYPES = (B.OCI_MANIFEST, B.DOCKER_MANIFEST, B.OCI_INDEX, B.DOCKER_LIST)


@dataclass
class Convert:
    """How to produce a blob that exists only after re-compression."""
    source: Slice
    source_compression: str
    target: str
    diff_id: Optional[str]
    origin: str


@dataclass
class Blob:
    digest: Optional[str]   # None: converted on the fly, digest known after the upload
    size: int               # for a conversion without a cached digest: the source size (an estimate)
    media_type: str
    source: Optional[Slice] = None
    convert: Optional[Convert] = None

    def descriptor(self) -> Dict[str, object]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size}


@dataclass
class Prepared:
    artifact: Artifact
    repository: str
    tag: str
    blobs: List[Blob] = field(default_factory=list)       # config first, then the layers in order
    verbatim: List[Tuple[bytes, str]] = field(default_factory=list)  # an index and its children, as read
    docker: bool = False

    @property
    def unknown(self) -> bool:
        return any(b.digest is None for b in self.blobs)

    def manifests(self) -> List[Tuple[bytes, str]]:
        """Children first; the last one is tagged."""
        if self.verbatim:
            return list(self.verbatim)
        config, layers = self.blobs[0], self.blobs[1:]
        manifest: Dict[str, object] = {
            "schemaVersion": 2,
            "mediaType": B.DOCKER_MANIFEST if self.docker else B.OCI_MANIFEST,
            "config": config.descriptor(),
            "layers": [],
        }
        for blob, layer in zip(layers, self.artifact.layers):
            desc = blob.descriptor()
            if layer.annotations:
                desc["annotations"] = layer.annotations
            manifest["layers"].append(desc)  # type: ignore[attr-defined]
        if self.artifact.manifest_annotations and not self.docker:
            manifest["annotations"] = self.artifact.manifest_annotations
        return [(json.dumps(manifest, indent=2).encode(), str(manifest["mediaType"]))]

    @property
    def digest(self) -> Optional[str]:
        return None if self.unknown else B.sha256_digest(self.manifests()[-1][0])

    @property
    def ref(self) -> str:
        return "%s:%s" % (self.repository, self.tag)


@dataclass
class Options:
    compression: str = "gzip"
    concurrency: int = 4
    cache_dir: str = ""
    check_mode: bool = False
    progress: Optional[Callable[[str, str, int, int], None]] = None  # (ref, digest or layer, done, total)
    keep_files: bool = False   # the bundle writer needs converted layers as files


def prepare(artifact: Artifact, repository: str, tag: str, opts: Options) -> Prepared:
    # the names decide where the push writes: checked before anything is converted or sent
    R.repository(repository, "%s %s from %s: repository" % (artifact.kind, artifact.name, artifact.origin))
    R.tag(tag, "%s %s from %s: tag" % (artifact.kind, artifact.name, artifact.origin))
    prepared = Prepared(artifact=artifact, repository=repository, tag=tag)
    if artifact.kind == "index":
        seen = set()
        for digest, media_type, blob in artifact.verbatim_blobs:
            if digest not in seen:
                seen.add(digest)
                prepared.blobs.append(Blob(digest, blob.size, media_type, blob))
        prepared.verbatim = list(artifact.verbatim)
        return prepared
    cache = B.LayerCache(opts.cache_dir or B.default_cache_dir())
    image = artifact.kind == "image"
    # zstd exists only in OCI media types; gzip/none keep Docker schema 2 for a docker-archive (docker 18.09)
    prepared.docker = image and artifact.docker and opts.compression != "zstd"
    config = artifact.config
    if config is None or not artifact.config_digest:
        raise AssertionError("an image or chart always has a config")
    config_type = (B.DOCKER_CONFIG if prepared.docker else B.OCI_CONFIG) if image else artifact.config_media_type
    prepared.blobs.append(Blob(artifact.config_digest, config.size, config_type, config))
    for layer in artifact.layers:
        if not image:  # a chart's content layer goes as it is
            chart_digest = layer.digest
            if chart_digest is None:
                with layer.source.open() as handle:
                    chart_digest, _size = B.hash_stream(handle)
            prepared.blobs.append(Blob(chart_digest, layer.source.size, layer.media_type, layer.source))
            continue
        source, target = layer.compression, opts.compression
        media_type = B.layer_media_type(target, prepared.docker)
        if source == target and layer.digest:
            prepared.blobs.append(Blob(layer.digest, layer.source.size, media_type, layer.source))
        elif source == target == "none" and layer.diff_id:
            prepared.blobs.append(Blob(layer.diff_id, layer.source.size, media_type, layer.source))
        elif opts.keep_files:
            entry = cache.convert(layer.source.open, source, target, layer.diff_id, origin=artifact.origin)
            prepared.blobs.append(Blob(entry["digest"], entry["size"], media_type,
                                       Slice(size=entry["size"], path=entry["path"])))
        else:
            known = cache.lookup(target, layer.diff_id) if layer.diff_id else None
            prepared.blobs.append(Blob(known["digest"] if known else None,
                                       known["size"] if known else layer.source.size, media_type,
                                       convert=Convert(layer.source, source, target, layer.diff_id, artifact.origin)))
    return prepared


@dataclass
class Result:
    ref: str
    digest: Optional[str]
    kind: str
    changed: bool
    bytes_uploaded: int = 0
    blobs_uploaded: int = 0
    blobs_mounted: int = 0
    blobs_skipped: int = 0
    would_upload_bytes: int = 0

    def as_dict(self) -> Dict[str, object]:
        return dict(self.__dict__)


class Pusher:
    """Pushes prepared artifacts to one registry; remembers where blobs already are for mounts."""

    def __init__(self, registry: Registry, opts: Options) -> None:
        self.registry = registry
        self.opts = opts
        self.located: Dict[str, str] = {}   # digest -> a repository of this registry holding it
        self.lock = threading.Lock()

    def push(self, prepared: Prepared) -> Result:
        reg = self.registry
        repo = prepared.repository
        result = Result(ref="%s/%s" % (reg.host, prepared.ref), digest=prepared.digest,
                        kind=prepared.artifact.kind, changed=False)
        if not prepared.unknown:
            current = reg.manifest_digest(repo, prepared.tag, ALL_MANIFEST_TYPES)
            if current == prepared.digest:
                result.blobs_skipped = len(prepared.blobs)
                for blob in prepared.blobs:
                    self.located.setdefault(str(blob.digest), repo)
                return result
        result.changed = True
        if self.opts.check_mode:
            for blob in prepared.blobs:
                if blob.digest is not None and reg.blob_exists(repo, blob.digest):
                    result.blobs_skipped += 1
                else:
                    result.would_upload_bytes += blob.size
            return result

        cache = B.LayerCache(self.opts.cache_dir or B.default_cache_dir())

        def one(blob: Blob) -> Tuple[str, int]:
            mount_from = self.located.get(blob.digest or "")
            if mount_from == repo:
                mount_from = None
            label = blob.digest or "layer"
            done = [0]

            def progress(amount: int) -> None:
                done[0] += amount
                if self.opts.progress:
                    self.opts.progress(prepared.ref, label, done[0], blob.size)
            conv = blob.convert
            if conv is not None:
                if blob.digest is not None:
                    if reg.blob_exists(repo, blob.digest):
                        how = "exists"
                    elif mount_from and reg.mount_blob(repo, blob.digest, mount_from):
                        how = "mounted"
                    else:
                        how = ""
                    if how:
                        with self.lock:
                            self.located[blob.digest] = repo
                        return how, blob.size
                try:
                    digest, size = reg.upload_stream(
                        repo, lambda: B.Converter(conv.source.open, conv.source_compression, conv.target,
                                                  conv.diff_id, conv.origin), progress)
                    if conv.diff_id:
                        cache.record(conv.target, conv.diff_id, digest, size)
                except StreamRefused:
                    # through a proxy that wants Content-Length: convert to a cached file, then a monolithic PUT
                    entry = cache.convert(conv.source.open, conv.source_compression, conv.target, conv.diff_id,
                                          origin=conv.origin)
                    digest, size = entry["digest"], entry["size"]
                    reg.upload_blob(repo, digest, size, path=entry["path"], progress=progress)
                blob.digest, blob.size = digest, size
                with self.lock:
                    self.located[digest] = repo
                return "uploaded", size
            if blob.source is None or blob.digest is None:
                raise AssertionError("only converted layers lack a digest or source")
            how = reg.upload_blob(repo, blob.digest, blob.size, path=blob.source.path, data=blob.source.data,
                                  offset=blob.source.offset, mount_from=mount_from, progress=progress)
            with self.lock:
                self.located[blob.digest] = repo
            return how, blob.size

        unique = list({b.digest or id(b): b for b in prepared.blobs}.values())
        workers = max(1, min(self.opts.concurrency, len(unique)))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            outcomes = list(pool.map(one, unique))
        for how, size in outcomes:
            if how == "exists":
                result.blobs_skipped += 1
            elif how == "mounted":
                result.blobs_mounted += 1
            else:
                result.blobs_uploaded += 1
                result.bytes_uploaded += size
        missing = [str(b.digest) for b in unique if not reg.blob_exists(repo, str(b.digest))]
        if missing:
            raise RegistryError("registry %s: blobs %s of %s are still missing after the upload; the tag was not written"
                                % (reg.host, ", ".join(missing), prepared.ref))
        manifests = prepared.manifests()
        for body, media_type in manifests[:-1]:
            reg.put_manifest(repo, B.sha256_digest(body), body, media_type)
        body, media_type = manifests[-1]
        result.digest = reg.put_manifest(repo, prepared.tag, body, media_type)
        return result
