# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Read what can be pushed: docker-archive tars, OCI layouts (directory or tar), Helm chart .tgz, offline bundles.

Every reader returns :class:`Artifact` objects whose blobs are file slices
(path, offset, size): a 1 GiB layer inside a tar is never copied to push it
uncompressed, and never held in memory.
"""

from __future__ import annotations

import json
import os
import tarfile
from dataclasses import dataclass, field
from typing import IO, Any, Dict, List, Optional, Tuple

from ansible_collections.metax.gpu.plugins.module_utils import archive as A
from ansible_collections.metax.gpu.plugins.module_utils.registry import blobs as B
from ansible_collections.metax.gpu.plugins.module_utils.registry import reference as R
from ansible_collections.metax.gpu.plugins.module_utils.registry.errors import ArtifactError

try:
    import yaml  # type: ignore[import-untyped,unused-ignore]
    HAS_YAML = True
except ImportError:  # pragma: no cover
    yaml = None
    HAS_YAML = False

if HAS_YAML:
    class NoAliasLoader(yaml.SafeLoader):
        """SafeLoader that refuses aliases: Chart.yaml needs none, and 520 bytes of nested aliases
        became 32 MiB of chart config (issue 39, the "billion laughs")."""

        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise yaml.composer.ComposerError(None, None, "found the alias *%s: Chart.yaml may not use aliases"
                                                  % event.anchor, event.start_mark)
            return super().compose_node(parent, index)

HELM_CONFIG = "application/vnd.cncf.helm.config.v1+json"
HELM_LAYER = "application/vnd.cncf.helm.chart.content.v1.tar+gzip"
REF_NAME = "org.opencontainers.image.ref.name"
CONTAINERD_NAME = "io.containerd.image.name"
BUNDLE_MAGIC = "# metax-bundle-json: "


@dataclass
class Slice:
    """Bytes ``[offset, offset+size)`` of ``path``, or literal ``data``."""
    size: int
    path: Optional[str] = None
    offset: int = 0
    data: Optional[bytes] = None

    def open(self) -> IO[bytes]:
        if self.data is not None:
            import io
            return io.BytesIO(self.data)
        handle = open(self.path, "rb")  # type: ignore[arg-type]
        handle.seek(self.offset)
        return _Limited(handle, self.size)  # type: ignore[return-value]

    def read_all(self, limit: int = 64 << 20) -> bytes:
        if self.data is not None:
            return self.data
        if self.size > limit:
            raise ArtifactError("%s: a %d-byte metadata blob is implausibly large" % (self.path, self.size))
        with self.open() as handle:
            return handle.read()


class _Limited:
    def __init__(self, handle, size: int) -> None:
        self.handle = handle
        self.left = size

    def read(self, amount: int = -1) -> bytes:
        if self.left <= 0:
            return b""
        if amount is None or amount < 0 or amount > self.left:
            amount = self.left
        data = self.handle.read(amount)
        self.left -= len(data)
        return data

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self.handle.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass
class Layer:
    media_type: str
    source: Slice
    digest: Optional[str] = None      # digest of the source bytes, when the source says it
    diff_id: Optional[str] = None     # uncompressed digest, from the image config
    annotations: Dict[str, str] = field(default_factory=dict)

    @property
    def compression(self) -> str:
        head = b""
        if self.media_type in ("", "application/octet-stream"):
            with self.source.open() as handle:
                head = handle.read(4)
        return B.compression_of(self.media_type, head)


@dataclass
class Artifact:
    """One thing to tag in a repository: an image, a chart, or an index with its children."""
    kind: str                       # image | chart | index
    name: str                       # repository below the project
    tag: str
    origin: str                     # file it came from (for messages)
    config: Optional[Slice] = None
    config_media_type: str = ""
    config_digest: Optional[str] = None
    layers: List[Layer] = field(default_factory=list)
    docker: bool = False            # came from a docker-archive (Docker schema 2 media types for gzip/none)
    manifest_annotations: Dict[str, str] = field(default_factory=dict)
    # verbatim manifests (an index and its children): pushed as they are
    verbatim: List[Tuple[bytes, str]] = field(default_factory=list)
    verbatim_blobs: List[Tuple[str, str, Slice]] = field(default_factory=list)  # (digest, media type, slice)


# ---------------------------------------------------------------------------------------------
# blob stores: a directory or a tar (possibly starting at an offset inside a .run bundle)

class _DirStore:
    def __init__(self, root: str) -> None:
        self.root = root

    def get(self, name: str) -> Optional[Slice]:
        path = os.path.join(self.root, name)
        if not os.path.isfile(path):
            return None
        return Slice(size=os.path.getsize(path), path=path)


# an archive's index entry: (kind, file offset of the data or the link's target, size); a TarInfo is ~1 KiB
_FILE, _HARD, _SYM = 0, 1, 2
# an image archive or bundle holds a few members per image (layers, configs, manifests): 100,000 is plenty,
# and keeps the index under some 20 MiB (issue 39: 200k headers kept were +110 to +190 MiB)
ARCHIVE_LIMITS = A.Limits(max_members=100000)


class _TarStore:
    def __init__(self, path: str, offset: int = 0, prefix: str = "", limits: A.Limits = ARCHIVE_LIMITS) -> None:
        self.path = path
        self.prefix = prefix
        self.members: Dict[str, Tuple[int, Any, int]] = {}
        try:
            with open(path, "rb") as handle:
                handle.seek(offset)
                with A.open_seekable(handle, limits) as tar:
                    for member in A.members(tar, A.Budget(limits, path)):
                        if member.isfile():
                            self.members[_norm(member.name)] = (_FILE, member.offset_data, member.size)
                        elif member.islnk():
                            self.members[_norm(member.name)] = (_HARD, _norm(member.linkname), 0)
                        elif member.issym():
                            self.members[_norm(member.name)] = (_SYM, member.linkname, 0)
        except A.ArchiveError as exc:
            raise ArtifactError(str(exc)) from exc
        except (OSError, tarfile.TarError, EOFError) as exc:
            raise ArtifactError("%s: not a readable tar archive (%s)" % (path, exc)) from exc

    def sub(self, prefix: str) -> "_TarStore":
        """The same tar seen from a directory inside it (an image layout in a bundle)."""
        view = _TarStore.__new__(_TarStore)
        view.path, view.prefix, view.members = self.path, prefix, self.members
        return view

    def get(self, name: str) -> Optional[Slice]:
        key = _norm(self.prefix + name)
        for _hop in range(8):  # links are resolved in the whole archive (a bundle links blobs across images)
            member = self.members.get(key)
            if member is None:
                return None
            kind, where, size = member
            if kind == _HARD:
                key = where
            elif kind == _SYM:
                key = _norm(os.path.join(os.path.dirname(key), where))
            else:
                return Slice(size=size, path=self.path, offset=where)
        return None


def _norm(name: str) -> str:
    return os.path.normpath(name).lstrip("/")


def _json(store, name: str, origin: str) -> Any:
    blob = store.get(name)
    if blob is None:
        raise ArtifactError("%s: %s is missing" % (origin, name))
    try:
        return json.loads(blob.read_all())
    except ValueError as exc:
        raise ArtifactError("%s: %s is not valid JSON (%s)" % (origin, name, exc)) from exc


def _blob_path(digest: str) -> str:
    # a descriptor's digest becomes a path: only the digest grammar's characters (no '/', no '..')
    algo, _sep, hexdigest = R.digest(digest, "blob digest").partition(":")
    return "blobs/%s/%s" % (algo, hexdigest)


def _split_ref(ref: str) -> Tuple[str, str]:
    """'registry/project/name:tag' -> ('name', 'tag'); 'tag' alone -> ('', 'tag')."""
    if "/" not in ref and ":" not in ref:
        return "", ref
    last = ref.rsplit("/", 1)[-1]
    name, _sep, tag = last.partition(":")
    return name, tag or "latest"


# ---------------------------------------------------------------------------------------------
# readers

def read_docker_archive(path: str, store: _TarStore) -> List[Artifact]:
    manifest = _json(store, "manifest.json", path)
    if not isinstance(manifest, list) or not manifest:
        raise ArtifactError("%s: manifest.json lists no image" % path)
    result = []
    for entry in manifest:
        config = store.get(entry.get("Config", ""))
        if config is None:
            raise ArtifactError("%s: the image config %s is missing" % (path, entry.get("Config")))
        raw = config.read_all()
        try:
            diff_ids = json.loads(raw)["rootfs"]["diff_ids"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ArtifactError("%s: the image config has no rootfs.diff_ids" % path) from exc
        layer_paths = entry.get("Layers") or []
        if len(layer_paths) != len(diff_ids):
            raise ArtifactError("%s: %d layers but %d diff_ids in the config" % (path, len(layer_paths), len(diff_ids)))
        layers = []
        for layer_path, diff_id in zip(layer_paths, diff_ids):
            blob = store.get(layer_path)
            if blob is None:
                raise ArtifactError("%s: layer %s is missing (truncated archive?)" % (path, layer_path))
            layers.append(Layer(media_type="", source=blob, diff_id=diff_id))
        tags = entry.get("RepoTags") or []
        name, tag = _split_ref(tags[0]) if tags else ("", "latest")
        if tags:
            R.image_reference(tags[0], "%s: RepoTags" % path)
        result.append(Artifact(kind="image", name=name or _stem(path), tag=tag, origin=path,
                               config=_bytes_slice(raw), config_media_type=B.DOCKER_CONFIG,
                               config_digest=B.sha256_digest(raw), layers=layers, docker=True))
    return result


def _bytes_slice(data: bytes) -> Slice:
    return Slice(size=len(data), data=data)


def read_oci_layout(path: str, store, default_name: str) -> List[Artifact]:
    index = _json(store, "index.json", path)
    result = []
    for desc in index.get("manifests") or []:
        annotations = desc.get("annotations") or {}
        ref = annotations.get(CONTAINERD_NAME) or annotations.get(REF_NAME) or ""
        name, tag = _split_ref(ref) if ref else ("", "latest")
        if ref and "/" not in ref and ":" not in ref:
            tag = ref
        if ref and ("/" in ref or ":" in ref):
            R.image_reference(ref, "%s: annotation" % path)
        else:
            R.tag(tag, "%s: annotation" % path)
        artifact = _read_oci_manifest(path, store, desc, name or default_name, tag)
        result.append(artifact)
    if not result:
        raise ArtifactError("%s: index.json lists no manifest" % path)
    return result


def _verified(store, digest: str, origin: str) -> Slice:
    blob = store.get(_blob_path(digest))
    if blob is None:
        raise ArtifactError("%s: blob %s is missing" % (origin, digest))
    return blob


def _read_oci_manifest(path: str, store, desc: Dict[str, Any], name: str, tag: str) -> Artifact:
    media_type = desc.get("mediaType", B.OCI_MANIFEST)
    raw = _verified(store, desc["digest"], path).read_all()
    if B.sha256_digest(raw) != desc["digest"]:
        raise ArtifactError("%s: manifest %s does not match its digest" % (path, desc["digest"]))
    manifest = json.loads(raw)
    if media_type in B.INDEX_TYPES or manifest.get("manifests") is not None:
        art = Artifact(kind="index", name=name, tag=tag, origin=path)
        _collect_verbatim(path, store, raw, media_type, art)
        return art
    layers = [Layer(media_type=l.get("mediaType", ""), source=_verified(store, l["digest"], path),
                    digest=l["digest"], annotations=l.get("annotations") or {})
              for l in manifest.get("layers") or []]
    cfg = manifest["config"]
    config = _verified(store, cfg["digest"], path)
    config_raw = config.read_all()
    if B.sha256_digest(config_raw) != cfg["digest"]:
        raise ArtifactError("%s: config %s does not match its digest" % (path, cfg["digest"]))
    if cfg.get("mediaType") == HELM_CONFIG:
        kind = "chart"
    else:
        kind = "image"
        try:
            diff_ids = json.loads(config_raw)["rootfs"]["diff_ids"]
            for layer, diff_id in zip(layers, diff_ids):
                layer.diff_id = diff_id
        except (ValueError, KeyError, TypeError):
            pass
    return Artifact(kind=kind, name=name, tag=tag, origin=path, config=_bytes_slice(config_raw),
                    config_media_type=cfg.get("mediaType", B.OCI_CONFIG), config_digest=cfg["digest"],
                    layers=layers, docker=manifest.get("mediaType") == B.DOCKER_MANIFEST or media_type == B.DOCKER_MANIFEST,
                    manifest_annotations=manifest.get("annotations") or {})


def _collect_verbatim(path: str, store, raw: bytes, media_type: str, art: Artifact) -> None:
    manifest = json.loads(raw)
    for child in manifest.get("manifests") or []:
        child_raw = _verified(store, child["digest"], path).read_all()
        if B.sha256_digest(child_raw) != child["digest"]:
            raise ArtifactError("%s: manifest %s does not match its digest" % (path, child["digest"]))
        child_type = child.get("mediaType", B.OCI_MANIFEST)
        if child_type in B.INDEX_TYPES:
            _collect_verbatim(path, store, child_raw, child_type, art)
            continue
        body = json.loads(child_raw)
        for desc in [body["config"]] + list(body.get("layers") or []):
            art.verbatim_blobs.append((desc["digest"], desc.get("mediaType", ""), _verified(store, desc["digest"], path)))
        art.verbatim.append((child_raw, child_type))
    art.verbatim.append((raw, media_type))


def read_chart(path: str) -> Artifact:
    """A packaged Helm chart (``<chart>/Chart.yaml`` inside a .tgz): read forward until Chart.yaml, within
    Helm's own bounds (:data:`archive.CHART_LIMITS`), no header kept, no YAML alias expanded."""
    chart_yaml = None
    budget = A.Budget(A.CHART_LIMITS, path)
    try:
        with open(path, "rb") as raw, A.open_stream(raw, A.CHART_LIMITS) as tar:
            for member in A.members(tar, budget, container=True):
                parts = member.name.split("/")
                if len(parts) == 2 and parts[1] == "Chart.yaml" and member.isfile():
                    budget.file(member)
                    chart_yaml = tar.extractfile(member).read()  # type: ignore[union-attr]
                    break
    except A.ArchiveError as exc:
        raise ArtifactError(str(exc)) from exc
    except (OSError, tarfile.TarError, EOFError) as exc:
        raise ArtifactError("%s: not a readable Helm chart archive (%s)" % (path, exc)) from exc
    if chart_yaml is None:
        raise ArtifactError("%s: no <chart>/Chart.yaml inside: not a packaged Helm chart" % path)
    if not HAS_YAML:
        raise ArtifactError("pushing a Helm chart needs the Python package PyYAML")
    try:
        meta = yaml.load(chart_yaml, Loader=NoAliasLoader) or {}
    except yaml.YAMLError as exc:
        raise ArtifactError("%s: Chart.yaml is not valid YAML (%s)" % (path, exc)) from exc
    if not isinstance(meta, dict):
        raise ArtifactError("%s: Chart.yaml is not a mapping" % path)
    if not meta.get("name") or not meta.get("version"):
        raise ArtifactError("%s: Chart.yaml lacks name or version" % path)
    config = helm_config(meta)
    size = os.path.getsize(path)
    return Artifact(kind="chart", name=str(meta["name"]), tag=str(meta["version"]).replace("+", "_"), origin=path,
                    config=_bytes_slice(config), config_media_type=HELM_CONFIG, config_digest=B.sha256_digest(config),
                    layers=[Layer(media_type=HELM_LAYER, source=Slice(size=size, path=path))],
                    manifest_annotations={"org.opencontainers.image.title": str(meta["name"]),
                                          "org.opencontainers.image.version": str(meta["version"])})


