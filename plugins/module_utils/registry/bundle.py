# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The offline image bundle ``metax-k8s-images.<version>.run`` (the manual's section 1.4 package).

Layout: a POSIX sh header (``help|list|extract DIR|load [DOMAIN/PROJECT]|push
DOMAIN/PROJECT``), padded so that the payload starts at a byte offset the
header states, then an uncompressed tar:

    images/<name>/{oci-layout,index.json,blobs/sha256/...}   one OCI layout per image (gzip layers)
    charts/<chart>-<version>.tgz                               packaged Helm charts
    pusher/ansible_collections/metax/gpu/plugins/module_utils/...   this package, for ``push``

The header's ``# metax-bundle-json:`` line describes the content; its
``key`` (sha256 over image configs and layers, charts, pusher source) decides
whether an existing bundle is rewritten.
"""

from __future__ import annotations

import hashlib
import inspect
import io
import json
import os
import shlex
import tarfile
import tempfile
from typing import Any, Dict, List

from ansible_collections.metax.gpu.plugins.module_utils import archive as _archive
from ansible_collections.metax.gpu.plugins.module_utils.archive import limits as _archive_limits
from ansible_collections.metax.gpu.plugins.module_utils.archive import paths as _archive_paths
from ansible_collections.metax.gpu.plugins.module_utils.archive import tree as _archive_tree
from ansible_collections.metax.gpu.plugins.module_utils import backoff as _backoff
from ansible_collections.metax.gpu.plugins.module_utils import errors as _errors
from ansible_collections.metax.gpu.plugins.module_utils.registry import api as _api
from ansible_collections.metax.gpu.plugins.module_utils.registry import blobs as B
from ansible_collections.metax.gpu.plugins.module_utils.registry import cli as _cli
from ansible_collections.metax.gpu.plugins.module_utils.registry import client as _client
from ansible_collections.metax.gpu.plugins.module_utils.registry import errors as _rerrors
from ansible_collections.metax.gpu.plugins.module_utils.registry import push as _push
from ansible_collections.metax.gpu.plugins.module_utils.registry import reference as _reference
from ansible_collections.metax.gpu.plugins.module_utils.registry import sources as _sources
from ansible_collections.metax.gpu.plugins.module_utils.registry import layerstream as _layerstream
from ansible_collections.metax.gpu.plugins.module_utils.registry import xzpush as _xzpush
from ansible_collections.metax.gpu.plugins.module_utils.registry import xzsource as _xzsource
from ansible_collections.metax.gpu.plugins.module_utils.registry.errors import ArtifactError
from ansible_collections.metax.gpu.plugins.module_utils.registry.sources import (
    BUNDLE_MAGIC, CONTAINERD_NAME, REF_NAME, read_bundle_header, read_chart, read_source)

FORMAT = 2  # 2: blobs shared between images are hard links
DEFAULT_REGISTRY = "cr.metax-tech.com/cloud"
_PUSHER_MODULES = (_errors, _archive, _archive_limits, _archive_paths, _archive_tree, _backoff, _api, B, _cli, _client,
                   _rerrors, _push, _reference, _sources, _layerstream, _xzpush, _xzsource)
_MU = "ansible_collections/metax/gpu/plugins/module_utils/"


def _pusher_files() -> Dict[str, bytes]:
    files = {}
    for mod in _PUSHER_MODULES:
        rel = mod.__name__.replace("ansible_collections.metax.gpu.plugins.module_utils.", "").replace(".", "/")
        package = os.path.basename(mod.__file__ or "") == "__init__.py"     # archive/ is a package
        files["pusher/" + _MU + rel + ("/__init__.py" if package else ".py")] = inspect.getsource(mod).encode()
    files["pusher/" + _MU + "registry/__init__.py"] = b'"""The bundle\'s pusher."""\n'
    return files


def _layer_key(art) -> List[str]:
    return [l.diff_id or l.digest or "" for l in art.layers]


