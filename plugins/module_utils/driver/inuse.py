# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Is the MetaX driver in use? Open device nodes, the module refcount, GPU pods.

Unloading a driver under a running job crashes the job and, on the NVIDIA
operator, leaves the driver container in a "driver in use" crash loop. The
driver module asks three witnesses before it unloads anything:

* processes holding ``/dev/mxcd`` or a MetaX ``/dev/dri`` node open
  (``/proc/<pid>/fd`` under the host root);
* the kernel's own ``sys/module/metax/refcnt``;
* pods on the node that request ``metax-tech.com/gpu`` (when a pod list is
  available: the caller supplies it, this file has no Kubernetes client).
"""

from __future__ import annotations

import os
from typing import Iterable, List, Mapping, Set

from ..gpu.users import open_device_users as device_users
from ..host import HostRoot, HostRootError
from ..kube.pods import gpu_pods
from ..names import RESOURCE_NAME

DRIVER_NAME = "metax"


def metax_device_nodes(host: HostRoot) -> Set[str]:
    """Node paths of the MetaX control device and the DRM nodes of MetaX-bound GPUs."""
    nodes = {"/dev/mxcd"}
    for name in host.listdir("sys/class/drm"):
        if not (name.startswith("card") or name.startswith("renderD")) or "-" in name:
            continue
        try:
            drm_dir = host.realpath("sys/class/drm/" + name)
        except HostRootError:
            continue
        pci_dir = os.path.dirname(os.path.dirname(drm_dir)).lstrip("/")
        driver = host.readlink(pci_dir + "/driver")
        if driver and os.path.basename(driver.rstrip("/")) == DRIVER_NAME:
            nodes.add("/dev/dri/" + name)
    return nodes


def open_device_users(host: HostRoot) -> List[str]:
    """``"<pid> (<comm>): <device>"`` for every open MetaX device node under the host root."""
    return ["%s (%s): %s" % (u.pid, u.comm, u.node) for u in device_users(host, metax_device_nodes(host))]


def module_refcount(host: HostRoot) -> int:
    return host.read_int("sys/module/metax/refcnt", default=0)


def in_use(host: HostRoot, pods: Iterable[Mapping] = ()) -> List[str]:
    """Every reason the driver is in use (empty: free to unload)."""
    reasons = ["process %s" % user for user in open_device_users(host)]
    refcnt = module_refcount(host)
    if refcnt > 0:
        reasons.append("kernel module metax refcnt %d" % refcnt)
    reasons.extend("pod %s requests %s" % (pod, RESOURCE_NAME) for pod in gpu_pods(pods))
    return reasons
