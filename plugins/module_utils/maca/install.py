# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Install MXMACA on a host from its payload image archive, and switch /opt/maca atomically (the I/O of :mod:`.layout`).

The payload is an image archive as the vendor ships it or ``docker save``
writes it (a tar, optionally xz-compressed: manual section 1.4.3): layer
tars, then ``manifest.json`` with their order. Only the image's ``opt/maca``
is extracted. An xz stream reads only forward, and the order comes last, so
each layer's ``opt/maca`` part is staged on its own and the stages are then
merged in the manifest's order, with the image whiteouts applied
(``.wh.NAME`` removes NAME, ``.wh..wh..opq`` empties its directory).
Extraction and merge are :mod:`..archive`'s: nothing is written, chmod-ed or
removed through a symbolic link, hard links stay inside the tree, and the
payload is bounded by :class:`~..archive.Limits` (issue 39). The archive is
streamed: no layer, however small, is read into memory; only the image's
JSON (manifests, configs) is.

Everything happens in ``/opt/.maca-<version>.tmp``, renamed to
``/opt/maca-<version>`` when complete and removed when refused: a version
directory is whole or absent. The switch is a new link renamed over ``/opt/maca``.
The GPU Operator's MACA component (``agents/maca_manager``) installs the
same way from a directory instead: the payload image mounted read-only by
the kubelet (an image volume), whose ``/opt/maca`` is copied by
:func:`copy_maca` into the same temporary directory, then renamed and
switched like an extracted archive (one code path for both).
Standard library only: this runs on nodes.
"""

from __future__ import annotations

import json
import lzma
import os
import shutil
import tarfile
import zlib
from typing import IO, Dict, List, Optional

from .. import archive
from ..archive import ArchiveError, Limits
from ..host import HostRoot
from .layout import MACA_LINK, PREFIX, MacaLayoutError, MacaPlan, dir_name, installed_versions, plan

SUBTREE = ["opt", "maca"]
METADATA = 4 << 20        # a JSON member up to this size is kept in memory (manifest.json, configs) ...
METADATA_TOTAL = 16 << 20  # ... up to this much in all; nothing else is
_COMPRESSED = (archive.GZIP_MAGIC, archive.XZ_MAGIC, archive.BZIP2_MAGIC)
_LINK_HOPS = 8


def _select(name: str) -> Optional[List[str]]:
    """The path under opt/maca of a layer entry (None: outside it)."""
    parts = name.split("/") if name else []
    return parts[len(SUBTREE):] if parts[:len(SUBTREE)] == SUBTREE else None


def _layer_kind(head: bytes) -> Optional[str]:
    """``tar`` (possibly compressed), ``empty`` (docker's empty layer: zero blocks), or None (not a layer)."""
    if head.startswith(_COMPRESSED):
        return "tar"
    if len(head) == tarfile.BLOCKSIZE and not head.strip(b"\0"):
        return "empty"
    try:
        tarfile.TarInfo.frombuf(head, "utf-8", "surrogateescape")
    except (tarfile.HeaderError, ValueError):
        return None
    return "tar"


def _stage_layer(head: bytes, handle: IO[bytes], stage: str, budget: archive.Budget, member: str) -> bool:
    """The opt/maca part of one layer into the new directory ``stage``; False when it is not a tar after all."""
    os.mkdir(stage, 0o700)
    if _layer_kind(head) == "empty":
        return True
    try:
        layer = archive.open_stream(archive.Prefixed(head, handle), budget.limits)  # type: ignore[arg-type]
    except (tarfile.TarError, lzma.LZMAError, EOFError, OSError, zlib.error):
        # compressed, but not a tar (a blob of an OCI layout that is no layer): read past
        shutil.rmtree(stage, ignore_errors=True)
        return False
    try:
        with layer:
            archive.extract_members(layer, stage, budget, _select)  # devices and FIFOs skipped: not part of an SDK
    except ArchiveError as exc:
        raise ArchiveError("layer %s: %s" % (member, exc)) from exc
    return True


def _merge(stage: str, dest: str) -> None:
    """Apply one staged layer over ``dest`` (image whiteout semantics; never through a link)."""
    archive.merge_layer(stage, dest)


def _layer_order(small: Dict[str, bytes]) -> List[str]:
    """The layer member names in order: docker-save's manifest.json, or an OCI layout's index and manifest."""
    if "manifest.json" in small:
        manifests = json.loads(small["manifest.json"])
        return list(manifests[0]["Layers"])
    if "index.json" in small:
        index = json.loads(small["index.json"])
        digest = index["manifests"][0]["digest"]
        manifest = json.loads(small["blobs/" + digest.replace(":", "/")])
        return ["blobs/" + layer["digest"].replace(":", "/") for layer in manifest["layers"]]
    raise MacaLayoutError("the payload has neither manifest.json nor index.json: not an image archive")


def _resolve(name: str, links: Dict[str, str]) -> str:
    """A name of the archive after its links (docker 25's ``<id>/layer.tar`` links to ``blobs/sha256/...``)."""
    name = "/".join(archive.member_parts(name))
    for _hop in range(_LINK_HOPS):
        if name not in links:
            break
        name = links[name]
    return name


def extract_maca(archive_path: str, dest: str, limits: Limits = archive.DEFAULT_LIMITS) -> None:
    """The image's /opt/maca into the new directory ``dest`` (its parent must exist)."""
    staging = dest + ".layers"
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    budget = archive.Budget(limits)
    small: Dict[str, bytes] = {}
    small_total = 0
    staged: Dict[str, str] = {}
    links: Dict[str, str] = {}
    try:
        with open(archive_path, "rb") as raw, archive.open_stream(raw, limits) as outer:
            for member in archive.members(outer, budget, container=True):
                name = "/".join(archive.member_parts(member.name))
                if member.issym() or member.islnk():
                    base = name.rsplit("/", 1)[0] + "/" if member.issym() and "/" in name else ""
                    links[name] = "/".join(archive.member_parts(os.path.normpath(base + member.linkname)))
                    continue
                if not member.isfile():
                    continue
                handle = outer.extractfile(member)
                if handle is None:  # pragma: no cover - a regular member always has a stream
                    continue
                head = handle.read(tarfile.BLOCKSIZE)
                kind = _layer_kind(head)
                if kind is not None:
                    stage = os.path.join(staging, str(len(staged)))
                    if _stage_layer(head, handle, stage, budget, member.name):
                        staged[name] = stage
                        continue
                if member.size <= METADATA and small_total + member.size <= METADATA_TOTAL \
                        and head.lstrip()[:1] in (b"{", b"["):
                    small[name] = head + handle.read()
                    small_total += member.size
                # anything else (a large non-layer blob) is read past, never held
        order = [_resolve(name, links) for name in _layer_order(small)]
        missing = [name for name in order if name not in staged]
        if missing:
            raise MacaLayoutError("the payload lacks layer(s) %s" % ", ".join(missing))
        os.makedirs(dest)
        for name in order:
            _merge(staged[name], dest)
        if not os.listdir(dest):
            raise MacaLayoutError("the payload image has no /opt/maca")
    except ArchiveError as exc:
        raise MacaLayoutError("the payload %s was refused: %s" % (archive_path, exc)) from exc
    except (tarfile.TarError, lzma.LZMAError, zlib.error, EOFError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise MacaLayoutError("cannot read the payload %s: %s" % (archive_path, exc)) from exc
    except OSError as exc:  # a damaged gzip layer, or the node's disk
        raise MacaLayoutError("cannot extract the payload %s: %s" % (archive_path, exc)) from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def copy_maca(tree: str, dest: str, limits: Limits = archive.DEFAULT_LIMITS) -> None:
    """The MXMACA tree ``tree`` (an image's ``/opt/maca``, read-only) into the new directory ``dest``.

    Symbolic links are copied as links (an SDK links its libraries by
    soname), never followed; devices and FIFOs are skipped; the archive
    bounds apply (:func:`..archive.copy_tree`). File data goes through
    ``sendfile`` (no user-space buffer for a multi-GB payload).
    """
    if not os.path.isdir(tree):
        raise MacaLayoutError("the payload has no MXMACA tree at %s" % tree)
    if not os.listdir(tree):
        raise MacaLayoutError("the payload's MXMACA tree %s is empty" % tree)
    try:
        archive.copy_tree(tree, dest, limits)
    except ArchiveError as exc:
        raise MacaLayoutError("the MXMACA tree %s was refused: %s" % (tree, exc)) from exc
    except OSError as exc:
        raise MacaLayoutError("cannot copy the MXMACA tree %s: %s" % (tree, exc)) from exc


def current(host: HostRoot, link: str = MACA_LINK):
    """(link target or None, whether /opt/maca is a real directory, installed versions)."""
    local = host.join(link)
    target = os.readlink(local) if os.path.islink(local) else None
    is_dir = os.path.isdir(local) and not os.path.islink(local)
    parent = host.join(os.path.dirname(link))
    names = os.listdir(parent) if os.path.isdir(parent) else []
    return target, is_dir, installed_versions([n for n in names if os.path.isdir(os.path.join(parent, n))])


def switch(host: HostRoot, version: str, link: str = MACA_LINK) -> None:
    """Point ``link`` at ``maca-<version>`` in one rename (never absent in between)."""
    local = host.join(link)
    tmp = "%s.%d.new" % (local, os.getpid())
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(dir_name(version), tmp)
    os.replace(tmp, local)


def install(host: HostRoot, archive_path: Optional[str], version: str, keep: int = 1, link: str = MACA_LINK,
            check_mode: bool = False, tree: Optional[str] = None, limits: Limits = archive.DEFAULT_LIMITS) -> MacaPlan:
    """Install ``version`` from ``archive_path`` or the directory ``tree`` (when not installed), switch to it,
    drop versions beyond ``keep``. ``limits`` bound what the payload may hold (:class:`..archive.Limits`)."""
    target, is_dir, installed = current(host, link)
    the_plan = plan(target, is_dir, installed, version, keep)
    if check_mode:
        return the_plan
    parent = host.join(os.path.dirname(link))
    if the_plan.install:
        if not archive_path and not tree:
            raise MacaLayoutError("MXMACA %s is not installed and no payload was given" % version)
        os.makedirs(parent, exist_ok=True)
        final = os.path.join(parent, dir_name(version))
        tmp = os.path.join(parent, ".%s.tmp" % dir_name(version))
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            if tree:
                copy_maca(tree, tmp, limits)
            else:
                extract_maca(str(archive_path), tmp, limits)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)  # a refused payload leaves nothing behind
            raise
        os.replace(tmp, final)
    if the_plan.switch:
        switch(host, version, link)
    for old in the_plan.remove:
        shutil.rmtree(os.path.join(parent, PREFIX + old), ignore_errors=True)
    return the_plan


def uninstall(host: HostRoot, link: str = MACA_LINK, check_mode: bool = False) -> List[str]:
    """Remove the link and every version directory this layout made; returns the node paths removed."""
    target, is_dir, installed = current(host, link)
    if is_dir:
        raise MacaLayoutError("%s is a directory, not a link made by metax.gpu: left alone" % link)
    parent = os.path.dirname(link)
    removed = ([link] if target is not None else []) + ["%s/%s%s" % (parent, PREFIX, v) for v in installed]
    if not check_mode:
        if target is not None:
            os.unlink(host.join(link))
        for version in installed:
            shutil.rmtree(host.join("%s/%s%s" % (parent, PREFIX, version)), ignore_errors=True)
    return removed
