#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
module: node_maintenance
short_description: Pause and resume a GPU node for maintenance, with the owning procedure recorded
version_added: 0.1.0
description:
  - The one node-maintenance protocol of the collection (docs/maintenance.md), used by the C(metax.gpu.set_vfnum)
    and C(metax.gpu.driver_upgrade) roles; driver-manager and the health ladder run the same Python.
  - O(state=paused) holds the node for O(owner) (annotation C(metax-tech.com/maintenance.owner)), cordons it when
    O(cordon) (recording in C(metax-tech.com/maintenance.cordon) whether the cordon is ours or was the
    administrator's), pauses the node agents when O(pause_agents) (label C(metax-tech.com/agents.paused), which
    the charts' affinity keeps gpu-device and gpu-label off) and waits up to O(agents_timeout) for their pods to
    leave, then evicts the GPU pods through the eviction API when O(evict).
  - O(state=paused) with O(pause_agents=false) on a node already held un-pauses the agents and keeps the hold and
    the cordon (the driver upgrade validates that way).
  - O(state=resumed) releases the hold, un-pauses the agents and uncordons the node only if the hold cordoned it;
    an administrator's cordon is kept. With O(uncordon=false) the cordon (and its record) stays, as for a node
    left failed. A node that nobody holds is not uncordoned; only O(procedure_state) and O(procedure_message) are written.
  - A node held by another owner is refused, in both states, with a message naming the holder; nothing is changed.
  - O(procedure_state) and O(procedure_message) write the owner's own state label and message annotation in the same patch
    (C(metax-tech.com/driver.upgrade-state) and C(metax-tech.com/driver.upgrade.message) for C(driver-upgrade),
    C(metax-tech.com/gpu.vfnum.state) and C(metax-tech.com/gpu.vfnum.message) for C(set-vfnum)); an empty string
    removes them.
author:
  - MetaX GPU collection maintainers (@metax-gpu)
extends_documentation_fragment:
  - metax.gpu.k8s_auth
attributes:
  check_mode:
    support: full
    description: Plans the patch and the pods it would evict (RV(selected)); writes, waits and evicts nothing.
  diff_mode:
    support: full
    description: Before and after of the keys (and the cordon) the patch changes.
  platform:
    support: full
    platforms: posix
    description: Runs where the cluster's API server is reachable (the bastion).
options:
  node_name:
    description: The Kubernetes node (a DNS subdomain).
    type: str
    required: true
  owner:
    description: The procedure that holds the node.
    type: str
    required: true
    choices: [driver-upgrade, set-vfnum, driver-manager, health, device-mode]
  state:
    description: C(paused) holds the node, C(resumed) releases it.
    type: str
    choices: [paused, resumed]
    default: paused
  cordon:
    description: With O(state=paused), cordon the node (an existing cordon is recorded as the administrator's).
      False never uncordons.
    type: bool
    default: true
  pause_agents:
    description: With O(state=paused), pause the node agents and wait for their pods to leave; false un-pauses
      them (the hold stays).
    type: bool
    default: true
  uncordon:
    description: With O(state=resumed), lift the cordon the hold made; false keeps it, recorded.
    type: bool
    default: true
  procedure_state:
    description: The value of O(owner)'s state label to write in the same patch; an empty string removes the
      label. Only for owners with a state label (C(driver-upgrade), C(set-vfnum)).
    type: str
  procedure_message:
    description: The value of O(owner)'s message annotation to write in the same patch; an empty string removes it.
    type: str
  namespace:
    description: Namespace of the node agents' pods (the GPU Extensions release) that O(pause_agents) waits for.
    type: str
    default: metax-gpu
  remove_agent_labels:
    description: With O(state=paused), remove the C(metax-tech.com/) labels the node agents publish (all but the
      day-two labels, that is the procedures' states and the pause), as the manual's node maintenance does. Run it once
      the agents have left (O(pause_agents)), else gpu-label puts them back.
    type: bool
    default: false
  wait_agents:
    description: With O(pause_agents), wait for the agents' pods to leave the node (false, to pause a batch of
      nodes first and wait for them all in a second run).
    type: bool
    default: true
  agents_timeout:
    description: Seconds to wait for the paused agents' pods to leave the node.
    type: int
    default: 300
  poll_delay:
    description: Seconds between looks while waiting for the agents.
    type: int
    default: 2
  evict:
    description: With O(state=paused), evict the pods that request C(metax-tech.com/gpu) (PodDisruptionBudgets hold).
    type: bool
    default: false
  drain:
    description: Evict every pod of the node except DaemonSet and static pods, not only GPU pods.
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
seealso:
  - module: metax.gpu.evict_gpu_pods
"""

EXAMPLES = r"""
- name: Hold gpu-node-3 for a health check, cordon it, pause its agents, evict its GPU pods
  metax.gpu.node_maintenance:
    node_name: gpu-node-3
    owner: health
    evict: true
    agents_timeout: 120
    kubeconfig: /etc/kubernetes/admin.conf

- name: Give it back (an administrator's cordon stays)
  metax.gpu.node_maintenance:
    node_name: gpu-node-3
    owner: health
    state: resumed

- name: Would set_vfnum's pause be refused? (check mode changes nothing)
  metax.gpu.node_maintenance:
    node_name: gpu-node-3
    owner: set-vfnum
    cordon: false
  check_mode: true
"""

RETURN = r"""
node:
  description: The node.
  returned: always
  type: str
  sample: gpu-node-3
owner:
  description: O(owner).
  returned: always
  type: str
  sample: health
held_by:
  description: Who held the node before this run (null when nobody did).
  returned: always
  type: str
  sample: null
patch:
  description: The merge patch written (in check mode, that would be written); empty when nothing changes.
  returned: always
  type: dict
  sample: {"metadata": {"annotations": {"metax-tech.com/maintenance.owner": "health"}}}
cordon_kept:
  description: The node stays cordoned by a cordon that is not the hold's (the administrator's), or on request.
  returned: always
  type: bool
  sample: false
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
  description: Pods deleted after O(evict_timeout) because O(evict_force) was set.
  returned: always
  type: list
  elements: str
  sample: []
agents_wait:
  description: Seconds the paused agents' pods took to leave.
  returned: always
  type: float
  sample: 4.2
"""

import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.metax.gpu.plugins.module_utils import names
from ansible_collections.metax.gpu.plugins.module_utils.common import K8S_AUTH_ARGSPEC, merged_spec
from ansible_collections.metax.gpu.plugins.module_utils.errors import MetaxGpuError
from ansible_collections.metax.gpu.plugins.module_utils.kube import client as kube

ARGUMENT_SPEC = {
    "node_name": {"type": "str", "required": True},
    "owner": {"type": "str", "required": True, "choices": list(names.MAINTENANCE_OWNERS)},
    "state": {"type": "str", "choices": ["paused", "resumed"], "default": "paused"},
    "cordon": {"type": "bool", "default": True},
    "pause_agents": {"type": "bool", "default": True},
    "uncordon": {"type": "bool", "default": True},
    "procedure_state": {"type": "str"},
    "procedure_message": {"type": "str"},
    "namespace": {"type": "str", "default": names.NAMESPACE},
    "remove_agent_labels": {"type": "bool", "default": False},
    "wait_agents": {"type": "bool", "default": True},
    "agents_timeout": {"type": "int", "default": 300},
    "poll_delay": {"type": "int", "default": 2},
    "evict": {"type": "bool", "default": False},
    "drain": {"type": "bool", "default": False},
    "evict_timeout": {"type": "int", "default": 300},
    "evict_force": {"type": "bool", "default": False},
}


def main():
    module = AnsibleModule(argument_spec=merged_spec(K8S_AUTH_ARGSPEC, ARGUMENT_SPEC), supports_check_mode=True)
    if not kube.HAS_KUBERNETES:
        module.fail_json(msg=missing_required_lib("kubernetes"), exception=traceback.format_exc())
    from ansible_collections.metax.gpu.plugins.module_utils import maintenance
    from ansible_collections.metax.gpu.plugins.module_utils.kube.evict import check_node_name

    params = module.params
    try:
        check_node_name(params["node_name"])        # before any call
        for option in ("agents_timeout", "evict_timeout"):
            if params[option] < 0:
                raise MetaxGpuError("%s must not be negative (got %d)" % (option, params[option]))
        if params["poll_delay"] < 1:
            raise MetaxGpuError("poll_delay must be at least 1 (got %d)" % params["poll_delay"])
        client, auth = kube.module_client(module)
        api = maintenance.KubeMaintenanceApi(kube.core_v1(client), params["namespace"])
        with kube.reaching(client, auth):
            if params["state"] == "paused":
                evict = maintenance.Eviction(timeout=params["evict_timeout"], force=params["evict_force"],
                                             drain=params["drain"]) if params["evict"] else None
                outcome = maintenance.pause(
                    api, params["node_name"], params["owner"], cordon=params["cordon"],
                    pause_agents=params["pause_agents"], procedure_state=params["procedure_state"],
                    message=params["procedure_message"], remove_agent_labels=params["remove_agent_labels"], evict=evict,
                    wait_agents=params["wait_agents"],
                    agents_timeout=params["agents_timeout"],
                    poll=params["poll_delay"], check_mode=module.check_mode)
            else:
                outcome = maintenance.resume(api, params["node_name"], params["owner"], uncordon=params["uncordon"],
                                             procedure_state=params["procedure_state"], message=params["procedure_message"],
                                             check_mode=module.check_mode)
    except (MetaxGpuError, kube.ApiException) as exc:
        module.fail_json(msg=str(exc))
    result = outcome.as_dict()
    result["changed"] = outcome.changed or bool(module.check_mode and result["selected"])
    if module._diff:
        result["diff"] = {"before": outcome.change.before, "after": outcome.change.after}
    module.exit_json(**result)


if __name__ == "__main__":
    main()
