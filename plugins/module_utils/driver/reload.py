# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Reload the MetaX driver as it is (unload, load, verify): the remediation ladder's step
(health/ladder.py), through the driver module's in-use-safe path.

The same witnesses as every unload of the driver module (backend.observe: the
processes holding a MetaX device, the module's refcount, the pods requesting
the GPU resource) and the same refusal (backend's DriverInUseError, never
forced): a reload under a running job would crash it. Nothing is installed;
the loaded module comes back as it was and is verified (its version,
/dev/mxcd, mx-smi). Standard library only.
"""

from __future__ import annotations

from typing import Optional, Sequence

from ..host import HostRoot
from ..names import RESOURCE_NAME
from . import backend
from .errors import DriverError


def reload_driver(host: HostRoot, cmds: backend.NodeCommands, gpu_pods: Sequence[str] = (),
                  load_command: Optional[Sequence[str]] = None) -> str:
    """Unload and load the driver, then verify it; what was done, as a sentence. ``gpu_pods``:
    ``namespace/name`` of the pods holding the node's GPUs (NodeApi.gpu_pods), each a reason to refuse.

    Raises backend.DriverInUseError (nothing done) while the driver is in use, DriverError when
    there is no driver or a command fails, backend.DriverVerifyError when it does not come back.
    """
    request = backend.Request(load_command=tuple(load_command or backend.DEFAULT_LOAD))
    seen = backend.observe(host, cmds, request)
    if seen.loaded_version is not None:
        seen.in_use.extend("pod %s requests %s" % (pod, RESOURCE_NAME) for pod in gpu_pods)
    if seen.loaded_version is None and not seen.installed:
        raise DriverError("no MetaX driver on the node: nothing to reload")
    steps = ["unload", "load"] if seen.loaded_version is not None else ["load"]
    plan = backend.Plan(steps=steps, from_version=seen.version, to_version=seen.version,
                        reason="reload driver %s" % (seen.loaded_version or seen.version),
                        needs_unload=seen.loaded_version is not None, from_driver=seen.loaded_version,
                        to_driver=seen.loaded_version)
    backend.refuse_in_use(request, seen, plan)
    backend.apply(host, cmds, request, seen, plan)
    checks = backend.verify(host, cmds, seen.loaded_version)
    return "driver %s %s, verified" % (checks.get("loaded_version"), "reloaded" if plan.needs_unload else "loaded")