# helm's chart.Metadata field order (json.Marshal, omitempty)
_HELM_FIELDS = ("name", "home", "sources", "version", "description", "keywords", "maintainers", "icon",
                "apiVersion", "condition", "tags", "appVersion", "deprecated", "annotations", "kubeVersion",
                "dependencies", "type")


def helm_config(meta: Dict[str, Any]) -> bytes:
    ordered = {}
    for key in _HELM_FIELDS:
        value = meta.get(key)
        if value not in (None, "", [], {}, False):
            ordered[key] = str(value) if key in ("version", "appVersion") else value
    return json.dumps(ordered, separators=(",", ":")).encode()


def _stem(path: str) -> str:
    base = os.path.basename(path.rstrip("/"))
    for suffix in (".tar.gz", ".tgz", ".tar", ".run"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
    return base or "image"


def read_bundle_header(path: str) -> Optional[Dict[str, Any]]:
    """The JSON description in a .run bundle's header, or None when ``path`` is not one of ours."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(65536)
    except OSError:
        return None
    for line in head.split(b"\n", 40)[:40]:
        text = line.decode("utf-8", "replace")
        if text.startswith(BUNDLE_MAGIC):
            try:
                doc = json.loads(text[len(BUNDLE_MAGIC):])
            except ValueError:
                return None
            if not isinstance(doc, dict):
                raise ArtifactError("%s: the bundle header's JSON is not an object" % path)
            return doc
    return None


def _bundle_offset(path: str, header: Dict[str, Any]) -> int:
    offset = header.get("offset")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0 or offset % 512:
        raise ArtifactError("%s: the bundle header's offset is %s, not a non-negative multiple of 512: "
                            "a damaged or foreign header" % (path, "missing" if offset is None else repr(offset)))
    return offset


def _check_bundle_header(path: str, header: Dict[str, Any]) -> None:
    """Every name the header gives becomes a member path or a repository: checked before either."""
    for image in header.get("images") or []:
        if not isinstance(image, dict):
            raise ArtifactError("%s: the bundle header lists an image that is not an object: %r" % (path, image))
        R.repository(image.get("name"), "%s: bundle image name" % path)  # type: ignore[arg-type]
        R.tag(image.get("tag"), "%s: bundle image %s: tag" % (path, image.get("name")))  # type: ignore[arg-type]
    for chart in header.get("charts") or []:
        if not isinstance(chart, dict) or not isinstance(chart.get("file"), str) or not isinstance(chart.get("metadata"), dict):
            raise ArtifactError("%s: the bundle header lists a chart without file or metadata: %r" % (path, chart))
        if "/" in chart["file"] or chart["file"] in ("", ".", ".."):
            raise ArtifactError("%s: bundle chart file %r is not a plain file name" % (path, chart["file"]))
        R.repository(chart.get("name"), "%s: bundle chart name" % path)  # type: ignore[arg-type]
        R.digest(chart.get("digest"), "%s: bundle chart %s: digest" % (path, chart.get("name")))  # type: ignore[arg-type]


def read_bundle(path: str, header: Dict[str, Any]) -> List[Artifact]:
    offset = _bundle_offset(path, header)
    _check_bundle_header(path, header)
    store = _TarStore(path, offset=offset)
    result: List[Artifact] = []
    for image in header.get("images") or []:
        sub = store.sub("images/%s/" % image["name"])
        arts = read_oci_layout("%s (image %s)" % (path, image["name"]), sub, image["name"])
        for art in arts:
            art.name, art.tag = image["name"], image["tag"]
        result.extend(arts)
    for chart in header.get("charts") or []:
        blob = store.get("charts/" + chart["file"])
        if blob is None:
            raise ArtifactError("%s: chart %s is missing from the payload" % (path, chart["file"]))
        config = helm_config(chart["metadata"])
        result.append(Artifact(kind="chart", name=chart["name"], tag=str(chart["version"]).replace("+", "_"),
                               origin=path, config=_bytes_slice(config), config_media_type=HELM_CONFIG,
                               config_digest=B.sha256_digest(config),
                               layers=[Layer(media_type=HELM_LAYER, source=blob, digest=chart["digest"])],
                               manifest_annotations={"org.opencontainers.image.title": chart["name"],
                                                     "org.opencontainers.image.version": str(chart["version"])}))
    return result


def read_source(path: str) -> List[Artifact]:
    """Every artifact in ``path``, whatever kind of file or directory it is."""
    if not os.path.exists(path):
        raise ArtifactError("%s: no such file or directory" % path)
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "index.json")):
            raise ArtifactError("%s: a directory without index.json is not an OCI layout" % path)
        return read_oci_layout(path, _DirStore(path), _stem(path))
    header = read_bundle_header(path)
    if header is not None:
        return read_bundle(path, header)
    with open(path, "rb") as handle:
        magic = handle.read(2)
    if magic == b"\x1f\x8b":
        return [read_chart(path)]
    store = _TarStore(path)
    if "manifest.json" in store.members:
        return read_docker_archive(path, store)
    if "index.json" in store.members:
        return read_oci_layout(path, store, _stem(path))
    raise ArtifactError("%s: neither a docker-archive (manifest.json), an OCI layout (index.json), "
                        "a Helm chart (.tgz) nor a metax-k8s-images bundle" % path)
