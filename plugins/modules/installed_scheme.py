#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
module: installed_scheme
short_description: Find which MetaX GPU scheme is installed on a cluster
version_added: 0.1.0
description:
  - Reads the ClusterOperator objects and the DaemonSets of every namespace (page by page). With the helm releases
    given in O(releases), it returns which of the manual's two schemes is installed, GPU Extensions (section 2) or
    GPU Operator (section 3).
  - With O(wanted), RV(refusal) says why that scheme may not be installed. It may not when the other one is found,
    because two device plugins must never register C(metax-tech.com/gpu) on one node. The module only reports this;
    the C(metax.gpu.scheme_check) role fails on it.
  - One module run for what the role read before with two C(kubernetes.core.k8s_info) tasks.
  - A cluster without the ClusterOperator CRD has no ClusterOperator objects; that is not an error.
author:
  - MetaX GPU collection maintainers (@metax-gpu)
extends_documentation_fragment:
  - metax.gpu.k8s_auth
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
  releases:
    description:
      - The rows of C(helm list --all-namespaces --all --output json), as a list.
      - Each row's C(name), C(namespace), C(chart) and C(status) are read; other keys are ignored.
    type: list
    elements: dict
    default: []
  wanted:
    description:
      - The scheme about to be installed. RV(refusal) then says why it may not be.
      - Without it, RV(refusal) is empty.
    type: str
    choices: [extensions, operator]
  page_size:
    description: Objects per list request; at least 1.
    type: int
    default: 500
seealso:
  - module: metax.gpu.kube_list
"""

EXAMPLES = r"""
- name: List the helm releases of every namespace
  ansible.builtin.command:
    argv: [helm, list, --all-namespaces, --all, --output, json]
  register: helm_list
  changed_when: false

- name: Which scheme is installed?
  metax.gpu.installed_scheme:
    releases: "{{ helm_list.stdout | from_json }}"
    wanted: operator
    kubeconfig: /etc/kubernetes/admin.conf
  register: scheme
  failed_when: scheme.refusal | length > 0
"""

RETURN = r"""
found:
  description: For each scheme, what on the cluster shows it is installed (empty lists when nothing does).
  returned: always
  type: dict
  sample: {"extensions": ["helm release metax-gpu/metax-gpu-extensions (chart metax-gpu-extensions, deployed)",
                          "DaemonSet metax-gpu/metax-gpu-device"], "operator": []}
refusal:
  description: Why O(wanted) may not be installed, naming the uninstall step; empty when it may, or without O(wanted).
  returned: always
  type: str
  sample: ""
"""

import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.metax.gpu.plugins.module_utils import names as N
from ansible_collections.metax.gpu.plugins.module_utils.common import K8S_AUTH_ARGSPEC, merged_spec
from ansible_collections.metax.gpu.plugins.module_utils.errors import MetaxGpuError
from ansible_collections.metax.gpu.plugins.module_utils.kube import client as kube
from ansible_collections.metax.gpu.plugins.module_utils.kube.pages import raw_list
from ansible_collections.metax.gpu.plugins.module_utils.scheme import SCHEMES, installed_schemes, scheme_refusal

ARGUMENT_SPEC = {
    "releases": {"type": "list", "elements": "dict", "default": []},
    "wanted": {"type": "str", "choices": list(SCHEMES)},
    "page_size": {"type": "int", "default": 500},
}


def read_cluster(client, page_size):
    """The ClusterOperator objects (none without their CRD) and the DaemonSets of every namespace."""
    api = kube.json_api(client)
    try:
        operators = raw_list(api.list_cluster_custom_object, N.OPERATOR_GROUP, N.OPERATOR_VERSION, N.OPERATOR_PLURAL,
                             page_size=page_size).items
    except kube.ApiException as exc:
        if getattr(exc, "status", None) != 404:
            raise
        operators = []
    return operators, raw_list(api.list_daemon_set_for_all_namespaces, page_size=page_size).items


def main():
    module = AnsibleModule(argument_spec=merged_spec(K8S_AUTH_ARGSPEC, ARGUMENT_SPEC), supports_check_mode=True)
    if not kube.HAS_KUBERNETES:
        module.fail_json(msg=missing_required_lib("kubernetes"), exception=traceback.format_exc())
    params = module.params
    try:
        if params["page_size"] < 1:
            raise MetaxGpuError("page_size must be at least 1, not %d" % params["page_size"])
        client, auth = kube.module_client(module)
        with kube.reaching(client, auth):
            operators, daemonsets = read_cluster(client, params["page_size"])
    except (MetaxGpuError, kube.ApiException) as exc:
        module.fail_json(msg=str(exc))
    found = installed_schemes(params["releases"], operators, daemonsets)
    module.exit_json(changed=False, found=found,
                     refusal=scheme_refusal(found, params["wanted"]) if params["wanted"] else "")


if __name__ == "__main__":
    main()
