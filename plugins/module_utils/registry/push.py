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
from ansible_collections.metax.gpu.plugins.module_utils.registry.client import Registry
from ansible_collections.metax.gpu.plugins.module_utils.registry.errors import RegistryError
from ansible_collections.metax.gpu.plugins.module_utils.registry.sources import Artifact, Slice

ALL_MANIFEST_TYPES = (B.OCI_MANIFEST, B.DOCKER_MANIFEST, B.OCI_INDEX, B.DOCKER_LIST)


@dataclass
class Blob:
    digest: str
    size: int
    media_type: str
    source: Slice


@dataclass
class Prepared:
    artifact: Artifact
    repository: str
    tag: str
    blobs: List[Blob] = field(default_factory=list)
    manifests: List[Tuple[bytes, str]] = field(default_factory=list)  # children first; the last is tagged
    unknown: bool = False   # check mode: a layer still needs converting, the digest is not known yet

    @property
    def digest(self) -> Optional[str]:
        return None if self.unknown else B.sha256_digest(self.manifests[-1][0])

    @property
    def ref(self) -> str:
        return "%s:%s" % (self.repository, self.tag)


@dataclass
class Options:
    compression: str = "gzip"
    concurrency: int = 4
    cache_dir: str = ""
    check_mode: bool = False
    progress: Optional[Callable[[str, str, int, int], None]] = None  # (ref, digest, done, total)


def prepare(artifact: Artifact, repository: str, tag: str, opts: Options) -> Prepared:
    prepared = Prepared(artifact=artifact, repository=repository, tag=tag)
    if artifact.kind == "index":
        seen = set()
        for digest, media_type, blob in artifact.verbatim_blobs:
            if digest not in seen:
                seen.add(digest)
                prepared.blobs.append(Blob(digest, blob.size, media_type, blob))
        prepared.manifests = list(artifact.verbatim)
        return prepared
    cache = B.LayerCache(opts.cache_dir or B.default_cache_dir())
    layer_descs = []
    for layer in artifact.layers:
        if artifact.kind == "chart":
            target = source = "gzip"
        else:
            source = layer.compression
            target = opts.compression
        media_type = (layer.media_type if artifact.kind == "chart"
                      else B.layer_media_type(target, artifact.docker and target != "zstd"))
        if source == target and layer.digest:
            blob = Blob(layer.digest, layer.source.size, media_type, layer.source)
        elif source == target == "none" and layer.diff_id:
            blob = Blob(layer.diff_id, layer.source.size, media_type, layer.source)
        elif source == target and artifact.kind == "chart":
            with layer.source.open() as handle:
                digest, size = B.hash_stream(handle)
            blob = Blob(digest, size, media_type, layer.source)
        else:
            entry = cache.lookup(target, layer.diff_id) if layer.diff_id else None
            if entry is None and opts.check_mode:
                prepared.unknown = True
                continue
            if entry is None:
                entry = cache.convert(layer.source.open, source, target, layer.diff_id,
                                      threads=max(1, opts.concurrency))
            blob = Blob(str(entry["digest"]), int(entry["size"]), media_type,  # type: ignore[call-overload]
                        Slice(size=int(entry["size"]), path=str(entry["path"])))  # type: ignore[call-overload]
        prepared.blobs.append(blob)
        desc = {"mediaType": media_type, "digest": blob.digest, "size": blob.size}
        if layer.annotations:
            desc["annotations"] = layer.annotations
        layer_descs.append(desc)
    config = artifact.config
    assert config is not None and artifact.config_digest
    docker = artifact.docker and opts.compression != "zstd" and artifact.kind == "image"
    config_type = artifact.config_media_type
    if artifact.kind == "image":
        config_type = B.DOCKER_CONFIG if docker else B.OCI_CONFIG
    prepared.blobs.insert(0, Blob(artifact.config_digest, config.size, config_type, config))
    manifest: Dict[str, object] = {
        "schemaVersion": 2,
        "mediaType": B.DOCKER_MANIFEST if docker else B.OCI_MANIFEST,
        "config": {"mediaType": config_type, "digest": artifact.config_digest, "size": config.size},
        "layers": layer_descs,
    }
    if artifact.manifest_annotations and not docker:
        manifest["annotations"] = artifact.manifest_annotations
    body = json.dumps(manifest, indent=2, sort_keys=False).encode()
    prepared.manifests = [(body, str(manifest["mediaType"]))]
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
                    self.located.setdefault(blob.digest, repo)
                return result
        result.changed = True
        if self.opts.check_mode:
            for blob in prepared.blobs:
                if reg.blob_exists(repo, blob.digest):
                    result.blobs_skipped += 1
                else:
                    result.would_upload_bytes += blob.size
            return result

        def one(blob: Blob) -> Tuple[str, int]:
            mount_from = self.located.get(blob.digest)
            if mount_from == repo:
                mount_from = None
            done = [0]

            def progress(amount: int) -> None:
                done[0] += amount
                if self.opts.progress:
                    self.opts.progress(prepared.ref, blob.digest, done[0], blob.size)
            how = reg.upload_blob(repo, blob.digest, blob.size, path=blob.source.path, data=blob.source.data,
                                  offset=blob.source.offset, mount_from=mount_from, progress=progress)
            with self.lock:
                self.located[blob.digest] = repo
            return how, blob.size

        unique = list({b.digest: b for b in prepared.blobs}.values())
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
        missing = [b.digest for b in unique if not reg.blob_exists(repo, b.digest)]
        if missing:
            raise RegistryError("registry %s: blobs %s of %s are still missing after the upload; the tag was not written"
                                % (reg.host, ", ".join(missing), prepared.ref))
        for body, media_type in prepared.manifests[:-1]:
            reg.put_manifest(repo, B.sha256_digest(body), body, media_type)
        body, media_type = prepared.manifests[-1]
        result.digest = reg.put_manifest(repo, prepared.tag, body, media_type)
        return result
