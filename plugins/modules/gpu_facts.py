#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_facts
short_description: Gather facts about MetaX GPUs on a node
version_added: 0.1.0
description:
  - Discovers MetaX GPUs from PCI (sysfs) and C(mx-smi) and returns them as the C(metax_gpu) fact.
  - Reports devices (whole GPUs, or SR-IOV VFs when virtualisation is on), the interconnect topology with
    a link class per pair and link groups, the kernel driver state and the SR-IOV state.
  - Without C(mx-smi), or with the driver unloaded, the facts come from PCI alone and MetaXLink is reported
    as unknown (C(metaxlink_known=false) in the topology).
  - C(mx-smi) output is read by its header names (the layout real MetaX machines print and older ones).
    Output that is not understood never fails the module, it becomes a warning naming the command and
    the line, and the facts fall back to PCI for what could not be read.
  - O(ignore:product) values are the chip names MetaX's tools and node labels use (V(MXC500), V(MXC550),
    V(MXN100)); C(mx-smi)'s V(MetaX C500) is read as V(MXC500). Without C(mx-smi), a PCI device id that
    more than one product shows gives only the family (V(MXC)).
author:
  - MetaX GPU collection maintainers (@metax-gpu)
extends_documentation_fragment:
  - metax.gpu.host_root
attributes:
  check_mode:
    support: full
    description: The module only reads; it behaves the same in check mode.
  diff_mode:
    support: none
    description: The module changes nothing, so there is nothing to diff.
  facts:
    support: full
    description: Sets the C(metax_gpu) fact.
options:
  topology:
    description:
      - Query C(mx-smi topo -m) for MetaXLink. When V(false), links are derived from PCI only.
    type: bool
    default: true
notes:
  - Runs on the GPU node. Needs only the Python standard library (Python 3.8 or later).
seealso:
  - name: MetaX simulated node
    description: How to create a simulated MetaX node to try the module without hardware.
    link: https://example.invalid/metax/gpu/docs/simulated-node.md
"""

EXAMPLES = r"""
- name: Gather MetaX GPU facts
  metax.gpu.gpu_facts:

- name: Fail early on nodes whose GPUs are not all healthy
  ansible.builtin.assert:
    that:
      - ansible_facts.metax_gpu.gpus | rejectattr('healthy') | list | length == 0
    fail_msg: "unhealthy MetaX GPUs on {{ inventory_hostname }}"

- name: Read a simulated node instead of the real root
  metax.gpu.gpu_facts:
    host_root: /var/lib/metax-sim/root
"""

RETURN = r"""
ansible_facts:
  description: Facts to add to ansible_facts.
  returned: always
  type: dict
  contains:
    metax_gpu:
      description: MetaX GPU inventory of the node.
      returned: always
      type: dict
      contains:
        present:
          description: Whether any MetaX GPU is present on the PCI bus.
          type: bool
          returned: always
        gpu_count:
          description: Number of physical GPUs present on the PCI bus.
          type: int
          returned: always
          sample: 8
        device_count:
          description: Number of allocatable devices (GPUs, or VFs when SR-IOV is on).
          type: int
          returned: always
          sample: 8
        gpus:
          description: Physical GPUs in PCI address order.
          type: list
          elements: dict
          returned: always
          sample:
            - index: 0
              bdf: "0000:03:00.0"
              product: MXC500
              family: MXC
              memory_gib: 64
              numa_node: 0
              switch: "0000:01:00.0"
              healthy: true
              driver_bound: true
              uuid: GPU-000004d5-4d58-0000-8000-00005e000000
              serial: 4d-58-00-00-04-d5-00-01
              drm_card: card0
              drm_render: renderD128
              sriov_totalvfs: 0
              sriov_numvfs: 0
        devices:
          description: Allocatable devices; C(id) is the PCI address and the device ID gpu-device advertises.
          type: list
          elements: dict
          returned: always
          sample:
            - id: "0000:03:00.0"
              index: 0
              gpu_index: 0
              is_vf: false
              healthy: true
        topology:
          description:
            - Pairwise link classes between devices (C(matrix), in C(device_indices) order) and link groups.
            - Classes, closest first, are VF (two VFs of one GPU), MX (MetaXLink), PIX, PXB, PHB, NODE, SYS.
          type: dict
          returned: always
          sample:
            device_indices: [0, 1]
            matrix: [[null, "MX"], ["MX", null]]
            link_groups: [{"kind": "metaxlink", "gpus": [0, 1]}]
            metaxlink_known: true
        driver:
          description: Kernel driver state.
          type: dict
          returned: always
          sample: {"loaded": true, "version": "2.14.6", "major": 2, "minor": 14, "patch": 6}
        sriov:
          description: SR-IOV state; C(status) is the C(gpu.sriov) label value (on, off or forbidden).
          type: dict
          returned: always
          sample: {"capable": true, "totalvfs": 8, "numvfs": 4, "status": "on"}
        mx_smi_available:
          description: Whether C(mx-smi) ran and its output was understood.
          type: bool
          returned: always
        maca_version:
          description: MXMACA version reported by C(mx-smi), when available.
          type: str
          returned: always
        warnings:
          description: What discovery could not determine, and why.
          type: list
          elements: str
          returned: always
"""


from ansible.module_utils.basic import AnsibleModule

from ansible_collections.metax.gpu.plugins.module_utils.common import HOST_ROOT_ARGSPEC, checked_host_root, merged_spec
from ansible_collections.metax.gpu.plugins.module_utils.errors import MetaxGpuError
from ansible_collections.metax.gpu.plugins.module_utils.gpu.discovery import discover

# The module's own options; shared ones come from module_utils specs paired
# with doc fragments of the same name (docs/development.md).
ARGUMENT_SPEC = {
    "topology": {"type": "bool", "default": True},
}


def main():
    module = AnsibleModule(argument_spec=merged_spec(HOST_ROOT_ARGSPEC, ARGUMENT_SPEC), supports_check_mode=True)
    try:
        inventory = discover(checked_host_root(module.params["host_root"]), topology=module.params["topology"])
    except MetaxGpuError as exc:
        module.fail_json(msg=str(exc))
    facts = inventory.to_dict()
    for warning in inventory.warnings:
        module.warn(warning)
    module.exit_json(changed=False, ansible_facts={"metax_gpu": facts})


if __name__ == "__main__":
    main()
