#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
module: driver
short_description: Install, upgrade, reload or remove the MetaX kernel driver on a node
version_added: 0.1.0
description:
  - Manages the MetaX kernel driver (C(metax) kernel module) from an offline package that is already on the node
    (copy it from the bastion first, for example with M(ansible.builtin.copy)).
  - Package kinds are C(.deb) (installed with the node's C(dpkg)), C(.rpm) (the node's C(rpm)), the vendor's
    self-extracting C(.run) (executed; the module records what it installed in
    C(/var/lib/metax-gpu/driver-run.json) because a C(.run) has no package database), and a prebuilt tree as
    MetaX's driver image ships it (C(lib/modules/KERNEL_RELEASE/.../metax.ko), C(usr/bin/mx-smi) and the
    declaration C(NAME.version)), used only when it has modules for the node's running kernel; its files are
    copied onto the node, C(depmod) is run, and the files are recorded in
    C(/var/lib/metax-gpu/driver-prebuilt.json) for their removal.
  - Detects the installed driver from C(/sys/module/metax/version) and the package database; the version of a
    package file is read from its name (C(NAME_VERSION_ARCH.deb), C(NAME-VERSION-RELEASE.ARCH.rpm),
    C(NAME-VERSION-ARCH.run)), a prebuilt tree's from its declaration.
  - A payload's own version and the kernel driver it installs may differ (MetaX's payload C(2.29.0.13) installs
    C(2.12.13)). A declaration file says so (C(version=) and C(driver=) lines; C(NAME.version) at the top of a
    prebuilt tree or of a directory, C(NAME-ANYTHING.version) beside the packages of one version); without one
    they are the same. O(version) is the payload's own version; the loaded module is compared with the kernel
    driver it declares, and every install records both in C(/var/lib/metax-gpu/driver-payload.json).
  - A new driver is installed with the running one unloaded first (O(unload_command)), then loaded with
    O(load_command) and verified - loaded module the kernel driver the payload declares, C(/dev/mxcd) present,
    C(mx-smi) answering.
  - Refuses to unload the driver while it is in use - a process holds C(/dev/mxcd) or a MetaX C(/dev/dri) node
    open, the module's kernel refcount is non-zero, or (with O(node_name)) a pod on the node requests
    C(metax-tech.com/gpu) - unless O(force=true).
  - This is step 4 of the manual's node maintenance procedure; the playbook C(metax.gpu.driver_upgrade) runs
    the whole procedure (cordon, pause the agents, evict GPU pods, this module, validate, uncordon) as a
    rolling upgrade.
author:
  - MetaX GPU collection maintainers (@metax-gpu)
extends_documentation_fragment:
  - metax.gpu.host_root
  - metax.gpu.k8s_auth
attributes:
  check_mode:
    support: full
    description: Reports the plan (steps, versions from and to, the package it would use) and changes nothing.
  diff_mode:
    support: full
    description: Shows the driver version and load state before and after.
  platform:
    support: full
    platforms: posix
    description: Runs on the GPU node (Python 3.8 or later, standard library only).
