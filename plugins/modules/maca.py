#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
module: maca
short_description: Install MXMACA on a host from its payload image, in versioned directories behind /opt/maca
version_added: 0.1.0
description:
  - Installs the MXMACA software stack on a GPU Extensions node or a Docker host from the vendor's MXMACA image
    archive (manual section 1.4.3, the offline payload; C(.xz) or plain C(docker save) tar), so containers get it
    through CDI or metax-docker and application images need not carry it (docs/runtime.md).
  - Only the image's C(/opt/maca) is extracted, into C(/opt/maca-<version>) (whole or absent - it is extracted
    beside and renamed). C(/opt/maca) is a symbolic link to the active version, replaced in one rename, so it is
    never missing. Running containers keep the version they started with (the CDI spec mounts the link's
    target); the previous O(keep) versions stay for them, older ones are removed.
  - Switching back to an installed version needs no payload.
  - A real directory at C(/opt/maca) (a MACA installed by other means) is never replaced.
author:
  - MetaX GPU collection maintainers (@metax-gpu)
extends_documentation_fragment:
  - metax.gpu.host_root
attributes:
  check_mode:
    support: full
    description: Reports whether it would extract, switch and remove, and changes nothing.
  diff_mode:
    support: full
    description: Shows the active version before and after.
  platform:
    support: full
    platforms: posix
    description: Runs on the node (Python 3.8 or later, standard library only).
options:
  state:
    description: V(present) installs and activates O(version); V(absent) removes the link and every version.
    type: str
    choices: [present, absent]
    default: present
  src:
    description:
      - The payload image archive, a path on the machine the module runs on (not under O(host_root)). Needed only
        when O(version) is not installed yet.
    type: path
  version:
    description:
      - The MXMACA version, for example C(2.23.0.4). Default - read from O(image).
    type: str
  image:
    description:
      - The payload image reference, for example C(cr.metax-tech.com/library/maca-c500:2.23.0.4-ubuntu18.04-amd64)
        (the GPU Operator's C(maca.payload.images) form); its tag gives the version when O(version) is not set.
    type: str
  keep:
    description:
      - How many other versions stay besides the active one (the previous first, for running containers).
      - A negative value is refused.
    type: int
    default: 1
  max_members:
    description:
      - The most members the payload may hold, counted in the image archive and in each of its layers.
        A payload above it is refused, naming the member, and nothing is installed (docs/security.md).
      - The default fits a real MXMACA payload (tens of thousands of files) many times over.
    type: int
    default: 1000000
  max_member_size:
    description:
      - The largest file the payload may write, as bytes or with a binary unit (C(32GiB), C(512M)).
    type: str
    default: 32GiB
  max_total_size:
    description:
      - The most the payload may expand to (the image archive's layers together) and the most it may write
        under C(/opt/maca-<version>), as bytes or with a binary unit. A real MXMACA C(/opt/maca) is 5 to 9.5 GB.
      - A small archive that decompresses to more (an xz bomb) is refused before the excess is written.
    type: str
    default: 128GiB
"""

EXAMPLES = r"""
- name: Copy the MXMACA payload to the node
  ansible.builtin.copy:
    src: files/maca-c500-container-2.23.0.4-ubuntu18.04-amd64.xz
    dest: /var/tmp/maca-payload.xz
    mode: "0600"

- name: Install and activate it
  metax.gpu.maca:
    src: /var/tmp/maca-payload.xz
    image: cr.metax-tech.com/library/maca-c500:2.23.0.4-ubuntu18.04-amd64

- name: Back to the previous version (still installed)
  metax.gpu.maca:
    version: 2.18.0.3
"""

RETURN = r"""
version:
  description: The active version afterwards (with O(state=present)).
  returned: always
  type: str
  sample: 2.23.0.4
previous:
  description: The active version before, if any.
  returned: always
  type: str
  sample: 2.18.0.3
installed:
  description: Whether the payload was extracted.
  returned: always
  type: bool
  sample: true
removed:
  description: Versions (or with O(state=absent), node paths) removed.
  returned: always
  type: list
  elements: str
  sample: [2.15.0.1]
"""


from ansible.module_utils.basic import AnsibleModule

from ansible_collections.metax.gpu.plugins.module_utils import archive
from ansible_collections.metax.gpu.plugins.module_utils.common import (
    HOST_ROOT_ARGSPEC, InvalidOption, checked_host_root, local_path, merged_spec)
from ansible_collections.metax.gpu.plugins.module_utils.errors import MetaxGpuError
from ansible_collections.metax.gpu.plugins.module_utils.maca import install as maca_install
from ansible_collections.metax.gpu.plugins.module_utils.maca import layout

ARGUMENT_SPEC = {
    "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
    "src": {"type": "path"},
    "version": {"type": "str"},
    "image": {"type": "str"},
    "keep": {"type": "int", "default": 1},
    "max_members": {"type": "int", "default": 1000000},
    "max_member_size": {"type": "str", "default": "32GiB"},
    "max_total_size": {"type": "str", "default": "128GiB"},
}


def main():
    module = AnsibleModule(argument_spec=merged_spec(HOST_ROOT_ARGSPEC, ARGUMENT_SPEC), supports_check_mode=True,
                           required_if=[("state", "present", ("version", "image"), True)])
    params = module.params
    try:
        host = checked_host_root(params["host_root"])
        if params["keep"] < 0:
            # was read as 0: every other version removed, the running containers' too
            raise InvalidOption("keep must be 0 or more (versions kept besides the active one), not %d" % params["keep"])
        if params["state"] == "absent":
            removed = maca_install.uninstall(host, check_mode=module.check_mode)
            module.exit_json(changed=bool(removed), version=None, previous=None, installed=False, removed=removed)
        limits = archive.limits_from(params["max_members"], params["max_member_size"], params["max_total_size"])
        version = params["version"] or (layout.version_of_image(params["image"]) if params["image"] else None)
        if not version:
            raise InvalidOption("version (or an image whose tag gives it) is empty")
        src = local_path(params["src"], "src", must_exist=True) if params["src"] is not None else None
        plan = maca_install.install(host, src, version, params["keep"], check_mode=module.check_mode,
                                    limits=limits)
    except MetaxGpuError as exc:
        module.fail_json(msg=str(exc))
    result = {"changed": plan.install or plan.switch or bool(plan.remove), "version": version,
              "previous": plan.active_before, "installed": plan.install, "removed": list(plan.remove)}
    if module._diff:
        result["diff"] = {"before": "active: %s\n" % plan.active_before, "after": "active: %s\n" % version}
    module.exit_json(**result)


if __name__ == "__main__":
    main()
