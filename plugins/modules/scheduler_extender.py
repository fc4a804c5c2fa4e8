#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
module: scheduler_extender
short_description: Enable or disable the gpu-aware extender in a static-pod kube-scheduler, safely
version_added: 0.1.0
description:
  - Does the manual's section 2.1.5 steps 2 to 5 on a kubeadm control-plane node. Writes the
    KubeSchedulerConfiguration with the gpu-aware extender (O(config_path)) and points the kube-scheduler
    static pod at it (C(--config), a C(File) hostPath volume and its read-only mount).
  - The configuration's apiVersion follows the Kubernetes version (C(v1beta3) for 1.23 and 1.24, C(v1)
    from 1.25); below 1.23 the module refuses. When the scheduler already runs with a C(--config), the
    extender is merged into that configuration and everything else (profiles, other extenders,
    clientConnection, leaderElection) is kept; O(state=absent) puts the previous C(--config) back.
  - The manifest is edited as text, so comments, key order and quoting stay; O(state=absent) removes
    exactly what O(state=present) added.
  - Before a change, both files are copied to a timestamped directory under O(backup_dir) (never in the
    static pod directory, where the kubelet would run the copy). Files are replaced through a
    dot-prefixed temporary file and a rename.
  - With O(wait=true), the module waits until a new kube-scheduler process runs with the new
    configuration and its health endpoint answers (and, unless O(ignorable=true), the extender is
    reachable from the scheduler's network). If not within O(wait_timeout), it restores the backup,
    waits for the scheduler to be healthy again and fails, saying what it saw and where the backup is.
  - With O(wait=true) and the running scheduler visible, a changed manifest is taken out of the static
    pod directory until the kubelet has stopped the old pod, and written after that, because the kubelet
    starts a static pod whose predecessor is still terminating only 10-15 s later. An error or a
    SIGTERM/SIGHUP in between still ends with a manifest written (the new one, else the previous one);
    the backup holds it in case of a SIGKILL or power loss.
  - After a C(kubeadm upgrade), which rewrites the manifest without the patch, check mode reports
    C(drift=true) and a run puts the patch back.
author:
  - MetaX GPU collection maintainers (@metax-gpu)
extends_documentation_fragment:
  - metax.gpu.host_root
attributes:
  check_mode:
    support: full
    description: Reports what would change, including drift, and writes nothing.
  diff_mode:
    support: full
    description: Before and after of the manifest and of the extender configuration.
  platform:
    support: full
    platforms: posix
    description: Runs on a control-plane node whose kubelet runs kube-scheduler as a static pod.
options:
  state:
    description:
      - V(present) enables the extender, V(absent) removes what the module added and puts back a
        previous C(--config).
    type: str
    choices: [present, absent]
    default: present
  url:
    description:
      - The extender's urlPrefix, for example C(http://<ClusterIP of the gpu-aware Service>:8080).
      - Required when O(state=present). An C(http) or C(https) URL with a host; anything else is refused.
    type: str
  filter_verb:
    description: Verb appended to O(url) for filtering (the manual's C(filterVerb)).
    type: str
    default: filter
  prioritize_verb:
    description: Verb appended to O(url) for scoring (C(prioritizeVerb)); empty disables scoring.
    type: str
    default: prioritize
  weight:
    description: Weight of the extender's scores; must be greater than 0 when O(prioritize_verb) is set.
    type: int
    default: 500
  enable_https:
    description: Call the extender over HTTPS (C(enableHTTPS)).
    type: bool
    default: false
  tls_config:
    description:
      - The extender's C(tlsConfig), written as given (options not given are not written).
      - When it holds O(tls_config.keyData), the configuration file is written mode C(0600) and the diff shows
        the key as a mask with a fingerprint.
    type: dict
    suboptions:
      insecure:
        description: Do not verify the extender's certificate.
        type: bool
      serverName:
        description: Server name sent for SNI and checked in the certificate.
        type: str
      certFile:
        description: Client certificate file (path inside the kube-scheduler pod).
        type: str
      keyFile:
        description: Client key file (path inside the kube-scheduler pod).
        type: str
      caFile:
        description: CA file that signed the extender's certificate.
        type: str
      certData:
        description: Client certificate, base64 PEM.
        type: str
      keyData:
        description: Client private key, base64 PEM. Never shown in the module's output (C(no_log)).
        type: str
      caData:
        description: CA certificate, base64 PEM.
        type: str
  node_cache_capable:
    description: Send node names only (C(nodeCacheCapable)).
    type: bool
    default: false
  ignorable:
    description:
      - Schedule GPU pods without the extender when it cannot be reached (C(ignorable)).
      - With V(false) (the manual's setting) an unreachable extender blocks pods asking for MetaX GPUs,
        so O(wait) also checks that the extender is reachable from the scheduler's network.
    type: bool
    default: false
  http_timeout:
    description: The extender call timeout as a Go duration (C(5s), C(1m)); unset means the scheduler's 5s.
    type: str
  managed_resources:
    description:
      - Extended resources the extender manages; only pods asking for one of them go through it.
    type: list
    elements: str
    default: [metax-tech.com/gpu]
  manifest_path:
    description: The kube-scheduler static pod manifest (node path, under O(host_root); absolute, without C(..)).
    type: path
    default: /etc/kubernetes/manifests/kube-scheduler.yaml
  config_path:
    description:
      - The extender configuration the module owns (node path, under O(host_root)); the manual's path.
      - Must not be in the static pod directory.
    type: path
    default: /etc/metax/extender.yaml
  backup_dir:
    description:
      - Where timestamped backups go (node path, under O(host_root)). Must be outside the static pod
        directory.
    type: path
    default: /etc/kubernetes/metax-backup
  kubernetes_version:
    description:
      - The Kubernetes version of the scheduler (C(1.28), C(v1.28.3)); default from the manifest's image tag.
    type: str
  wait:
    description:
      - Wait for the restarted scheduler to be healthy, and roll back when it is not.
    type: bool
    default: true
  wait_timeout:
    description:
      - Seconds to wait for the scheduler after a change, and again after a rollback.
      - Before each of the two waits, the old scheduler pod gets up to half of this (at most 60 s) to stop
        while its manifest is out, so a failing change takes at most about three times this long.
    type: int
    default: 180
  health_url:
    description:
      - The scheduler's health URL; default from the manifest's probe (C(/readyz) from 1.32, C(/healthz)
        before), on C(https://127.0.0.1:10259).
    type: str
  check_extender:
    description:
      - When waiting with O(ignorable=false), also require a TCP connection to O(url) from the scheduler's
        network namespace.
    type: bool
    default: true
notes:
  - Run it on one control-plane node at a time (C(serial=1)), so an HA control plane always keeps a scheduler.
  - Needs PyYAML on the node (a dependency of ansible-core).
  - When only the configuration changes (a new weight or URL), the kubelet has nothing to restart; the
    module stops the kube-scheduler process so that the kubelet starts it again with the new file.
seealso:
  - name: Scheduler extender page of the collection
    description: What the module changes, the backup layout, rollback and drift.
    link: https://example.invalid/metax/gpu/docs/scheduler-extender.md
"""

EXAMPLES = r"""
- name: Enable gpu-aware in the control plane's scheduler
  metax.gpu.scheduler_extender:
    url: http://10.96.12.34:8080

- name: Report drift after a kubeadm upgrade without changing anything
  metax.gpu.scheduler_extender:
    url: http://10.96.12.34:8080
  check_mode: true
  register: extender

- name: Disable it again (puts back a previous --config)
  metax.gpu.scheduler_extender:
    state: absent
"""

RETURN = r"""
msg:
  description: What the module found or did, in words (drift after a kubeadm upgrade is said here).
  returned: always
  type: str
  sample: the gpu-aware extender was enabled or updated
drift:
  description: The extender configuration exists but the manifest lost the patch (C(kubeadm upgrade)).
  returned: always
  type: bool
backup:
  description: Directory holding the files as they were before the change (absent files as C(<name>.absent)).
  returned: changed and not check mode
  type: str
  sample: /etc/kubernetes/metax-backup/20261123T091500-4242
kubernetes_version:
  description: The Kubernetes minor version the configuration was written for.
  returned: state is present
  type: str
  sample: "1.28"
api_version:
  description: The KubeSchedulerConfiguration apiVersion written.
  returned: state is present
  type: str
  sample: kubescheduler.config.k8s.io/v1
previous_config:
  description: The C(--config) argument the extender configuration replaced (and absent puts back).
  returned: always
  type: str
health_url:
  description: The URL checked for the scheduler's health.
  returned: always
  type: str
  sample: https://127.0.0.1:10259/readyz
waited:
  description: Whether the module waited for the scheduler to restart.
  returned: always
  type: bool
restarted:
  description: Whether the module stopped kube-scheduler so that the kubelet restarts it with a changed configuration.
  returned: always
  type: bool
manifest_path:
  description: The manifest path on the node.
  returned: always
  type: str
config_path:
  description: The configuration path on the node.
  returned: always
  type: str
"""


from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.metax.gpu.plugins.module_utils.common import HOST_ROOT_ARGSPEC, checked_host_root, merged_spec
from ansible_collections.metax.gpu.plugins.module_utils.errors import MetaxGpuError
from ansible_collections.metax.gpu.plugins.module_utils.scheduler import yamlsupport
from ansible_collections.metax.gpu.plugins.module_utils.scheduler.args import ARGUMENT_SPEC, request_from_params
from ansible_collections.metax.gpu.plugins.module_utils.scheduler.backend import SchedulerExtender


def drift_message(req, check_mode):
    return ("the kube-scheduler manifest %s no longer runs with %s (rewritten by kubeadm upgrade?); %s"
            % (req.manifest_path, req.config_path,
               "a run without check mode puts the patch back" if check_mode else "the patch was put back"))


def summary(req, outcome, check_mode):
    """What happened, in one sentence (the gpu_aware role's verify step prints it)."""
    if outcome.drift:
        return drift_message(req, check_mode)
    verb = "would be" if check_mode else "was"
    if not outcome.changed:
        return "the gpu-aware extender is already %s" % ("enabled" if req.state == "present" else "disabled")
    return "the gpu-aware extender %s %s" % (verb, "enabled or updated" if req.state == "present" else "disabled")


def main():
    module = AnsibleModule(argument_spec=merged_spec(HOST_ROOT_ARGSPEC, ARGUMENT_SPEC), supports_check_mode=True,
                           required_if=[("state", "present", ("url",))])
    if not yamlsupport.HAS_YAML:
        module.fail_json(msg=missing_required_lib("PyYAML"), exception=yamlsupport.YAML_IMPORT_ERROR)
    params = module.params
    try:
        backend = SchedulerExtender(checked_host_root(params["host_root"]))
        req = request_from_params(params)
        outcome = backend.plan(req)
        if outcome.drift:
            module.warn(drift_message(req, module.check_mode))
        if not module.check_mode:
            outcome = backend.apply(req, outcome)
    except MetaxGpuError as exc:
        module.fail_json(msg=str(exc), manifest_path=params["manifest_path"], config_path=params["config_path"])
    for warning in outcome.warnings:
        module.warn(warning)
    result = dict(
        msg=summary(req, outcome, module.check_mode), changed=outcome.changed, drift=outcome.drift, previous_config=outcome.previous_config,
        health_url=outcome.health_url, waited=outcome.waited, restarted=outcome.restarted,
        manifest_path=req.manifest_path, config_path=req.config_path)
    if outcome.kubernetes_version:
        result.update(kubernetes_version=outcome.kubernetes_version, api_version=outcome.api_version)
    if outcome.backup:
        result["backup"] = backend.host.join(outcome.backup)
    if module._diff:
        result["diff"] = outcome.diff()
    module.exit_json(**result)


if __name__ == "__main__":
    main()
