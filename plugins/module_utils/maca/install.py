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

Everything happens in ``/opt/.maca-<version>.tmp``, renamed to
``/opt/maca-<version>`` when complete: a version directory is whole or
absent. The switch is a new link renamed over ``/opt/maca``.
The GPU Operator's MACA component (``agents/maca_manager``) installs the
same way from a directory instead: the payload image mounted read-only by
the kubelet (an image volume), whose ``/opt/maca`` is copied by
:func:`copy_maca` into the same temporary directory, then renamed and
switched like an extracted archive (one code path for both).
Standard library only: this runs on nodes.
"""

from __future__ import annotations

import io
import json
import lzma
import os
import shutil
import tarfile
from typing import IO, Dict, List, Optional

from ..host import HostRoot
from .layout import MACA_LINK, PREFIX, MacaLayoutError, MacaPlan, dir_name, installed_versions, plan

SUBTREE = "opt/maca/"
XZ_MAGIC = b"\xfd7zXZ\x00"
SMALL = 4 << 20          # members up to this size are read into memory (manifests, configs, small layers)
WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"


def _open(path: str) -> IO[bytes]:
    with open(path, "rb") as handle:
        xz = handle.read(len(XZ_MAGIC)) == XZ_MAGIC
    return lzma.open(path, "rb") if xz else open(path, "rb")


def _safe(name: str) -> Optional[str]:
    """The path under opt/maca of a layer entry (None: outside it, or not a safe relative path)."""
    name = name.lstrip("./")
    if not name.startswith(SUBTREE):
        return None
    rel = name[len(SUBTREE):].rstrip("/")
    parts = rel.split("/") if rel else []
    if any(p in ("", "..") for p in parts):
        return None
    return rel


def _extract_layer(layer: tarfile.TarFile, stage: str) -> None:
    """The opt/maca part of one layer into ``stage`` (streamed; links and specials limited to the tree)."""
    real_stage = os.path.realpath(stage)
    for member in layer:
        rel = _safe(member.name)
        if rel is None:
            continue
        target = os.path.join(stage, rel) if rel else stage
        parent = os.path.dirname(target)
        # never write through a symbolic link an earlier entry made (it could point out of the tree)
        if not os.path.realpath(parent).startswith(real_stage):
            raise MacaLayoutError("payload entry %s escapes %s" % (member.name, SUBTREE))
        if member.isdir():
            os.makedirs(target, exist_ok=True)
            os.chmod(target, member.mode & 0o7777 | 0o700)
        elif member.isfile():
            os.makedirs(parent, exist_ok=True)
            source = layer.extractfile(member)
            if source is None:
                continue
            with open(target, "wb") as out:
                shutil.copyfileobj(source, out, 1 << 20)
            os.chmod(target, member.mode & 0o7777)
        elif member.issym():
            os.makedirs(parent, exist_ok=True)
            if os.path.lexists(target):
                os.unlink(target)
            os.symlink(member.linkname, target)
        elif member.islnk():
            link_rel = _safe(member.linkname)
            if link_rel is None:
                continue
            os.makedirs(parent, exist_ok=True)
            shutil.copy2(os.path.join(stage, link_rel), target)
        # devices, FIFOs: not part of an SDK; skipped


def _merge(stage: str, dest: str) -> None:
    """Apply one staged layer over ``dest`` (image whiteout semantics)."""
    for base, dirs, files in os.walk(stage):
        rel = os.path.relpath(base, stage)
        out_dir = os.path.join(dest, rel) if rel != "." else dest
        if OPAQUE in files and os.path.isdir(out_dir):
            for name in os.listdir(out_dir):
                path = os.path.join(out_dir, name)
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path)
                else:
                    os.unlink(path)
        os.makedirs(out_dir, exist_ok=True)
        for name in files + [d for d in dirs if os.path.islink(os.path.join(base, d))]:
            if name == OPAQUE:
                continue
            if name.startswith(WHITEOUT):
                gone = os.path.join(out_dir, name[len(WHITEOUT):])
                if os.path.isdir(gone) and not os.path.islink(gone):
                    shutil.rmtree(gone)
                elif os.path.lexists(gone):
                    os.unlink(gone)
                continue
            target = os.path.join(out_dir, name)
            if os.path.isdir(target) and not os.path.islink(target):
                shutil.rmtree(target)
            elif os.path.lexists(target):
                os.unlink(target)
            os.replace(os.path.join(base, name), target)


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


def extract_maca(archive: str, dest: str) -> None:
    """The image's /opt/maca into the new directory ``dest`` (its parent must exist)."""
    staging = dest + ".layers"
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    small: Dict[str, bytes] = {}
    staged: Dict[str, str] = {}
    try:
        with _open(archive) as raw, tarfile.open(fileobj=raw, mode="r|") as outer:
            for member in outer:
                if not member.isfile():
                    continue
                name = member.name.lstrip("./")
                handle = outer.extractfile(member)
                if handle is None:
                    continue
                stage = os.path.join(staging, str(len(staged)))
                if member.size <= SMALL:
                    data = handle.read()
                    small[name] = data
                    try:
                        layer = tarfile.open(fileobj=io.BytesIO(data), mode="r:*")
                    except tarfile.TarError:
                        continue
                else:
                    layer = tarfile.open(fileobj=handle, mode="r|*")
                os.makedirs(stage)
                with layer:
                    _extract_layer(layer, stage)
                staged[name] = stage
        order = _layer_order(small)
        missing = [name for name in order if name not in staged]
        if missing:
            raise MacaLayoutError("the payload lacks layer(s) %s" % ", ".join(missing))
        os.makedirs(dest)
        for name in order:
            _merge(staged[name], dest)
        if not os.listdir(dest):
            raise MacaLayoutError("the payload image has no /opt/maca")
    except (tarfile.TarError, lzma.LZMAError, ValueError, KeyError, IndexError) as exc:
        raise MacaLayoutError("cannot read the payload %s: %s" % (archive, exc))
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def copy_maca(tree: str, dest: str) -> None:
    """The MXMACA tree ``tree`` (an image's ``/opt/maca``, read-only) into the new directory ``dest``.

    Symbolic links are copied as links (an SDK links its libraries by
    soname); file data goes through ``shutil.copy2``, which uses the
    kernel's ``copy_file_range``/``sendfile`` where it can (no user-space
    buffer for a multi-GB payload).
    """
    if not os.path.isdir(tree):
        raise MacaLayoutError("the payload has no MXMACA tree at %s" % tree)
    if not os.listdir(tree):
        raise MacaLayoutError("the payload's MXMACA tree %s is empty" % tree)
    try:
        shutil.copytree(tree, dest, symlinks=True)
    except (OSError, shutil.Error) as exc:
        raise MacaLayoutError("cannot copy the MXMACA tree %s: %s" % (tree, exc))
    # the image's modes are kept, but the directory must stay writable for the next switch's cleanup
    os.chmod(dest, os.stat(dest).st_mode | 0o700)


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


def install(host: HostRoot, archive: Optional[str], version: str, keep: int = 1, link: str = MACA_LINK,
            check_mode: bool = False, tree: Optional[str] = None) -> MacaPlan:
    """Install ``version`` from ``archive`` or the directory ``tree`` (when not installed), switch to it,
    drop versions beyond ``keep``."""
    target, is_dir, installed = current(host, link)
    the_plan = plan(target, is_dir, installed, version, keep)
    if check_mode:
        return the_plan
    parent = host.join(os.path.dirname(link))
    if the_plan.install:
        if not archive and not tree:
            raise MacaLayoutError("MXMACA %s is not installed and no payload was given" % version)
        os.makedirs(parent, exist_ok=True)
        final = os.path.join(parent, dir_name(version))
        tmp = os.path.join(parent, ".%s.tmp" % dir_name(version))
        shutil.rmtree(tmp, ignore_errors=True)
        if tree:
            copy_maca(tree, tmp)
        else:
            extract_maca(str(archive), tmp)
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
