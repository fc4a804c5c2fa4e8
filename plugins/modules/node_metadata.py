#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
module: node_metadata
short_description: Remove the labels and annotations under one prefix from every node
version_added: 0.1.0
description:
  - Reads the nodes page by page and removes, with one JSON merge patch per node, every label and annotation whose
    key starts with O(prefix). Nodes without such keys are not written.
  - Used by the C(metax.gpu.uninstall) role to remove what the agents wrote (C(metax-tech.com/)); on a cluster
    of thousands of nodes that is one module call, not one task per node.
  - Kubernetes' own prefixes (C(kubernetes.io/), C(k8s.io/) and their subdomains) are refused, as is anything
    that is not one DNS subdomain followed by C(/); the module then fails and changes nothing.
author:
  - MetaX GPU collection maintainers (@metax-gpu)
extends_documentation_fragment:
  - metax.gpu.k8s_auth
attributes:
  check_mode:
    support: full
    description: Returns the keys it would remove in RV(nodes) and writes nothing.
  diff_mode:
    support: full
    description: Before, the removed keys with their values, per node; after, none of them.
  platform:
    support: full
    platforms: posix
    description: Runs where the cluster's API server is reachable (the bastion).
options:
  prefix:
    description: Labels and annotations whose key starts with this are removed, for example C(metax-tech.com/).
    type: str
    required: true
  state:
    description: C(absent), the only state, removes the keys.
    type: str
    choices: [absent]
    default: absent
  label_selectors:
    description: Only the nodes matching these label selectors (all must match), as in C(kubernetes.core.k8s_info).
    type: list
    elements: str
    default: []
  page_size:
    description: Nodes per list request; at least 1.
    type: int
    default: 500
seealso:
  - module: metax.gpu.kube_list
"""

EXAMPLES = r"""
- name: Remove the labels and annotations the MetaX agents wrote on every node
  metax.gpu.node_metadata:
    prefix: metax-tech.com/
    kubeconfig: /etc/kubernetes/admin.conf

- name: What would go from the GPU nodes only (check mode, with diff)
  metax.gpu.node_metadata:
    prefix: metax-tech.com/
    label_selectors:
      - metax-tech.com/gpu.installed=true
    host: https://10.0.0.10:6443
    api_key: "{{ metax_token }}"
    ca_cert: /etc/metax/cluster-ca.crt
  check_mode: true
  diff: true
"""

RETURN = r"""
nodes:
  description: The nodes that carried keys under O(prefix), with the keys removed (or, in check mode, to remove).
  returned: always
  type: list
  elements: dict
  sample: [{"name": "gpu-node-1", "labels": ["metax-tech.com/gpu.product"], "annotations": []}]
examined:
  description: Nodes read.
  returned: always
  type: int
  sample: 2000
"""

import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.metax.gpu.plugins.module_utils.common import K8S_AUTH_ARGSPEC, merged_spec
from ansible_collections.metax.gpu.plugins.module_utils.errors import MetaxGpuError
from ansible_collections.metax.gpu.plugins.module_utils.kube import client as kube
from ansible_collections.metax.gpu.plugins.module_utils.kube.node import strip
from ansible_collections.metax.gpu.plugins.module_utils.kube.node_metadata import check_prefix, diff
from ansible_collections.metax.gpu.plugins.module_utils.kube.pages import query, raw_list

ARGUMENT_SPEC = {
    "prefix": {"type": "str", "required": True},
    "state": {"type": "str", "choices": ["absent"], "default": "absent"},
    "label_selectors": {"type": "list", "elements": "str", "default": []},
    "page_size": {"type": "int", "default": 500},
}


def main():
    module = AnsibleModule(argument_spec=merged_spec(K8S_AUTH_ARGSPEC, ARGUMENT_SPEC), supports_check_mode=True)
    if not kube.HAS_KUBERNETES:
        module.fail_json(msg=missing_required_lib("kubernetes"), exception=traceback.format_exc())
    params = module.params
    done = []
    try:
        prefix = check_prefix(params["prefix"])
        if params["page_size"] < 1:
            raise MetaxGpuError("page_size must be at least 1, not %d" % params["page_size"])
        client, auth = kube.module_client(module)
        core = kube.core_v1(client)
        selectors = query(params["label_selectors"])
        with kube.reaching(client, auth):
            listing = raw_list(core.list_node, page_size=params["page_size"], **selectors)
            strip(core, listing.items, [prefix], [prefix], check_mode=module.check_mode, done=done)
    except (MetaxGpuError, kube.ApiException) as exc:
        # the nodes patched before the failure are reported: a rerun finishes the rest
        module.fail_json(msg=str(exc), nodes=_report(done), changed=bool(done) and not module.check_mode)
    result = {"changed": bool(done), "nodes": _report(done), "examined": len(listing.items)}
    if module._diff:
        result["diff"] = diff(done)
    module.exit_json(**result)


def _report(done):
    return [{"name": c.name, "labels": sorted(c.labels), "annotations": sorted(c.annotations)} for c in done]


if __name__ == "__main__":
    main()
