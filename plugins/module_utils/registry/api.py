# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""One call for the module, the bundle's pusher and the benchmark: push everything in ``src``."""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from ansible_collections.metax.gpu.plugins.module_utils.registry import blobs as B
from ansible_collections.metax.gpu.plugins.module_utils.registry.client import Credentials, Registry, split_registry
from ansible_collections.metax.gpu.plugins.module_utils.registry.errors import ArtifactError, AuthError
from ansible_collections.metax.gpu.plugins.module_utils.registry.push import Options, Pusher, prepare
from ansible_collections.metax.gpu.plugins.module_utils.registry.sources import read_source
from ansible_collections.metax.gpu.plugins.module_utils.registry import reference as R
from ansible_collections.metax.gpu.plugins.module_utils.registry import xzpush, xzsource


@dataclass
class PushRequest:
    src: str
    registry: str                       # DOMAIN[:port][/PROJECT]
    repository: str = ""                # override (single-artifact sources only)
    tag: str = ""                       # override (single-artifact sources only)
    username: str = ""
    password: str = ""
    auth_file: str = ""
    validate_certs: bool = True
    ca_path: str = ""
    plain_http: bool = False
    compression: str = "gzip"
    concurrency: int = 4
    cache_dir: str = ""
    check_mode: bool = False
    retries: int = 5
    progress: Optional[Callable[[str, str, int, int], None]] = None
    only: List[str] = field(default_factory=list)   # kinds to push (image, chart, index); empty = all
    threads: int = 0                    # compression threads for an .xz archive (0 = up to 4)
    xz_tool: str = "auto"               # .xz archives: auto (xz -dc -T0 when on PATH), xz, python (lzma)


def auth_file_candidates() -> List[str]:
    home = os.path.expanduser("~")
    out = []
    if os.environ.get("REGISTRY_AUTH_FILE"):
        out.append(os.environ["REGISTRY_AUTH_FILE"])
    if os.environ.get("XDG_RUNTIME_DIR"):
        out.append(os.path.join(os.environ["XDG_RUNTIME_DIR"], "containers", "auth.json"))
    out.append(os.path.join(home, ".config", "containers", "auth.json"))
    out.append(os.path.join(os.environ.get("DOCKER_CONFIG") or os.path.join(home, ".docker"), "config.json"))
    return out


def credentials_from_auth_files(host: str, paths: List[str]) -> Optional[Credentials]:
    """The first entry for ``host`` in docker/podman auth JSON files (``auths.<host>.auth``)."""
    for path in paths:
        try:
            with open(path) as handle:
                auths = (json.load(handle) or {}).get("auths") or {}
        except OSError:
            continue
        except ValueError as exc:
            raise AuthError("auth file %s is not valid JSON (%s)" % (path, exc)) from exc
        for key in (host, "https://" + host, "http://" + host, "https://" + host + "/v2/"):
            entry = auths.get(key)
            if entry and entry.get("auth"):
                try:
                    user, _sep, password = base64.b64decode(entry["auth"]).decode().partition(":")
                except ValueError as exc:
                    raise AuthError("auth file %s: the entry for %s is not base64 user:password" % (path, host)) from exc
                return Credentials(user, password)
    return None


def connect(req: PushRequest) -> Registry:
    host, _project = split_registry(req.registry)
    if req.username:
        creds = Credentials(req.username, req.password)
    else:
        if req.auth_file and not os.path.isfile(req.auth_file):
            raise AuthError("auth file %s does not exist" % req.auth_file)
        creds = credentials_from_auth_files(host, [req.auth_file] if req.auth_file else auth_file_candidates()) \
            or Credentials()
    return Registry(host, creds, plain_http=req.plain_http, validate_certs=req.validate_certs,
                    ca_path=req.ca_path or None, retries=req.retries, pool=max(4, req.concurrency + 2))


def check_request(req: PushRequest) -> None:
    """The names the caller gives, before a source is read or the registry is contacted."""
    split_registry(req.registry)
    if req.repository:
        R.repository(req.repository, "repository")
    if req.tag:
        R.tag(req.tag, "tag")
    if req.concurrency < 1:
        raise ArtifactError("concurrency must be at least 1, not %d" % req.concurrency)


def push(req: PushRequest) -> Dict[str, Any]:
    check_request(req)
    if req.compression not in B.COMPRESSIONS:
        raise ArtifactError("compression must be one of %s, not %r" % (", ".join(B.COMPRESSIONS), req.compression))
    if os.path.isfile(req.src) and xzsource.is_xz(req.src):
        return push_xz(req)
    artifacts = read_source(req.src)
    if req.only:
        artifacts = [a for a in artifacts if a.kind in req.only]
    if (req.repository or req.tag) and len(artifacts) != 1:
        raise ArtifactError("%s holds %d artifacts: repository/tag overrides need exactly one" % (req.src, len(artifacts)))
    _host, project = split_registry(req.registry)
    opts = Options(compression=req.compression, concurrency=max(1, req.concurrency), cache_dir=req.cache_dir,
                   check_mode=req.check_mode, progress=req.progress)
    plans = []
    for art in artifacts:
        name = req.repository or art.name
        repository = "%s/%s" % (project, name) if project else name
        plans.append(prepare(art, repository, req.tag or art.tag, opts))
    registry = connect(req)
    try:
        registry.ping()
        pusher = Pusher(registry, opts)
        results = [pusher.push(p).as_dict() for p in plans]
    finally:
        registry.close()
    return {"changed": any(r["changed"] for r in results), "artifacts": results,
            "pushed": [r for r in results if r["changed"]], "skipped": [r for r in results if not r["changed"]]}


def push_xz(req: PushRequest) -> Dict[str, Any]:
    """An xz-compressed docker archive (the vendor's MXMACA images): one streaming pass, see xzpush."""
    if req.only and "image" not in req.only:
        return {"changed": False, "artifacts": [], "pushed": [], "skipped": []}
    _host, project = split_registry(req.registry)
    opts = xzpush.XzOptions(project=project, compression=req.compression, repository=req.repository, tag=req.tag,
                            cache_dir=req.cache_dir, check_mode=req.check_mode, retries=req.retries,
                            threads=req.threads, xz_tool=req.xz_tool, progress=req.progress)
    registry = connect(req)
    try:
        registry.ping()
        results = xzpush.XzPusher(registry, req.src, opts).push()
    finally:
        registry.close()
    return {"changed": any(r["changed"] for r in results), "artifacts": results,
            "pushed": [r for r in results if r["changed"]], "skipped": [r for r in results if not r["changed"]]}