def _read_images(images: List[Dict[str, Any]]):
    out = []
    for spec in images:
        for key in ("archive", "name", "tag"):
            if not spec.get(key):
                raise ArtifactError("every image needs archive, name and tag; got %r" % (spec,))
        arts = [a for a in read_source(spec["archive"]) if a.kind == "image"]
        if len(arts) != 1:
            raise ArtifactError("%s: expected one image, found %d" % (spec["archive"], len(arts)))
        art = arts[0]
        # the name becomes a directory of the payload and a word of the .run script's IMAGES list
        art.name = _reference.repository(spec["name"], "image name")
        art.tag = _reference.tag(str(spec["tag"]), "image %s: tag" % spec["name"])
        out.append(art)
    return out


def check_values(version: str, registry: str) -> None:
    """``version`` and ``registry`` go into the .run script (a comment, the usage text, a variable):
    only values of their grammar, so that no quoting can be escaped (they are quoted as well)."""
    _reference.version(version, "version")
    _reference.registry(registry, "registry")


def _chart_entry(path: str) -> Dict[str, Any]:
    art = read_chart(path)
    with open(path, "rb") as handle:
        digest, _size = B.hash_stream(handle)
    meta = json.loads(art.config.read_all())  # type: ignore[union-attr]
    return {"file": os.path.basename(path), "path": path, "name": art.name, "version": meta["version"],
            "digest": digest, "metadata": meta}


def content_key(version: str, registry: str, arts, charts: List[Dict[str, Any]], pusher: Dict[str, bytes]) -> str:
    doc = {
        "format": FORMAT, "version": version, "registry": registry,
        "images": [[a.name, a.tag, a.config_digest, _layer_key(a)] for a in arts],
        "charts": [[c["name"], c["version"], c["digest"]] for c in charts],
        "pusher": hashlib.sha256(b"".join(pusher[k] for k in sorted(pusher))).hexdigest(),
        "header": hashlib.sha256(HEADER.encode()).hexdigest(),
    }
    return "sha256:" + hashlib.sha256(B.canonical_json(doc)).hexdigest()


def build(path: str, version: str, images: List[Dict[str, Any]], charts: List[str], registry: str = DEFAULT_REGISTRY,
          check_mode: bool = False, cache_dir: str = "", threads: int = 2) -> Dict[str, Any]:
    """Write the bundle unless an identical one is there; returns the module's result."""
    check_values(version, registry)
    arts = _read_images(images)
    chart_entries = [_chart_entry(c) for c in charts]
    pusher = _pusher_files()
    key = content_key(version, registry, arts, chart_entries, pusher)
    existing = read_bundle_header(path) if os.path.exists(path) else None
    if existing and existing.get("key") == key:
        return _result(False, path, existing)
    if check_mode:
        return {"changed": True, "path": path, "digest": key,
                "images": [{"name": a.name, "tag": a.tag, "digest": None} for a in arts],
                "charts": [{"name": c["name"], "version": c["version"]} for c in chart_entries]}
    opts = _push.Options(compression="gzip", concurrency=threads, cache_dir=cache_dir, keep_files=True)
    prepared = [_push.prepare(a, a.name, a.tag, opts) for a in arts]
    desc = {"format": FORMAT, "key": key, "version": version, "registry": registry, "offset": 0,
            "images": [{"name": p.repository, "tag": p.tag, "digest": p.digest} for p in prepared],
            "charts": [{k: c[k] for k in ("file", "name", "version", "digest", "metadata")} for c in chart_entries]}
    header = _render_header(desc)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path) + ".")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(header)
            with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
                written: Dict[str, str] = {}
                for p in prepared:
                    _add_layout(tar, p, registry, written)
                for c in chart_entries:
                    with open(c["path"], "rb") as handle:
                        _add(tar, "charts/" + c["file"], os.path.getsize(c["path"]), handle)
                for name, data in sorted(pusher.items()):
                    _add(tar, name, len(data), io.BytesIO(data))
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return _result(True, path, desc)


def _result(changed: bool, path: str, desc: Dict[str, Any]) -> Dict[str, Any]:
    return {"changed": changed, "path": path, "digest": desc["key"],
            "images": [{"name": i["name"], "tag": i["tag"], "digest": i["digest"]} for i in desc["images"]],
            "charts": [{"name": c["name"], "version": c["version"]} for c in desc["charts"]]}


