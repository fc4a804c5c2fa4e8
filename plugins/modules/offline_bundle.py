#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
module: offline_bundle
short_description: Write the offline image bundle metax-k8s-images.<version>.run
version_added: 0.1.0
description:
  - Writes the self-extracting offline package of the manual's section 1.4, C(metax-k8s-images.<version>.run)
    a POSIX sh header followed by a tar of one OCI layout per image (gzip layers), the packaged Helm charts
    and a standalone pusher.
  - "The file runs as C(sh metax-k8s-images.<version>.run help|list|extract DIR|load [DOMAIN/PROJECT]|push DOMAIN/PROJECT):
    C(load) imports the images into containerd's C(k8s.io) namespace, podman or docker on a node without a registry;
    C(push) needs python3 with requests (M(metax.gpu.registry_push) reads the bundle directly)."
  - The bundle is rewritten only when its content would differ (image configs and layers, charts, the pusher);
    the file is replaced atomically.
  - Layers of docker-archives are gzip-compressed once into a cache (O(cache_dir)), so an unchanged
    bundle is recognised without compressing anything.
author:
  - MetaX GPU collection maintainers (@metax-gpu)
attributes:
  check_mode:
    support: full
    description: Reports whether the bundle would be written; writes nothing.
  diff_mode:
    support: none
    description: The bundle is binary; the returned digests describe its content.
  platform:
    support: full
    platforms: posix
    description: Runs on the controller (the bastion).
options:
  path:
    description: The C(.run) file to write.
    type: path
    required: true
  version:
    description:
      - Bundle version (the collection version), shown by C(help).
      - Letters, digits, C(.), C(_), C(+) and C(-), starting with a letter or digit (it is written into the C(.run)
        script); anything else is refused.
    type: str
    required: true
  images:
    description: Images to carry.
    type: list
    elements: dict
    required: true
    suboptions:
      archive:
        description: A docker-archive or oci-archive tar (C(docker save), C(podman save)).
        type: path
        required: true
      name:
        description: Repository below the project, for example C(gpu-device).
        type: str
        required: true
      tag:
        description: Image tag (OCI tag grammar, C([A-Za-z0-9_][A-Za-z0-9._-]{0,127})).
        type: str
        required: true
  charts:
    description: Packaged Helm chart C(.tgz) files to carry too.
    type: list
    elements: path
    default: []
  registry:
    description:
      - DOMAIN/PROJECT under which C(load) names the images when it is given no other (the chart's C(registry)).
      - C(DOMAIN[:port][/PROJECT]) with a port of 1-65535 and a project of OCI repository path components;
        anything else is refused.
    type: str
    default: cr.metax-tech.com/cloud
  cache_dir:
    description: Where gzip-compressed layers are cached. Empty means C(~/.cache/metax-gpu/layers).
    type: path
    default: ""
  state:
    description: V(absent) removes the bundle (only a file that is a metax-k8s-images bundle).
    type: str
    choices: [present, absent]
    default: present
requirements:
  - Python package C(isal) makes the gzip compression several times faster (optional).
seealso:
  - module: metax.gpu.registry_push
  - name: The registry and the offline bundle
    description: Bundle format, commands and the client's design.
    link: https://example.invalid/metax/gpu/docs/registry.md
"""

EXAMPLES = r"""
- name: Bundle the agent images and the chart
  metax.gpu.offline_bundle:
    path: /var/tmp/metax-gpu-images/metax-k8s-images.0.1.0.run
    version: 0.1.0
    registry: cr.metax-tech.com/cloud
    images:
      - {archive: /var/tmp/metax-gpu-images/gpu-device-0.1.0.tar, name: gpu-device, tag: 0.1.0}
      - {archive: /var/tmp/metax-gpu-images/gpu-label-0.1.0.tar, name: gpu-label, tag: 0.1.0}
      - {archive: /var/tmp/metax-gpu-images/gpu-aware-0.1.0.tar, name: gpu-aware, tag: 0.1.0}
    charts:
      - /var/tmp/metax-gpu-images/metax-gpu-extensions-0.1.0.tgz

- name: Remove an old bundle
  metax.gpu.offline_bundle:
    path: /var/tmp/metax-gpu-images/metax-k8s-images.0.0.9.run
    version: 0.0.9
    images: []
    state: absent
"""

RETURN = r"""
path:
  description: The bundle file.
  returned: always
  type: str
  sample: /var/tmp/metax-gpu-images/metax-k8s-images.0.1.0.run
digest:
  description: sha256 over the bundle's content (image configs and layers, charts, pusher); null after removal.
  returned: always
  type: str
  sample: sha256:2503e331e9f2ae0aaafeff743ba5719720ce68d80e142987951a35d8c891f7a5
images:
  description: The images inside, with the digest of each image manifest (null in check mode before a first write).
  returned: always
  type: list
  elements: dict
  sample: [{"name": "gpu-device", "tag": "0.1.0", "digest": "sha256:827bda51f4ad00758b8fa39579e339145b5a7ada41ac3a104c36b70f50d38ff6"}]
charts:
  description: The charts inside.
  returned: always
  type: list
  elements: dict
  sample: [{"name": "metax-gpu-extensions", "version": "0.1.0"}]
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.metax.gpu.plugins.module_utils.common import local_path
from ansible_collections.metax.gpu.plugins.module_utils.errors import MetaxGpuError
from ansible_collections.metax.gpu.plugins.module_utils.registry import bundle

ARGSPEC = dict(
    path=dict(type="path", required=True),
    version=dict(type="str", required=True),
    images=dict(type="list", elements="dict", required=True, options=dict(
        archive=dict(type="path", required=True),
        name=dict(type="str", required=True),
        tag=dict(type="str", required=True),
    )),
    charts=dict(type="list", elements="path", default=[]),
    registry=dict(type="str", default=bundle.DEFAULT_REGISTRY),
    cache_dir=dict(type="path", default=""),
    state=dict(type="str", choices=["present", "absent"], default="present"),
)


def main() -> None:
    module = AnsibleModule(argument_spec=ARGSPEC, supports_check_mode=True)
    p = module.params
    try:
        path = local_path(p["path"], "path")
        if p["state"] == "absent":
            result = bundle.remove(path, module.check_mode)
        else:
            bundle.check_values(p["version"], p["registry"])   # before any archive is read
            for image in p["images"]:
                local_path(image["archive"], "images[].archive", must_exist=True)
            charts = [local_path(c, "charts[]", must_exist=True) for c in p["charts"]]
            result = bundle.build(path, p["version"], p["images"], charts, registry=p["registry"],
                                  check_mode=module.check_mode, cache_dir=p["cache_dir"])
    except MetaxGpuError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
