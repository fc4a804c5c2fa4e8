# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Where each MXMACA version lives on a host, and what an install or switch must do (pure).

Each version is a directory of its own, ``/opt/maca-<version>``; ``/opt/maca``
is a symbolic link to the active one (relative: ``maca-<version>``). A switch
replaces the link atomically, so a reader sees the old version or the new
one, never none. Running containers keep theirs: the CDI spec mounts the
link's *target* (``cdi.writer.host_maca`` resolves it), so their mount stays
on the old directory, which is therefore kept (the newest ``keep`` versions
besides the active one stay; older ones go).

The payload is the vendor's MXMACA container image (manual section 1.4.3,
the GPU Operator's ``maca.payload.images``), e.g.
``cr.metax-tech.com/library/maca-c500:2.23.0.4-ubuntu18.04-amd64``; its
``/opt/maca`` is what the host gets. Standard library only: this runs on nodes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

from ..errors import MetaxGpuError

MACA_LINK = "/opt/maca"
PREFIX = "maca-"
# the version part of an image tag: 2.23.0.4 in 2.23.0.4-ubuntu18.04-amd64
_TAG_VERSION = re.compile(r"^(\d+(?:\.\d+){1,3})(?:[-_].*)?$")
_VERSION = re.compile(r"^\d+(?:\.\d+){1,3}$")


class MacaLayoutError(MetaxGpuError):
    """The host's /opt/maca cannot be managed as asked."""


def version_of_image(ref: str) -> str:
    """``2.23.0.4`` of ``.../maca-c500:2.23.0.4-ubuntu18.04-amd64``; MacaLayoutError if the tag has none."""
    tag = ref.rsplit("/", 1)[-1].partition(":")[2]
    match = _TAG_VERSION.match(tag)
    if not match:
        raise MacaLayoutError("cannot read an MXMACA version from the image tag of %r" % ref)
    return match.group(1)


def check_version(version: str) -> str:
    if not _VERSION.match(version or ""):
        raise MacaLayoutError("%r is not an MXMACA version (like 2.23.0.4)" % version)
    return version


def dir_name(version: str) -> str:
    return PREFIX + check_version(version)


def version_key(version: str) -> Tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def installed_versions(names: Sequence[str]) -> List[str]:
    """The versions among directory names of /opt (``maca-2.23.0.4``), oldest first."""
    found = [n[len(PREFIX):] for n in names if n.startswith(PREFIX) and _VERSION.match(n[len(PREFIX):])]
    return sorted(found, key=version_key)


@dataclass(frozen=True)
class MacaPlan:
    install: bool                       # extract the payload into /opt/maca-<version>
    switch: bool                        # point /opt/maca at it
    remove: Tuple[str, ...] = ()        # versions whose directories go
    active_before: Optional[str] = None
    notes: List[str] = field(default_factory=list)


def plan(link_target: Optional[str], link_is_directory: bool, installed: Sequence[str], wanted: str,
         keep: int = 1) -> MacaPlan:
    """What installing and activating ``wanted`` takes.

    ``link_target``: where /opt/maca points now (None: no link);
    ``link_is_directory``: /opt/maca is a real directory (a MACA installed by
    other means): it is never replaced. ``keep``: how many other versions
    stay besides the active one (the previous ones, for running containers).
    """
    check_version(wanted)
    if link_is_directory:
        raise MacaLayoutError("%s is a directory, not a link made by metax.gpu: move it away (or to %s/%s) "
                              "before installing MXMACA with metax.gpu" % (MACA_LINK, "/opt", PREFIX + "<version>"))
    active = None
    if link_target is not None:
        name = link_target.rstrip("/").rsplit("/", 1)[-1]
        if name.startswith(PREFIX):
            active = name[len(PREFIX):]
    others = [v for v in installed if v != wanted]
    # kept first: the version switched away from (running containers mount it), then the newest
    ranked = ([active] if active in others else []) + sorted(
        (v for v in others if v != active), key=version_key, reverse=True)
    remove = tuple(sorted(ranked[max(keep, 0):], key=version_key))
    return MacaPlan(wanted not in installed, active != wanted, remove, active)