def remove(path: str, check_mode: bool = False) -> Dict[str, Any]:
    if not os.path.exists(path):
        return {"changed": False, "path": path, "digest": None, "images": [], "charts": []}
    if read_bundle_header(path) is None:
        raise ArtifactError("%s is not a metax-k8s-images bundle; not removing it" % path)
    if not check_mode:
        os.unlink(path)
    return {"changed": True, "path": path, "digest": None, "images": [], "charts": []}


def _add(tar: tarfile.TarFile, name: str, size: int, handle) -> None:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = 0
    info.mode = 0o644
    tar.addfile(info, handle)


def _add_link(tar: tarfile.TarFile, name: str, target: str) -> None:
    info = tarfile.TarInfo(name)
    info.type = tarfile.LNKTYPE
    info.linkname = target
    info.mtime = 0
    info.mode = 0o644
    tar.addfile(info)


class _Verified:
    """A blob's bytes as they are copied into the bundle, hashed: ``verify`` refuses a blob whose
    bytes are not its digest (a corrupted cache file, a layout whose descriptor lies), and the
    bundle is then not written (build removes its temporary file)."""

    def __init__(self, handle, digest: str) -> None:
        self.handle = handle
        self.digest = _reference.digest(digest, "layer digest")
        self.hash = hashlib.new(digest.split(":", 1)[0])
        self.size = 0

    def read(self, amount: int = -1) -> bytes:
        data = self.handle.read(amount)
        self.hash.update(data)
        self.size += len(data)
        return data

    def verify(self, what: str) -> None:
        got = "%s:%s" % (self.digest.split(":", 1)[0], self.hash.hexdigest())
        if got != self.digest:
            raise ArtifactError("%s: its bytes are %s (%d bytes), not %s: the bundle was not written"
                                % (what, got, self.size, self.digest))


def _add_layout(tar: tarfile.TarFile, prepared, registry: str, written: Dict[str, str]) -> None:
    """One OCI layout; a blob another image already wrote (the agents share their base layers) is a hard link."""
    base = "images/%s/" % prepared.repository
    _add(tar, base + "oci-layout", 30, io.BytesIO(b'{"imageLayoutVersion":"1.0.0"}'))
    for blob in prepared.blobs:
        if blob.source is None or blob.digest is None:
            raise AssertionError("bundle layers are converted to files before they are written")
        name = base + "blobs/sha256/" + blob.digest.split(":")[1]
        if written.get(blob.digest) == name:  # the same layer twice in one image
            continue
        if blob.digest in written:
            _add_link(tar, name, written[blob.digest])
            continue
        written[blob.digest] = name
        with blob.source.open() as handle:
            checked = _Verified(handle, blob.digest)
            _add(tar, name, blob.size, checked)
        checked.verify("%s: layer of %s:%s" % (blob.source.path or "memory", prepared.repository, prepared.tag))
    body, media_type = prepared.manifests()[-1]
    _add(tar, base + "blobs/sha256/" + B.sha256_digest(body).split(":")[1], len(body), io.BytesIO(body))
    full = "%s/%s:%s" % (registry.rstrip("/"), prepared.repository, prepared.tag)
    index = {"schemaVersion": 2, "mediaType": B.OCI_INDEX, "manifests": [{
        "mediaType": media_type, "digest": B.sha256_digest(body), "size": len(body),
        # containerd, podman and docker name the loaded image from these
        "annotations": {REF_NAME: full, CONTAINERD_NAME: full}}]}
    raw = json.dumps(index).encode()
    _add(tar, base + "index.json", len(raw), io.BytesIO(raw))


def _render_header(desc: Dict[str, Any]) -> bytes:
    listing = "".join("  image  %s:%s  %s\n" % (i["name"], i["tag"], i["digest"]) for i in desc["images"]) + \
        "".join("  chart  %s %s  (%s)\n" % (c["name"], c["version"], c["file"]) for c in desc["charts"])
    names = " ".join(i["name"] + ":" + i["tag"] for i in desc["images"])

    def render(offset: int) -> bytes:
        line = BUNDLE_MAGIC + json.dumps(dict(desc, offset=offset), separators=(",", ":"), sort_keys=True)
        return HEADER.replace("@JSON@", line).replace("@LISTING@", listing.rstrip("\n")) \
            .replace("@IMAGES@", shlex.quote(names)).replace("@REGISTRY@", shlex.quote(desc["registry"])) \
            .replace("@VERSION@", desc["version"]).encode()

    # the offset is written inside the header it measures: grow it in 512-byte steps until it fits
    offset = 512
    while True:
        data = render(offset)
        if len(data) <= offset:
            desc["offset"] = offset
            return data + b"\n" * (offset - len(data))
        offset += 512


