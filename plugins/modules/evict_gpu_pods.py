#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
module: evict_gpu_pods
short_description: Evict the pods of a node that use MetaX GPUs, through the eviction API
version_added: 0.1.0
description:
  - Lists the pods on one node that request C(metax-tech.com/gpu) and evicts them with the Kubernetes eviction
    API, so PodDisruptionBudgets are honoured; waits until they are gone.
  - An eviction refused by a PodDisruptionBudget is retried until O(timeout); then O(force) deletes the pods,
    otherwise the module fails and names the pods left.
  - With O(drain) every pod of the node that is not a DaemonSet's or a static pod is evicted, not only GPU pods.
  - Step 3 of the manual's node maintenance procedure; used by the C(metax.gpu.driver_upgrade) playbook.
author:
  - MetaX GPU collection maintainers (@metax-gpu)
extends_documentation_fragment:
  - metax.gpu.k8s_auth
attributes:
  check_mode:
    support: full
    description: Returns the pods it would evict in RV(selected) and evicts nothing.
  diff_mode:
    support: none
    description: Pods are evicted, not edited; RV(evicted) lists them.
  platform:
    support: full
    platforms: posix
    description: Runs where the cluster's API server is reachable (the bastion).
options:
  node_name:
    description:
      - The Kubernetes node whose pods are evicted.
      - Must be a node name (a DNS subdomain); an empty name, which would select the unscheduled pods of the
        whole cluster, is refused.
    type: str
    required: true
  drain:
    description: Evict every pod of the node except DaemonSet and static pods.
    type: bool
    default: false
  timeout:
    description: Seconds to wait for the evicted pods to leave.
    type: int
    default: 300
  force:
    description: After O(timeout), delete the pods still there (grace period 0) instead of failing.
    type: bool
    default: false
  grace_period:
    description: Grace period in seconds given to the evicted pods; default each pod's own.
    type: int
seealso:
  - module: metax.gpu.driver
"""

EXAMPLES = r"""
- name: Evict the GPU pods of a node before a driver upgrade
  metax.gpu.evict_gpu_pods:
    node_name: gpu-node-3
    kubeconfig: /etc/kubernetes/admin.conf
    timeout: 120

- name: What would be evicted, from a bastion with a ServiceAccount token and no kubeconfig
  metax.gpu.evict_gpu_pods:
    node_name: gpu-node-3
    host: https://10.0.0.10:6443
    api_key: "{{ metax_token }}"
    ca_cert: /etc/metax/cluster-ca.crt
  check_mode: true
"""

RETURN = r"""
selected:
  description: Pods (namespace/name) chosen for eviction.
  returned: always
  type: list
  elements: str
  sample: [ml/train-0]
evicted:
  description: Pods evicted through the eviction API.
  returned: always
  type: list
  elements: str
  sample: [ml/train-0]
deleted:
  description: Pods deleted after the timeout because O(force) was set.
  returned: always
  type: list
  elements: str
  sample: []
"""

import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.metax.gpu.plugins.module_utils.common import K8S_AUTH_ARGSPEC, merged_spec
from ansible_collections.metax.gpu.plugins.module_utils.errors import MetaxGpuError
from ansible_collections.metax.gpu.plugins.module_utils.kube import client as kube

ARGUMENT_SPEC = {
    "node_name": {"type": "str", "required": True},
    "drain": {"type": "bool", "default": False},
    "timeout": {"type": "int", "default": 300},
    "force": {"type": "bool", "default": False},
    "grace_period": {"type": "int"},
}


def main():
    module = AnsibleModule(argument_spec=merged_spec(K8S_AUTH_ARGSPEC, ARGUMENT_SPEC), supports_check_mode=True)
    if not kube.HAS_KUBERNETES:
        module.fail_json(msg=missing_required_lib("kubernetes"), exception=traceback.format_exc())
    from ansible_collections.metax.gpu.plugins.module_utils.kube.evict import check_node_name, evict

    params = module.params
    try:
        check_node_name(params["node_name"])    # before any call: "" would select every unscheduled pod
        client, auth = kube.module_client(module)
        with kube.reaching(client, auth):
            result = evict(kube.core_v1(client), params["node_name"], drain=params["drain"], timeout=params["timeout"],
                           force=params["force"], check_mode=module.check_mode, grace_period=params["grace_period"])
    except (MetaxGpuError, kube.ApiException) as exc:
        module.fail_json(msg=str(exc))
    changed = bool(result["evicted"] or result["deleted"] or (module.check_mode and result["selected"]))
    module.exit_json(changed=changed, **result)


if __name__ == "__main__":
    main()
