#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_device_mode
short_description: Switch a GPU node between the device plugin and DRA, never served by both
version_added: 0.1.0
description:
  - Sets the node label C(metax-tech.com/gpu.device-mode) that decides whether the node's MetaX GPUs are served by
    the device plugin (gpu-device, extended resource C(metax-tech.com/gpu)) or by the DRA driver
    (gpu-dra, ResourceSlices of C(gpu.metax-tech.com)); docs/dra.md, "Switching a node".
  - Refuses, changing nothing, while pods hold the node's GPUs, unless O(evict=true), the rule of the vfnum path.
    Holders are the pods that request C(metax-tech.com/gpu) and the pods a ResourceClaim allocated from the
    node's pool is reserved for.
  - The switch goes through the one node-maintenance protocol (owner C(device-mode), docs/maintenance.md). It holds
    and cordons the node and evicts the holders through the eviction API while the old agent still serves, so
    that DRA claims are unprepared. It then pauses the node agents and waits until gpu-device and gpu-dra have
    left, deletes what is left of the node's pool, and waits until neither mode serves the node. Then it writes
    the label and releases the hold; only the new mode's agent comes back.
  - A node already in O(mode) is left alone (a hold a failed earlier run left is released).
  - A node held by another procedure is refused, naming the holder; nothing is changed.
author:
  - MetaX GPU collection maintainers (@metax-gpu)
extends_documentation_fragment:
  - metax.gpu.k8s_auth
attributes:
  check_mode:
    support: full
    description: Reports the mode change and the pods it would evict (RV(selected)); refuses as the real run would.
  diff_mode:
    support: full
    description: The node's mode before and after.
  platform:
    support: full
    platforms: posix
    description: Runs where the cluster's API server is reachable (the bastion).