options:
  state:
    description:
      - V(present) ensures a driver is installed and loaded, of O(version) when given.
      - V(latest) ensures the newest package found under O(src) that suits the node is installed and loaded.
      - V(absent) unloads the driver and removes its package.
    type: str
    choices: [present, absent, latest]
    default: present
  version:
    description:
      - The driver payload version wanted (for example C(2.33.0.7)), as in package file names and the package
        database. Compared with the package database; C(/sys/module/metax/version) is compared with the kernel
        driver that payload declares (the same number when it declares none). Not allowed with O(state=latest).
    type: str
  src:
    description:
      - A driver package file, a prebuilt tree, or a directory holding driver packages, prebuilt trees (as
        subdirectories) and declarations, on the node (a path under O(host_root)).
      - Needed whenever something has to be installed. Files that are not packages of O(package_name) are ignored.
      - Of several packages of the chosen version, the node's own kind (deb or rpm) wins over a prebuilt tree,
        which wins over C(.run); a deb is never installed on an rpm node nor the reverse.
    type: path
  deploy_policy:
    description:
      - The meanings of the MetaX GPU Operator's C(driver.deployPolicy).
      - V(IfNotPresent) installs when the wanted version (or, without O(version), any driver) is not installed.
      - V(Always) reinstalls and reloads on every run, even when the wanted version is present (not idempotent
        by design; use it to repair a damaged install).
      - V(Never) never installs, loads or removes anything; it only checks that the driver (of O(version)) is
        present, and fails otherwise.
    type: str
    choices: [IfNotPresent, Always, Never]
    default: IfNotPresent
  force:
    description:
      - Unload the driver even while GPUs are in use. Running GPU jobs on the node will fail.
    type: bool
    default: false
  package_name:
    description: Name of the driver package in the package database and in package file names.
    type: str
    default: metax-driver
  load_command:
    description:
      - Command that loads the driver. A first word without C(/) is the node's own tool (resolved under
        O(host_root)); a path runs as given on the machine running the module.
    type: list
    elements: str
    default: [modprobe, metax]
  unload_command:
    description: Command that unloads the driver (same resolution as O(load_command)).
    type: list
    elements: str
    default: [modprobe, -r, metax]
  run_install_args:
    description: Arguments given to a vendor C(.run) package to install it.
    type: list
    elements: str
    default: []
  run_uninstall_args:
    description: Arguments given to the recorded vendor C(.run) package to uninstall it.
    type: list
    elements: str
    default: [--uninstall]
  verify:
    description: After a change, check the loaded version, C(/dev/mxcd) and C(mx-smi); fail when one is wrong.
    type: bool
    default: true
  node_name:
    description:
      - Kubernetes name of this node. When given, pods on the node that request C(metax-tech.com/gpu) count as
        the driver being in use. Needs the C(kubernetes) Python package on the node.
    type: str
notes:
  - The connection options (O(host), O(api_key), O(kubeconfig)...) are used only with O(node_name), to list the
    node's pods; given without it they are refused.
  - On a node mounted elsewhere (O(host_root) not C(/), as in an agent container) the package tools run through
    C(chroot). On a simulated node the tools are the ones the simulated root carries.
seealso:
  - name: Day-two operations
    description: The rolling driver upgrade, its node states and a worked example.
    link: https://example.invalid/metax/gpu/docs/day-two.md
"""

EXAMPLES = r"""
- name: Copy the offline driver package from the bastion
  ansible.builtin.copy:
    src: files/metax-driver_2.33.0.7_amd64.deb
    dest: /var/cache/metax-driver/
    mode: "0644"

- name: Install that driver version (no-op when it is already there)
  metax.gpu.driver:
    version: 2.33.0.7
    src: /var/cache/metax-driver

- name: Newest package in the directory, refusing while GPU pods run on the node
  metax.gpu.driver:
    state: latest
    src: /var/cache/metax-driver
    node_name: "{{ metax_gpu_node_name | default(inventory_hostname) }}"

- name: MetaX's driver image unpacked on the node (a prebuilt tree); payload 2.29.0.13 loads module 2.12.13
  metax.gpu.driver:
    version: 2.29.0.13
    src: /var/cache/metax-driver/driver-image-2.29.0.13

- name: Only check the driver, as the GPU Operator's deployPolicy Never does
  metax.gpu.driver:
    version: 2.33.0.7
    deploy_policy: Never

- name: Remove the driver
  metax.gpu.driver:
    state: absent
"""

RETURN = r"""
plan:
  description: What the module does (or, in check mode, would do).
  returned: always
  type: dict
  contains:
    steps:
      description: Ordered steps among C(unload), C(remove), C(install), C(load); empty when nothing changes.
      type: list
      elements: str
      sample: [unload, install, load]
    from_version:
      description: Driver version before.
      type: str
      sample: 2.32.0.6
    to_version:
      description: Driver payload version after (null for O(state=absent)).
      type: str
      sample: 2.33.0.7
    from_driver_version:
      description: The loaded kernel module's version before.
      type: str
      sample: 2.12.11
    to_driver_version:
      description: The kernel-driver version the payload O(version) declares, which the loaded module is checked
        against (the same as RV(plan.to_version) when the payload declares none).
      type: str
      sample: 2.12.13
    reason:
      description: Why, in words.
      type: str
      sample: upgrade 2.32.0.6 -> 2.33.0.7
    package:
      description: The package installed (path on the node, kind, version, declared driver_version, the kernels a
        prebuilt tree has modules for), or null.
      type: dict
      sample: {path: /var/cache/metax-driver/metax-driver_2.33.0.7_amd64.deb, kind: deb, version: 2.33.0.7,
               driver_version: null, kernels: []}
