# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The AnsibleModule of the collection's modules that talk to the API server (kube_list, evict_gpu_pods,
node_metadata): the shared kubeconfig option (doc fragment ``metax.gpu.kubeconfig``) and one clear
failure when the kubernetes package is missing."""

from __future__ import annotations

import traceback
from typing import Any, Dict

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ..common import KUBECONFIG_ARGSPEC, merged_spec
from .client import HAS_KUBERNETES


def kube_module(argument_spec: Dict[str, Any]) -> AnsibleModule:
    """An AnsibleModule (check mode supported) with ``kubeconfig`` added to ``argument_spec``."""
    module = AnsibleModule(argument_spec=merged_spec(KUBECONFIG_ARGSPEC, argument_spec), supports_check_mode=True)
    if not HAS_KUBERNETES:
        module.fail_json(msg=missing_required_lib("kubernetes"), exception=traceback.format_exc())
    return module
