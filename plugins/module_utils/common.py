# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Argument specs shared by the node-side modules (kept next to the doc fragments)."""

from __future__ import annotations

import copy
from typing import Any, Dict

HOST_ROOT_ARGSPEC = {
    "host_root": {"type": "path", "default": "/"},
}

# The controller-side modules that talk to the API server (doc fragment metax.gpu.kubeconfig).
KUBECONFIG_ARGSPEC = {
    "kubeconfig": {"type": "path"},
}


def merged_spec(*specs: Dict[str, Any]) -> Dict[str, Any]:
    """One module's argument spec from shared ones and its own (deep copies: AnsibleModule mutates them)."""
    out: Dict[str, Any] = {}
    for spec in specs:
        out.update(copy.deepcopy(spec))
    return out