HEADER = r"""#!/bin/sh
# metax-k8s-images offline bundle @VERSION@ (written by the metax.gpu collection)
@JSON@
set -eu
SELF=$0
OFFSET=$(sed -n 's/^# metax-bundle-json: .*"offset":\([0-9]*\).*/\1/p' "$SELF" | head -n 1)
REGISTRY_DEFAULT=@REGISTRY@
IMAGES=@IMAGES@

usage() {
  cat <<'EOT'
usage: metax-k8s-images.@VERSION@.run COMMAND
  help                  this text
  list                  the images and charts inside
  extract DIR           unpack the OCI layouts, charts and pusher into DIR
  load [DOMAIN/PROJECT] import the images into this node's runtime (containerd k8s.io, podman or docker);
                        named DOMAIN/PROJECT/NAME:TAG (default @REGISTRY@)
  push DOMAIN/PROJECT   push every image and chart to a registry (needs python3 with requests);
                        credentials: docker/podman login, or METAX_REGISTRY_USER + METAX_REGISTRY_PASSWORD;
                        METAX_PLAIN_HTTP=1 for a registry without TLS, METAX_CA_FILE=ca.crt,
                        METAX_COMPRESSION=gzip|zstd|none
EOT
}

payload() { tail -c +"$((OFFSET + 1))" "$SELF"; }

cmd=${1:-help}
case "$cmd" in
  help|-h|--help) usage ;;
  list)
    cat <<'EOT'
@LISTING@
EOT
    ;;
  extract)
    [ $# -eq 2 ] || { usage >&2; exit 2; }
    mkdir -p "$2"
    payload | tar -xf - -C "$2"
    ;;
  push)
    [ $# -ge 2 ] || { usage >&2; exit 2; }
    command -v python3 >/dev/null 2>&1 || { echo "push needs python3 (with requests)" >&2; exit 1; }
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    payload | tar -xf - -C "$tmp" pusher
    target=$2
    shift 2
    PYTHONPATH="$tmp/pusher" python3 -m ansible_collections.metax.gpu.plugins.module_utils.registry.cli \
      push "$SELF" "$target" "$@"
    ;;
  load)
    target=${2:-$REGISTRY_DEFAULT}
    runtime=${METAX_BUNDLE_RUNTIME:-}
    if [ -z "$runtime" ]; then
      if command -v ctr >/dev/null 2>&1 && ctr -n k8s.io version >/dev/null 2>&1; then runtime=containerd
      elif command -v podman >/dev/null 2>&1; then runtime=podman
      elif command -v docker >/dev/null 2>&1; then runtime=docker
      else echo "load: no container runtime found (containerd's ctr, podman or docker)" >&2; exit 1
      fi
    fi
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    payload | tar -xf - -C "$tmp" images
    for image in $IMAGES; do
      name=${image%%:*}
      tar -C "$tmp/images/$name" -cf "$tmp/$name.tar" .
      from="$REGISTRY_DEFAULT/$image"
      to="$target/$image"
      case "$runtime" in
        containerd)
          ctr -n k8s.io images import "$tmp/$name.tar"
          [ "$from" = "$to" ] || ctr -n k8s.io images tag --force "$from" "$to" ;;
        podman)
          podman load -i "$tmp/$name.tar"
          [ "$from" = "$to" ] || podman tag "$from" "$to" ;;
        docker)
          docker load -i "$tmp/$name.tar"
          [ "$from" = "$to" ] || docker tag "$from" "$to" ;;
        *) echo "load: unknown runtime $runtime" >&2; exit 2 ;;
      esac
      echo "loaded $to ($runtime)"
      rm -f "$tmp/$name.tar"
    done
    ;;
  *) usage >&2; exit 2 ;;
esac
exit 0
"""
