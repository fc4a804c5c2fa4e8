# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Which pods hold MetaX GPUs: pure, over pod API objects as dicts.

The one definition shared by the eviction (:mod:`.evict`), the driver's
in-use check (``driver/inuse``) and the vfnum playbook's filter. Below both
``kube/`` and ``driver/``: it imports nothing of either.
"""

from __future__ import annotations

from typing import Iterable, List, Mapping

from ..names import RESOURCE_NAME

# Phases of a pod that holds nothing any more.
TERMINAL_PHASES = ("Succeeded", "Failed")


def requests_gpu(container: Mapping) -> bool:
    """Whether a container's limits or requests name ``metax-tech.com/gpu``."""
    resources = container.get("resources") or {}
    for section in ("limits", "requests"):
        if RESOURCE_NAME in (resources.get(section) or {}):
            return True
    return False


def gpu_pods(pods: Iterable[Mapping]) -> List[str]:
    """``namespace/name`` of running or pending pods that use ``metax-tech.com/gpu``.

    ``pods`` are API objects as dicts (``metadata``, ``spec``, ``status``),
    already limited to one node by the caller.
    """
    found = []
    for pod in pods:
        if (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
            continue
        spec = pod.get("spec") or {}
        containers = list(spec.get("containers") or []) + list(spec.get("initContainers") or [])
        if any(requests_gpu(c) for c in containers):
            meta = pod.get("metadata") or {}
            found.append("%s/%s" % (meta.get("namespace", "default"), meta.get("name", "?")))
    return sorted(found)