before:
  description: The driver before the run.
  returned: always
  type: dict
  sample: {version: 2.32.0.6, loaded_version: 2.32.0.6, package_version: 2.32.0.6, package_kind: deb,
           package_driver_version: 2.32.0.6, kernel: 5.15.0-105-generic, loaded: true, mxcd: true}
after:
  description: The driver after the run (same keys as RV(before)).
  returned: when not in check mode
  type: dict
in_use:
  description: Why the driver counts as in use (processes, refcount, pods); empty when it is free.
  returned: always
  type: list
  elements: str
  sample: ["1234 (python3): /dev/dri/card0", "pod ml/train-0 requests metax-tech.com/gpu"]
verify:
  description: Result of the checks after a change.
  returned: when something was installed or loaded and O(verify) is true
  type: dict
  sample: {loaded_version: 2.33.0.7, version_ok: true, mxcd: true, mx_smi: true, mx_smi_message: ok}
"""


from ansible.module_utils.basic import AnsibleModule

from ansible_collections.metax.gpu.plugins.module_utils.common import HOST_ROOT_ARGSPEC, K8S_AUTH_ARGSPEC, checked_host_root, merged_spec
from ansible_collections.metax.gpu.plugins.module_utils.driver import backend
from ansible_collections.metax.gpu.plugins.module_utils.errors import MetaxGpuError

ARGUMENT_SPEC = {
    "state": {"type": "str", "choices": list(backend.STATES), "default": "present"},
    "version": {"type": "str"},
    "src": {"type": "path"},
    "deploy_policy": {"type": "str", "choices": list(backend.POLICIES), "default": "IfNotPresent"},
    "force": {"type": "bool", "default": False},
    "package_name": {"type": "str", "default": backend.DEFAULT_PACKAGE},
    "load_command": {"type": "list", "elements": "str", "default": list(backend.DEFAULT_LOAD)},
    "unload_command": {"type": "list", "elements": "str", "default": list(backend.DEFAULT_UNLOAD)},
    "run_install_args": {"type": "list", "elements": "str", "default": []},
    "run_uninstall_args": {"type": "list", "elements": "str", "default": ["--uninstall"]},
    "verify": {"type": "bool", "default": True},
    "node_name": {"type": "str"},
}


def _node_pods(module, node_name):
    # imported here: only a run with node_name needs the kubernetes package on the node
    from ansible_collections.metax.gpu.plugins.module_utils.kube.client import core_v1, module_client, reaching
    from ansible_collections.metax.gpu.plugins.module_utils.kube.evict import check_node_name

    check_node_name(node_name)
    client, auth = module_client(module)
    with reaching(client, auth):
        pods = core_v1(client).list_pod_for_all_namespaces(field_selector="spec.nodeName=%s" % node_name)
    return list(pods.get("items") or [])


def main():
    module = AnsibleModule(argument_spec=merged_spec(HOST_ROOT_ARGSPEC, K8S_AUTH_ARGSPEC, ARGUMENT_SPEC), supports_check_mode=True,
                           required_by={option: "node_name" for option in K8S_AUTH_ARGSPEC})
    params = module.params
    root = params["host_root"]
    request = backend.Request(
        state=params["state"], version=params["version"], src=params["src"],
        deploy_policy=params["deploy_policy"], force=params["force"], package_name=params["package_name"],
        load_command=params["load_command"], unload_command=params["unload_command"],
        run_install_args=params["run_install_args"], run_uninstall_args=params["run_uninstall_args"],
        verify=params["verify"])

    def runner(argv):
        return module.run_command(argv, environ_update={"METAX_HOST_ROOT": root, "LC_ALL": "C"})

    try:
        pods = _node_pods(module, params["node_name"]) if params["node_name"] is not None else []
        result = backend.run(checked_host_root(root), request, module.check_mode, runner=runner, pods=pods)
    except backend.DriverVerifyError as exc:
        module.fail_json(msg=str(exc), changed=True, verify=exc.checks)
    except backend.DriverCommandError as exc:
        module.fail_json(msg=str(exc), changed=True)
    except MetaxGpuError as exc:
        module.fail_json(msg=str(exc), changed=False)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