options:
  node_name:
    description: The Kubernetes node (a DNS subdomain).
    type: str
    required: true
  mode:
    description:
      - V(dra) serves the node's GPUs through gpu-dra, V(device-plugin) through gpu-device. The label is written
        with either value; gpu-dra serves only a node labelled V(dra).
    type: str
    required: true
    choices: [device-plugin, dra]
  evict:
    description:
      - Evict the pods holding the node's GPUs (PodDisruptionBudgets hold) instead of refusing the switch.
    type: bool
    default: false
  evict_timeout:
    description: Seconds the evicted pods have to leave.
    type: int
    default: 300
  evict_force:
    description: After O(evict_timeout), delete the pods still there instead of failing.
    type: bool
    default: false
  timeout:
    description:
      - Seconds to wait for the agents to leave and for the old mode to stop serving the node (the kubelet reports
        a gone device plugin's allocatable 0 at its next node-status update, about 10 s).
    type: int
    default: 300
  poll_delay:
    description: Seconds between looks while waiting.
    type: int
    default: 2
  namespace:
    description:
      - Namespace of the node agents' pods, whose leaving the switch waits for (the GPU Extensions release's;
        in the GPU Operator scheme the operator's, C(metax-operator) by default).
    type: str
    default: metax-gpu
notes:
  - On failure after the hold (an eviction refused past its timeout, the agents not leaving) the node stays held
    (C(metax-tech.com/maintenance.owner=device-mode)), cordoned and in its old mode; running the module again
    finishes the switch.
seealso:
  - module: metax.gpu.node_maintenance
  - module: metax.gpu.evict_gpu_pods
  - name: DRA documentation
    description: The DRA driver, one mode per node and the switch.
    link: https://example.invalid/metax/gpu/docs/dra.md
"""

EXAMPLES = r"""
- name: Serve gpu-node-3 through DRA (refused while pods use its GPUs)
  metax.gpu.gpu_device_mode:
    node_name: gpu-node-3
    mode: dra
    kubeconfig: /etc/kubernetes/admin.conf

- name: Back to the device plugin, evicting the pods that hold its GPUs
  metax.gpu.gpu_device_mode:
    node_name: gpu-node-3
    mode: device-plugin
    evict: true
    evict_timeout: 120

- name: What would switching evict?
  metax.gpu.gpu_device_mode:
    node_name: gpu-node-3
    mode: dra
    evict: true
  check_mode: true
  diff: true
"""

RETURN = r"""
node:
  description: The node.
  returned: always
  type: str
  sample: gpu-node-3
mode_before:
  description: The node's mode before the run (C(device-plugin) unless the label said C(dra)).
  returned: success
  type: str
  sample: device-plugin
mode:
  description: The node's mode after the run (in check mode, after the switch).
  returned: success
  type: str
  sample: dra
in_use:
  description: Pods (namespace/name) that held the node's GPUs; on refusal, those in the way.
  returned: always
  type: list
  elements: str
  sample: [ml/train-0]
selected:
  description: Pods chosen for eviction.
  returned: success
  type: list
  elements: str
  sample: [ml/train-0]
evicted:
  description: Pods evicted through the eviction API.
  returned: success
  type: list
  elements: str
  sample: [ml/train-0]
deleted:
  description: Pods deleted after O(evict_timeout) because O(evict_force) was set.
  returned: success
  type: list
  elements: str
  sample: []
slices_deleted:
  description: ResourceSlices of the node's pool deleted once gpu-dra had left.
  returned: success
  type: list
  elements: str
  sample: [gpu-node-3-gpu.metax-tech.com-0]
waited:
  description: Seconds from the hold until neither mode served the node.
  returned: success
  type: float
  sample: 12.4
"""

import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.metax.gpu.plugins.module_utils import names
from ansible_collections.metax.gpu.plugins.module_utils.common import K8S_AUTH_ARGSPEC, merged_spec
from ansible_collections.metax.gpu.plugins.module_utils.dra.switch import MODES, SwitchRefused
from ansible_collections.metax.gpu.plugins.module_utils.errors import MetaxGpuError
from ansible_collections.metax.gpu.plugins.module_utils.kube import client as kube

ARGUMENT_SPEC = {
    "node_name": {"type": "str", "required": True},
    "mode": {"type": "str", "required": True, "choices": list(MODES)},
    "evict": {"type": "bool", "default": False},
    "evict_timeout": {"type": "int", "default": 300},
    "evict_force": {"type": "bool", "default": False},
    "timeout": {"type": "int", "default": 300},
    "poll_delay": {"type": "int", "default": 2},
    "namespace": {"type": "str", "default": names.NAMESPACE},
}


def main():
    module = AnsibleModule(argument_spec=merged_spec(K8S_AUTH_ARGSPEC, ARGUMENT_SPEC), supports_check_mode=True)
    if not kube.HAS_KUBERNETES:
        module.fail_json(msg=missing_required_lib("kubernetes"), exception=traceback.format_exc())
    from ansible_collections.metax.gpu.plugins.module_utils.dra import switch_run
    from ansible_collections.metax.gpu.plugins.module_utils.kube.evict import check_node_name
    from ansible_collections.metax.gpu.plugins.module_utils.maintenance import Eviction

    params = module.params
    node = params["node_name"]
    try:
        check_node_name(node)        # before any call
        for option in ("evict_timeout", "timeout"):
            if params[option] < 0:
                raise MetaxGpuError("%s must not be negative (got %d)" % (option, params[option]))
        if params["poll_delay"] < 1:
            raise MetaxGpuError("poll_delay must be at least 1 (got %d)" % params["poll_delay"])
        client, auth = kube.module_client(module)
        api = switch_run.KubeSwitchApi(client, kube.core_v1(client), params["namespace"])
        evict = Eviction(timeout=params["evict_timeout"], force=params["evict_force"]) if params["evict"] else None
        with kube.reaching(client, auth):
            outcome = switch_run.switch(api, node, params["mode"], evict=evict, timeout=params["timeout"],
                                        poll=params["poll_delay"], check_mode=module.check_mode)
    except SwitchRefused as exc:
        module.fail_json(msg=str(exc), node=node, in_use=exc.holders)
    except (MetaxGpuError, kube.ApiException) as exc:
        module.fail_json(msg=str(exc), node=node, in_use=[])
    result = outcome.as_dict()
    result["changed"] = outcome.changed
    if module._diff:
        result["diff"] = outcome.plan.diff()
    module.exit_json(**result)


if __name__ == "__main__":
    main()
