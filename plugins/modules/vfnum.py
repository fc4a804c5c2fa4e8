#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
module: vfnum
short_description: Set the number of SR-IOV virtual functions (vfnum) of MetaX GPUs
version_added: 0.1.0
description:
  - Sets C(sriov_numvfs) of the chosen MetaX GPUs, or of all of them, to O(vfnum), the GPU virtualisation
    setting that the manual's C(gpu.vfnum) label reports and the GPU Operator's C(driver-config) ConfigMap
    controls (manual section 3.2.3). With vfnum M, each GPU becomes M allocatable devices (its VFs).
  - Validates before writing anything, against the allowed values (0, 1, 2, 4, 8), against each GPU's
    C(sriov_totalvfs) (the kernel would answer ERANGE) and against C(gpu.sriov=forbidden) (no GPU with SR-IOV).
  - A change between two non-zero values writes 0 first, since the kernel answers EBUSY otherwise.
  - Reads the value back after writing, since the kernel may enable fewer VFs than asked; the module then
    fails, reports what each GPU has, and leaves the GPUs it had not reached untouched.
  - Refuses while a changing GPU is in use (a process holds one of its device nodes open, PF or VF, or the
    caller lists GPU pods on the node in O(gpu_pods)) unless O(force=true).
  - Does not pause the device plugin or evict pods; the C(metax.gpu.set_vfnum) playbook does that around it.
author:
  - MetaX GPU collection maintainers (@metax-gpu)
extends_documentation_fragment:
  - metax.gpu.host_root
attributes:
  check_mode:
    support: full
    description: Validates, checks for users and reports the planned values without writing.
  diff_mode:
    support: full
    description: Shows C(sriov_numvfs) per GPU (by PCI address) before and after.
  platform:
    support: full
    platforms: posix
    description: Runs on the GPU node (Linux sysfs); Python standard library only, Python 3.8 or later.
options:
  vfnum:
    description:
      - VFs per GPU. V(0) turns virtualisation off (each GPU is one device).
    type: int
    required: true
    choices: [0, 1, 2, 4, 8]
  devices:
    description:
      - GPUs to change, by index (as M(metax.gpu.gpu_facts) numbers them, PCI address order) or PCI address
        (V(0000:03:00.0) or V(03:00.0)). Default all MetaX GPUs of the node.
      - An unknown GPU fails the module before anything is written.
    type: list
    elements: str
  force:
    description:
      - Change GPUs even while they are in use. Running work on them loses its devices.
    type: bool
    default: false
  gpu_pods:
    description:
      - Pods (V(namespace/name)) on this node that request C(metax-tech.com/gpu), as the caller found them
        in the Kubernetes API. Any listed pod counts as a user of every GPU of the node, since the device
        plugin re-registers a new device list; the module has no Kubernetes client itself.
    type: list
    elements: str
    default: []
notes:
  - Only C(sriov_numvfs) is written; nothing else on the node changes. The C(gpu.vfnum) and C(gpu.sriov) labels
    and the C(metax-tech.com/gpu) capacity follow once gpu-label and gpu-device see the new VFs.
seealso:
  - module: metax.gpu.gpu_facts
  - name: vfnum documentation
    description: State vocabulary and a worked example of the set_vfnum playbook.
    link: https://example.invalid/metax/gpu/docs/vfnum.md
"""

EXAMPLES = r"""
- name: Split every GPU of the node into 4 VFs
  metax.gpu.vfnum:
    vfnum: 4

- name: Turn virtualisation off on GPU 1 only, previewing first
  metax.gpu.vfnum:
    vfnum: 0
    devices: ["1"]
  check_mode: true
  diff: true

- name: Set vfnum 2 unless the pods found on the node use GPUs
  metax.gpu.vfnum:
    vfnum: 2
    gpu_pods: "{{ node_gpu_pods }}"

- name: Work on a simulated node
  metax.gpu.vfnum:
    vfnum: 8
    host_root: /var/lib/metax-sim/vm-3
"""

RETURN = r"""
vfnum:
  description: The value asked for.
  type: int
  returned: always
  sample: 4
devices:
  description:
    - One entry per selected GPU. In check mode C(after) is the planned value; otherwise it is the value
      read back from sysfs (also on failure, when it tells how far the change went).
  type: list
  elements: dict
  returned: success and when a write failed
  sample:
    - {"index": 0, "bdf": "0000:03:00.0", "totalvfs": 8, "before": 0, "after": 4}
  contains:
    index:
      description: GPU index (PCI address order, as in M(metax.gpu.gpu_facts)).
      type: int
    bdf:
      description: PCI address of the GPU (physical function).
      type: str
    totalvfs:
      description: C(sriov_totalvfs) of the GPU.
      type: int
    before:
      description: C(sriov_numvfs) before the module ran.
      type: int
    after:
      description: C(sriov_numvfs) after the module ran.
      type: int
in_use:
  description: Why the changed GPUs were in use; non-empty only when O(force=true) let the change go ahead.
  type: list
  elements: str
  returned: always
  sample: ["process 4242 (python) holds /dev/dri/card3 open"]
"""


from ansible.module_utils.basic import AnsibleModule

from ansible_collections.metax.gpu.plugins.module_utils.common import HOST_ROOT_ARGSPEC, checked_host_root, merged_spec
from ansible_collections.metax.gpu.plugins.module_utils.errors import MetaxGpuError
from ansible_collections.metax.gpu.plugins.module_utils.vfnum import backend
from ansible_collections.metax.gpu.plugins.module_utils.vfnum.plan import ALLOWED_VFNUMS, plan

ARGUMENT_SPEC = {
    "vfnum": {"type": "int", "required": True, "choices": list(ALLOWED_VFNUMS)},
    "devices": {"type": "list", "elements": "str"},
    "force": {"type": "bool", "default": False},
    "gpu_pods": {"type": "list", "elements": "str", "default": []},
}


def main():
    module = AnsibleModule(argument_spec=merged_spec(HOST_ROOT_ARGSPEC, ARGUMENT_SPEC), supports_check_mode=True)
    params = module.params
    try:
        host = checked_host_root(params["host_root"])
        pfs = backend.read_pfs(host)
        wanted = plan(pfs, params["vfnum"], params["devices"])
        users = backend.in_use(host, pfs, wanted, params["gpu_pods"])
    except MetaxGpuError as exc:
        module.fail_json(msg=str(exc), vfnum=params["vfnum"])
    if users and not params["force"]:
        module.fail_json(msg="refusing to change vfnum of GPUs in use (force=true overrides): %s"
                         % "; ".join(users), vfnum=params["vfnum"], in_use=users,
                         devices=[c.to_dict() for c in wanted.changes])
    for user in users:
        module.warn("changing vfnum although in use (force): %s" % user)
    result = {"changed": wanted.changed, "vfnum": wanted.vfnum, "in_use": users}
    if module._diff:
        result["diff"] = wanted.diff()
    if module.check_mode or not wanted.changed:
        module.exit_json(devices=[c.to_dict() for c in wanted.changes], **result)
    try:
        result["devices"] = backend.apply(host, wanted)
    except backend.VfnumApplyError as exc:
        result["changed"] = any(d["before"] != d["after"] for d in exc.results)
        module.fail_json(msg=str(exc), devices=exc.results, **result)
    except MetaxGpuError as exc:
        module.fail_json(msg=str(exc), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
