#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
module: kube_list
short_description: List Kubernetes objects page by page
version_added: 0.1.0
description:
  - Reads every object of a kind (optionally in one namespace, matching selectors) with paginated list calls
    (C(limit) and C(continue)), O(page_size) objects per request, and returns them as one list in
    RV(resources), as C(kubernetes.core.k8s_info) does.
  - C(kubernetes.core.k8s_info) reads the whole list in one response; on a cluster of thousands of nodes that
    answer is tens of MiB. The collection's playbooks use this module for the lists that grow with the
    cluster (nodes, pods of every namespace); see docs/scale.md.
  - A continue token that expired while the list was read (HTTP 410, etcd compacted past it) makes the module
    read the list again from its first page, so RV(resources) is always one snapshot.
author:
  - MetaX GPU collection maintainers (@metax-gpu)
extends_documentation_fragment:
  - metax.gpu.kubeconfig
attributes:
  check_mode:
    support: full
    description: Only reads; the same in check mode.
  diff_mode:
    support: none
    description: Changes nothing.
  platform:
    support: full
    platforms: posix
    description: Runs where the cluster's API server is reachable (the bastion).
options:
  api_version:
    description: API group and version of the kind, as in a manifest.
    type: str
    default: v1
  kind:
    description: The kind to list.
    type: str
    required: true
  namespace:
    description: List in this namespace only; default every namespace (or the cluster-scoped kind).
    type: str
  label_selectors:
    description: Label selectors, joined with commas (all must match), as in C(kubernetes.core.k8s_info).
    type: list
    elements: str
    default: []
  field_selectors:
    description: Field selectors, joined with commas (all must match), as in C(kubernetes.core.k8s_info).
    type: list
    elements: str
    default: []
  page_size:
    description: Objects per list request (the C(limit) parameter); at least 1.
    type: int
    default: 500
seealso:
  - module: kubernetes.core.k8s_info
"""

EXAMPLES = r"""
- name: Read every node, 500 per request
  metax.gpu.kube_list:
    kind: Node
    kubeconfig: /etc/kubernetes/admin.conf
  register: nodes

- name: The pods still running, every namespace
  metax.gpu.kube_list:
    kind: Pod
    field_selectors:
      - status.phase!=Succeeded
      - status.phase!=Failed
    page_size: 250
  register: pods
"""

RETURN = r"""
resources:
  description: The objects, as the API returns them.
  returned: always
  type: list
  elements: dict
  sample: [{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-node-1"}}]
pages:
  description: List requests made (a restart after an expired continue token included).
  returned: always
  type: int
  sample: 4
restarts:
  description: Times the list was read again from its first page after an expired continue token.
  returned: always
  type: int
  sample: 0
resource_version:
  description: The resourceVersion of the snapshot the objects come from.
  returned: always
  type: str
  sample: "48213"
"""

import json
import re
import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.metax.gpu.plugins.module_utils.common import KUBECONFIG_ARGSPEC, merged_spec
from ansible_collections.metax.gpu.plugins.module_utils.errors import MetaxGpuError
from ansible_collections.metax.gpu.plugins.module_utils.kube import client as kube
from ansible_collections.metax.gpu.plugins.module_utils.kube.pages import list_all, query

ARGUMENT_SPEC = {
    "api_version": {"type": "str", "default": "v1"},
    "kind": {"type": "str", "required": True},
    "namespace": {"type": "str"},
    "label_selectors": {"type": "list", "elements": "str", "default": []},
    "field_selectors": {"type": "list", "elements": "str", "default": []},
    "page_size": {"type": "int", "default": 500},
}
# group/version as the API server serves it (a DNS subdomain, then v1, v1beta2...): checked before discovery,
# whose client splits on "/" and ends in a traceback on anything else
API_VERSION = re.compile(r"^(?:[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?/)?v[0-9]+(?:(?:alpha|beta)[0-9]+)?$")


def main():
    module = AnsibleModule(argument_spec=merged_spec(KUBECONFIG_ARGSPEC, ARGUMENT_SPEC), supports_check_mode=True)
    if not kube.HAS_KUBERNETES:
        module.fail_json(msg=missing_required_lib("kubernetes"), exception=traceback.format_exc())
    from kubernetes.dynamic import DynamicClient
    from kubernetes.dynamic.exceptions import ResourceNotFoundError

    params = module.params
    try:
        if params["page_size"] < 1:
            raise MetaxGpuError("page_size must be at least 1, not %d" % params["page_size"])
        if not API_VERSION.match(params["api_version"]):
            raise MetaxGpuError("api_version %r is not a Kubernetes group/version such as v1 or apps/v1"
                                % params["api_version"])
        client = kube.api_client(params["kubeconfig"])
        selectors = query(params["label_selectors"], params["field_selectors"])
        with kube.reaching(client, params["kubeconfig"]):
            # the discovery below is the first call to the API server
            dynamic = DynamicClient(client)
            resource = dynamic.resources.get(api_version=params["api_version"], kind=params["kind"])

            def fetch(limit, token):
                # serialize=False: the raw answer decoded once, not wrapped field by field (2,000 Nodes)
                resp = resource.get(namespace=params["namespace"], limit=limit, _continue=token, serialize=False,
                                    **selectors)
                return json.loads(resp.data)

            listing = list_all(fetch, params["page_size"])
    except ResourceNotFoundError as exc:
        module.fail_json(msg="%s/%s: %s" % (params["api_version"], params["kind"], exc))
    except (MetaxGpuError, kube.ApiException) as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, resources=listing.items, pages=listing.pages, restarts=listing.restarts,
                     resource_version=listing.resource_version)


if __name__ == "__main__":
    main()
