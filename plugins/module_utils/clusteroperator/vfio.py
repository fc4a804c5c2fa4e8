# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The ClusterOperator's condition about GPUs for virtual machines (issue 43): pure, no I/O.

``IOMMUDisabled`` names every GPU node whose vfio-manager found no IOMMU
(its annotation ``metax-tech.com/vfio.iommu: disabled``): the vendor's
vfio-manager crash-loops there and the administrator finds out from the pod's
restarts; ours stays up, and the CR says which nodes cannot give GPUs to VMs.
Only while the vfioManager component is deployed.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping

from .. import names
from .components import VFIO_MANAGER
from .contract import deployed

CONDITION = "IOMMUDisabled"


def nodes_without_iommu(nodes: Iterable[Mapping[str, Any]]) -> List[str]:
    """The nodes whose vfio-manager reported no IOMMU, sorted."""
    out = []
    for node in nodes:
        meta = node.get("metadata") or {}
        if (meta.get("annotations") or {}).get(names.ANNOTATION_VFIO_IOMMU) == "disabled":
            out.append(str(meta.get("name")))
    return sorted(out)


def vfio_conditions(spec: Mapping[str, Any], nodes: Iterable[Mapping[str, Any]]) -> List[Dict[str, str]]:
    """``[IOMMUDisabled]`` while vfio-manager is deployed ([] otherwise): True naming the nodes."""
    if not deployed(VFIO_MANAGER, spec):
        return []
    missing = nodes_without_iommu(nodes)
    if not missing:
        return [{"type": CONDITION, "status": "False", "reason": "IOMMUEnabled",
                 "message": "every node vfio-manager runs on has IOMMU"}]
    shown = ", ".join(missing[:10]) + (" and %d more" % (len(missing) - 10) if len(missing) > 10 else "")
    return [{"type": CONDITION, "status": "True", "reason": CONDITION,
             "message": "IOMMU support is missing on node(s) %s: their GPUs cannot be given to virtual machines "
                        "(metax-tech.com/vfio-gpu 0); enable IOMMU in the firmware and the kernel command line "
                        "(intel_iommu=on or amd_iommu=on). Their container GPUs are not affected." % shown}]
