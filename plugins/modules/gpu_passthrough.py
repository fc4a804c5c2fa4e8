#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_passthrough
short_description: Hand MetaX GPUs to virtual machines (vfio-pci) and back
version_added: 0.1.0
description:
  - With O(state=present), binds the chosen MetaX GPUs to C(vfio-pci) through C(driver_override), so that KubeVirt
    and other VM runtimes can pass them through; they leave the container pool (C(metax-tech.com/gpu)) and the
    vfio-manager advertises them as C(metax-tech.com/vfio-gpu), one device per IOMMU group.
  - With O(state=absent), hands them back. C(vfio-pci) lets them go, C(driver_override) is cleared, the MetaX driver
    takes them again and the vfnum they had at hand-over is written back. Nothing is left behind.
  - A GPU with SR-IOV VFs goes through vfnum 0 first; the vfnum is recorded on the node
    (C(/var/lib/metax-gpu/vfio-passthrough.json), removed when every GPU is back).
  - Validates before writing anything. A node without IOMMU (no IOMMU group) is refused with the vendor's
    C(IOMMU support is missing) message; so are a C(vfio-pci) module that is not loaded and unknown GPUs.
  - Refuses while a changing GPU is in use (a process holds one of its device nodes open, C(/dev/dri) on the way to
    VMs, C(/dev/vfio/<group>) on the way back, or the caller lists GPU pods in O(gpu_pods)) unless O(force=true).
    Nothing changes on a refusal.
  - The same node operation as the GPU Operator's vfio-manager (C(driver-config)'s C(vfio) entry); do not use both
    on one node.
author:
  - MetaX GPU collection maintainers (@metax-gpu)
extends_documentation_fragment:
  - metax.gpu.host_root
attributes:
  check_mode:
    support: full
    description: Validates, checks for users and reports the planned changes without writing.
  diff_mode:
    support: full
    description: Shows the driver and vfnum of every changing GPU (by PCI address) before and after.
  platform:
    support: full
    platforms: posix
    description: Runs on the GPU node (Linux sysfs); Python standard library only, Python 3.8 or later.
options:
  gpus:
    description:
      - GPUs to hand over or back, by index (as M(metax.gpu.gpu_facts) and mx-smi number them while the MetaX
        driver holds every GPU, PCI address order; a GPU keeps its index while it is with VMs) or PCI address
        (V(0000:03:00.0) or V(03:00.0)), or V(all).
      - Required with O(state=present). With O(state=absent) the default is every GPU held for VMs.
      - An unknown GPU fails the module before anything is written.
    type: list
    elements: str
    default: []
  state:
    description:
      - V(present) hands the GPUs to VMs (C(vfio-pci)); V(absent) gives them back to the MetaX driver.
    type: str
    choices: [present, absent]
    default: present
  force:
    description:
      - Change GPUs even while they are in use. Running work on them loses its devices.
    type: bool
    default: false
  gpu_pods:
    description:
      - Pods (V(namespace/name)) on this node that hold a GPU resource (C(metax-tech.com/gpu) on the way to VMs,
        C(metax-tech.com/vfio-gpu) on the way back), as the caller found them in the Kubernetes API. Each listed
        pod counts as a user of every changing GPU; the module has no Kubernetes client itself.
    type: list
    elements: str
    default: []
  node_name:
    description:
      - The node's name in messages (the IOMMU refusal names it). Default the host's name.
    type: str
notes:
  - The vfio-pci kernel module must be loaded (C(modprobe vfio-pci)) and the IOMMU enabled
    (C(intel_iommu=on) or C(amd_iommu=on) and VT-d/AMD-Vi in the firmware).
  - The C(metax-tech.com/gpu) and C(metax-tech.com/vfio-gpu) capacities follow once gpu-device and vfio-manager
    rescan the node (a few seconds).
seealso:
  - module: metax.gpu.vfnum
  - name: GPUs for virtual machines
    description: The hand-over, the vfio-gpu resource and KubeVirt's permittedHostDevices entry.
    link: https://example.invalid/metax/gpu/docs/vfio.md
"""

EXAMPLES = r"""
- name: Hand GPUs 6 and 7 to virtual machines
  metax.gpu.gpu_passthrough:
    gpus: ["6", "7"]

- name: Preview handing every GPU back
  metax.gpu.gpu_passthrough:
    state: absent
  check_mode: true
  diff: true

- name: Refuse if the pods found on the node use GPUs
  metax.gpu.gpu_passthrough:
    gpus: ["0000:83:00.0"]
    gpu_pods: "{{ node_gpu_pods }}"

- name: Work on a simulated node
  metax.gpu.gpu_passthrough:
    gpus: [all]
    host_root: /var/lib/metax-sim/vm
