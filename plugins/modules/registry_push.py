#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
module: registry_push
short_description: Push images and Helm charts to an OCI registry, without docker, skopeo or helm
version_added: 0.1.0
description:
  - Pushes every artifact in O(src) to O(registry) with the OCI distribution protocol
    (the manual's section 1.4 steps C(metax-k8s-images.<ver>.run push DOMAIN/PROJECT) and C(helm push) in one).
  - "O(src) may be a docker-archive tar (C(docker save), C(podman save)), an OCI layout directory or tar,
    a packaged Helm chart C(.tgz) (pushed so that C(helm pull oci://...) and C(helm install oci://...) work;
    the tag is the chart version with C(+) written as C(_)), or an offline bundle written by M(metax.gpu.offline_bundle)."
  - Blobs already in the registry are skipped; a blob that exists in another repository of the same registry
    is mounted; a blob whose upload is cut restarts alone with a new upload session; the tag is written only
    after every blob is confirmed present. An unchanged artifact costs one HEAD request.
  - Layers are converted to O(compression) once and cached in O(cache_dir); already-compressed layers
    of the requested kind are pushed as they are.
  - "The vendor's xz-compressed MXMACA base images (manual section 1.4.3, C(maca-c500-container-<ver>-ubuntu18.04-amd64.xz)
    loading as C(cr.metax-tech.com/library/maca-c500:<ver>), C(mxc500-maca-<ver>-ubuntu20.04-amd64.container.xz) loading as
    C(mxc500-maca:<ver>)) are pushed straight from the C(.xz) file, recognised by its magic bytes, as
    C(DOMAIN/PROJECT/<last part of the image's name>:<its tag>). Each layer is decompressed, hashed, compressed
    and uploaded in one streaming pass (no docker, no temporary copy on disk, bounded memory); an unchanged
    archive is recognised by its size, mtime and first and last MiB without decompressing it."
author:
  - MetaX GPU collection maintainers (@metax-gpu)
attributes:
  check_mode:
    support: full
    description: Reports per artifact whether it would be pushed and how many bytes would be uploaded; writes nothing to the registry.
  diff_mode:
    support: none
    description: The per-artifact results describe what changed.
  platform:
    support: full
    platforms: posix
    description: Runs on the controller (the bastion).
options:
  src:
    description:
      - A docker-archive, an xz-compressed docker-archive (the vendor's MACA images), an OCI layout (directory or tar),
        a Helm chart C(.tgz), or a C(metax-k8s-images.<ver>.run) bundle.
    type: path
    required: true
  registry:
    description:
      - C(DOMAIN[:port]) or C(DOMAIN[:port]/PROJECT), without a scheme; a port out of 1-65535 is refused.
      - "Every repository written (project and name) and every tag must match the OCI distribution grammar,
        whether it comes from the options or from O(src) (a chart's name, C(RepoTags), a bundle's header);
        a name such as C(../library/busybox) is refused, not normalised into another project."
    type: str
    required: true
  project:
    description: Project path below the registry, appended to what O(registry) already holds.
    type: str
    default: ""
  repository:
    description: Repository name below the project instead of the one in O(src) (sources holding one artifact only).
    type: str
    default: ""
  tag:
    description: Tag instead of the one in O(src) (sources holding one artifact only).
    type: str
    default: ""
  username:
    description: Registry user. Without it, credentials come from O(auth_file) or the docker/podman auth files.
    type: str
    default: ""
  password:
    description: Registry password or token.
    type: str
    default: ""
  auth_file:
    description:
      - A docker C(config.json) or podman C(auth.json). Empty means C($REGISTRY_AUTH_FILE),
        C($XDG_RUNTIME_DIR/containers/auth.json), C(~/.config/containers/auth.json), C(~/.docker/config.json).
    type: path
    default: ""
  validate_certs:
    description: Verify the registry's TLS certificate.
    type: bool
    default: true
  ca_path:
    description: CA bundle that signed the registry's certificate.
    type: path
    default: ""
    aliases: [ca_file]
  plain_http:
    description: Talk plain HTTP (a registry without TLS, such as a local C(registry:2) on port 5000).
    type: bool
    default: false
    aliases: [insecure]
  compression:
    description:
      - Layer compression in the registry. V(gzip) is pulled by every runtime the manual supports (docker 18.09,
        containerd 1.5); V(zstd) needs containerd 1.5+ / docker 23+ and uses OCI media types; V(none) sends layers as they are.
    type: str
    choices: [gzip, zstd, none]
    default: gzip
  concurrency:
    description: Blobs uploaded (and layers compressed) in parallel.
    type: int
    default: 4
  cache_dir:
    description: Cache of converted layers. Empty means C(~/.cache/metax-gpu/layers).
    type: path
    default: ""
  kinds:
    description: Push only these kinds of artifact from O(src) (for a bundle, V(image) or V(chart)); empty means all.
    type: list
    elements: str
    choices: [image, chart, index]
    default: []
requirements:
  - requests
  - isal (optional, fast gzip), zstandard (for O(compression=zstd))
seealso:
  - module: metax.gpu.offline_bundle
  - name: The registry and the offline bundle
    description: Client design, bundle format and the benchmark against skopeo.
    link: https://example.invalid/metax/gpu/docs/registry.md
"""

EXAMPLES = r"""
- name: Push every image and chart of the offline bundle (the manual's "run push DOMAIN/PROJECT")
  metax.gpu.registry_push:
    src: /var/tmp/metax-gpu-images/metax-k8s-images.0.1.0.run
    registry: harbor.example.com/metax
    username: "{{ registry_user }}"
    password: "{{ registry_password }}"
    ca_path: /etc/pki/harbor-ca.crt

- name: Push a docker-archive (docker save / podman save) to a plain-HTTP registry
  metax.gpu.registry_push:
    src: /var/tmp/metax-gpu-images/gpu-device-0.1.0.tar
    registry: 127.0.0.1:5000/metax-gpu
    plain_http: true

- name: Push an OCI layout directory under another name and tag, zstd-compressed
  metax.gpu.registry_push:
    src: /srv/images/gpu-label
    registry: harbor.example.com
    project: metax
    repository: gpu-label
    tag: 0.1.0-zstd
    compression: zstd

- name: Push an OCI archive tar with credentials from podman login
  metax.gpu.registry_push:
    src: /var/tmp/gpu-aware.oci.tar
    registry: harbor.example.com/metax
    auth_file: /run/user/0/containers/auth.json

- name: Push the vendor's MXMACA base image straight from its .xz file (becomes harbor.example.com/metax/maca-c500:2.23.0.4)
  metax.gpu.registry_push:
    src: /srv/maca/maca-c500-container-2.23.0.4-ubuntu18.04-amd64.xz
    registry: harbor.example.com/metax
  register: maca

- name: Push the Helm chart (then helm install oci://harbor.example.com/metax/metax-gpu-extensions --version 0.1.0)
  metax.gpu.registry_push:
    src: /var/tmp/metax-gpu-images/metax-gpu-extensions-0.1.0.tgz
    registry: harbor.example.com/metax

- name: See what would be uploaded
  metax.gpu.registry_push:
    src: /var/tmp/metax-gpu-images/metax-k8s-images.0.1.0.run
    registry: harbor.example.com/metax
  check_mode: true
  register: plan
"""

RETURN = r"""
artifacts:
  description: One entry per artifact pushed or found unchanged.
  returned: always
  type: list
  elements: dict
  contains:
    ref:
      description: The reference written, C(DOMAIN/PROJECT/NAME:TAG).
      type: str
      sample: harbor.example.com/metax/gpu-device:0.1.0
    digest:
      description: Manifest digest (null in check mode when a layer still needs converting).
      type: str
      sample: sha256:827bda51f4ad00758b8fa39579e339145b5a7ada41ac3a104c36b70f50d38ff6
    kind:
      description: V(image), V(chart) or V(index).
      type: str
    changed:
      description: Whether the tag was (or would be) written.
      type: bool
    bytes_uploaded:
      description: Bytes sent.
      type: int
    blobs_uploaded:
      description: Blobs sent.
      type: int
    blobs_mounted:
      description: Blobs mounted from another repository of the registry.
      type: int
    blobs_skipped:
      description: Blobs already in the repository.
      type: int
    would_upload_bytes:
      description: Check mode, bytes that a real run would send (an C(.xz) archive never pushed before, its file size).
      type: int
    source:
      description: The C(.xz) archive the image came from.
      type: str
      returned: for an C(.xz) archive
    layers:
      description: The layers streamed from an C(.xz) archive in this run (on the first image written), with their timing.
      type: list
      elements: dict
      returned: for an C(.xz) archive
      contains:
        member:
          description: The layer's path inside the archive.
          type: str
        diff_id:
          description: Digest of the uncompressed layer (checked against the image config).
          type: str
        digest:
          description: Digest of the blob in the registry.
          type: str
        uncompressed:
          description: Uncompressed bytes.
          type: int
        size:
          description: Bytes sent (compressed).
          type: int
        seconds:
          description: Wall time of the layer's pass (decompress, hash, compress, upload).
          type: float
        mib_per_s:
          description: Uncompressed MiB per second.
          type: float
    progress:
      description:
        - "Progress of the streamed layers, a line every 10 seconds and one at the end of each layer
          (bytes done of the layer's size, rate, ETA), for example
          C(3f2a.../layer.tar (9100 MiB): 2.10 of 8.89 GiB (24%), 185 MiB/s, ETA 38 s)."
      type: list
      elements: str
      returned: for an C(.xz) archive
pushed:
  description: The entries of RV(artifacts) that were (or would be) written.
  returned: always
  type: list
  elements: dict
skipped:
  description: The entries of RV(artifacts) already present with the same digest.
  returned: always
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.metax.gpu.plugins.module_utils.errors import MetaxGpuError
from ansible_collections.metax.gpu.plugins.module_utils.registry import api
from ansible_collections.metax.gpu.plugins.module_utils.registry.client import HAS_REQUESTS, REQUESTS_IMPORT_ERROR

ARGSPEC = dict(
    src=dict(type="path", required=True),
    registry=dict(type="str", required=True),
    project=dict(type="str", default=""),
    repository=dict(type="str", default=""),
    tag=dict(type="str", default=""),
    username=dict(type="str", default=""),
    password=dict(type="str", default="", no_log=True),
    auth_file=dict(type="path", default=""),
    validate_certs=dict(type="bool", default=True),
    ca_path=dict(type="path", default="", aliases=["ca_file"]),
    plain_http=dict(type="bool", default=False, aliases=["insecure"]),
    compression=dict(type="str", choices=["gzip", "zstd", "none"], default="gzip"),
    concurrency=dict(type="int", default=4),
    cache_dir=dict(type="path", default=""),
    kinds=dict(type="list", elements="str", choices=["image", "chart", "index"], default=[]),
)


def main() -> None:
    module = AnsibleModule(argument_spec=ARGSPEC, supports_check_mode=True)
    if not HAS_REQUESTS:
        module.fail_json(msg=missing_required_lib("requests"), exception=str(REQUESTS_IMPORT_ERROR))
    p = module.params
    registry = p["registry"].rstrip("/")
    if p["project"]:
        registry += "/" + p["project"].strip("/")
    req = api.PushRequest(src=p["src"], registry=registry, repository=p["repository"], tag=p["tag"],
                          username=p["username"], password=p["password"], auth_file=p["auth_file"],
                          validate_certs=p["validate_certs"], ca_path=p["ca_path"], plain_http=p["plain_http"],
                          compression=p["compression"], concurrency=max(1, p["concurrency"]), cache_dir=p["cache_dir"],
                          check_mode=module.check_mode, only=p["kinds"])
    try:
        result = api.push(req)
    except MetaxGpuError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