"""

RETURN = r"""
devices:
  description:
    - One entry per changing GPU. In check mode C(driver_after) and C(vfnum_after) are planned; otherwise they are
      read back from sysfs (also on failure, when they tell how far the change went).
  type: list
  elements: dict
  returned: success and when a write failed
  sample:
    - index: 6
      bdf: "0000:86:00.0"
      action: to-vm
      driver_before: metax
      driver_after: vfio-pci
      vfnum_before: 0
      vfnum_after: 0
      iommu_group: 6
  contains:
    index:
      description: GPU index (PCI address order, as in M(metax.gpu.gpu_facts)).
      type: int
    bdf:
      description: PCI address of the GPU (physical function).
      type: str
    action:
      description: V(to-vm) or V(to-host).
      type: str
    driver_before:
      description: The driver that held the GPU before (null when none did).
      type: str
    driver_after:
      description: The driver that holds it after.
      type: str
    vfnum_before:
      description: C(sriov_numvfs) before.
      type: int
    vfnum_after:
      description: C(sriov_numvfs) after.
      type: int
    iommu_group:
      description: The GPU's IOMMU group (C(/dev/vfio/<group>) while vfio-pci holds it).
      type: int
vm_gpus:
  description: PCI address and IOMMU group of every GPU held for VMs after the run (planned in check mode).
  type: list
  elements: dict
  returned: success
  sample: [{"bdf": "0000:86:00.0", "iommu_group": 6}]
iommu:
  description: Whether the node has IOMMU groups.
  type: bool
  returned: always
in_use:
  description: Why the changing GPUs were in use; non-empty only when O(force=true) let the change go ahead.
  type: list
  elements: str
  returned: always
  sample: ["GPU 6 (0000:86:00.0): process 4242 (python) holds /dev/dri/card6 open"]
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.metax.gpu.plugins.module_utils.common import HOST_ROOT_ARGSPEC, checked_host_root, merged_spec
from ansible_collections.metax.gpu.plugins.module_utils.errors import MetaxGpuError
from ansible_collections.metax.gpu.plugins.module_utils.vfio import backend
from ansible_collections.metax.gpu.plugins.module_utils.vfio.plan import TO_VM, plan, select

ARGUMENT_SPEC = {
    "gpus": {"type": "list", "elements": "str", "default": []},
    "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
    "force": {"type": "bool", "default": False},
    "gpu_pods": {"type": "list", "elements": "str", "default": []},
    "node_name": {"type": "str"},
}


def vm_gpus_after(node, wanted):
    """What is held for VMs once the plan ran: the GPUs held now, changed by the plan's steps."""
    held = {g.bdf: g.iommu_group for g in node.gpus if g.for_vm}
    for step in wanted.steps:
        if step.action == TO_VM:
            held[step.bdf] = step.iommu_group
        else:
            held.pop(step.bdf, None)
    return [{"bdf": bdf, "iommu_group": group} for bdf, group in sorted(held.items())]


def main():
    module = AnsibleModule(argument_spec=merged_spec(HOST_ROOT_ARGSPEC, ARGUMENT_SPEC), supports_check_mode=True)
    params = module.params
    present = params["state"] == "present"
    node_name = params["node_name"] or os.uname()[1]
    iommu = False
    try:
        host = checked_host_root(params["host_root"])
        if present and not params["gpus"]:
            raise MetaxGpuError("gpus is required with state=present (GPU indices, PCI addresses or 'all')")
        node = backend.read_node(host)
        iommu = node.iommu
        if present:
            chosen = select(node.gpus, params["gpus"])
            wanted = plan(node, to_vm=[g.index for g in chosen], node_name=node_name)
        else:
            held = [g for g in node.gpus if g.for_vm or g.bdf in node.recorded_vfnums]
            chosen = select(node.gpus, params["gpus"]) if params["gpus"] else held
            wanted = plan(node, to_host=[g.index for g in chosen], node_name=node_name)
        users = backend.in_use(host, node, wanted, gpu_pods=params["gpu_pods"])
    except MetaxGpuError as exc:
        module.fail_json(msg=str(exc), iommu=iommu, in_use=[])
    planned = [s.to_dict() for s in wanted.steps]
    if users and not params["force"]:
        module.fail_json(msg="refusing to hand over GPUs in use (force=true overrides): %s" % "; ".join(users),
                         in_use=users, devices=planned, iommu=iommu)
    for user in users:
        module.warn("handing over although in use (force): %s" % user)
    result = {"changed": wanted.changed, "in_use": users, "iommu": iommu, "vm_gpus": vm_gpus_after(node, wanted)}
    if module._diff:
        result["diff"] = wanted.diff()
    if module.check_mode or not wanted.changed:
        module.exit_json(devices=planned, **result)
    try:
        result["devices"] = backend.apply(host, wanted)
    except backend.PassthroughApplyError as exc:
        result["changed"] = any(d["driver_before"] != d["driver_after"] or d["vfnum_before"] != d["vfnum_after"]
                                for d in exc.results)
        module.fail_json(msg=str(exc), devices=exc.results, **result)
    except MetaxGpuError as exc:
        module.fail_json(msg=str(exc), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
