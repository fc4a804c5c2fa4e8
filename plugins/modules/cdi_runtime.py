#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
module: cdi_runtime
short_description: Make a node's container runtime read CDI for MetaX GPUs, or take that back
version_added: 0.1.0
description:
  - The node side of C(docs/runtime.md), the same code as the GPU Operator's container-runtime component.
  - V(present) changes only what the runtime needs to read CDI specs (C(/etc/cdi), C(/var/run/cdi)).
    containerd 2.x and CRI-O read them already - nothing changes. containerd 1.7 gets a drop-in,
    C(/etc/containerd/conf.d/99-metax-gpu-cdi.toml), a copy of the main config's CRI tables with
    C(enable_cdi) and C(cdi_spec_dirs) added (containerd 1.x replaces a plugin's section with an imported one),
    and an C(imports) entry naming it in C(/etc/containerd/config.toml) unless an import covers it already.
    Docker 25 and later gets C(features.cdi=true) in C(/etc/docker/daemon.json). Older runtimes cannot
    read CDI - nothing changes, and gpu-device or metax-docker hand over device nodes instead.
  - containerd also gets the runtime handler C(metax), which the RuntimeClass C(metax) of real MetaX clusters
    names, beside its other runtimes - a copy of the default runtime's tables (runc on a stock node), never
    the default. containerd 2.x gets a drop-in (same path) with only that handler (it merges imported tables key
    by key); containerd 1.x gets it in the drop-in's copy of the CRI tables. A C(metax) runtime the node has
    already (MetaX's own runtime defines one) is left as it is. Without C(/etc/containerd/config.toml) it is not
    added (containerd 1.7 excepted, which gets a config for CDI anyway).
  - It never sets or changes a default runtime.
  - Before a file is first changed its original bytes (or its absence) and mode are kept in O(state_file);
    V(absent) puts every file back byte-identical, unless it was changed by someone else since (it is then
    left as it is and reported in RV(kept)).
  - The runtime reads these files only when it starts. The module does not restart it; it returns RV(restart),
    the service to restart, and RV(restart_safe), false when a restart would stop running containers (Docker
    without C(live-restore)). The role C(metax.gpu.container_runtime) restarts it when safe.
  - With O(write_spec) it also writes the node's CDI spec once (for hosts where gpu-device does not keep it).
author:
  - MetaX GPU collection maintainers (@metax-gpu)
extends_documentation_fragment:
  - metax.gpu.host_root
attributes:
  check_mode:
    support: full
    description: Reports the files it would change and the restart it would need, and changes nothing.
  diff_mode:
    support: full
    description: Shows each changed file before and after.
  platform:
    support: full
    platforms: posix
    description: Runs on the node (Python 3.8 or later, standard library only).
options:
  state:
    description:
      - V(present) makes the runtime read CDI; V(absent) reverts every file this module changed.
    type: str
    choices: [present, absent]
    default: present
  runtime:
    description:
      - The runtime to configure. Its version comes from O(runtime_version), else from C(containerd --version) or
        C(docker version) on the node.
    type: str
    choices: [containerd, docker]
    default: containerd
  runtime_version:
    description:
      - The runtime and version as a Kubernetes Node reports them (C(containerd://1.7.24), C(docker://26.1.3)),
        instead of asking the runtime's tool.
      - Unset, the tool is asked; under a O(host_root) other than C(/) the node's own binary under that root
        (through C(chroot)), never the one of the machine the module runs on. Without it there, the module fails.
    type: str
  state_file:
    description: Where the originals of changed files are kept, on the node (under O(host_root)).
    type: path
    default: /var/lib/metax-gpu/container-runtime/state.json
  write_spec:
    description:
      - Also write the node's CDI spec (C(/var/run/cdi/metax-tech.com-gpu.json)) from its devices and MXMACA,
        when O(state=present). On Kubernetes nodes gpu-device keeps it current; on Docker hosts the watcher
        (C(docs/runtime.md)) does.
    type: bool
    default: false
  spec_dir:
    description: The directory of the spec written with O(write_spec), on the node.
    type: path
    default: /var/run/cdi
notes:
  - Tested with a copy of a real node's containerd config after MetaX's own operator rewrote it; the revert leaves
    it byte-identical.
seealso:
  - name: Containers without MXMACA
    description: CDI, the fallback, metax-docker, and how to undo every change.
    link: https://example.invalid/metax/gpu/docs/runtime.md
"""

EXAMPLES = r"""
- name: Let containerd read the CDI specs of MetaX GPUs
  metax.gpu.cdi_runtime:
  register: cdi

- name: Restart containerd to read them (running containers keep running)
  ansible.builtin.service:
    name: "{{ cdi.restart }}"
    state: restarted
  when: cdi.changed and cdi.restart and cdi.restart_safe

- name: A Docker host without Kubernetes, spec included
  metax.gpu.cdi_runtime:
    runtime: docker
    write_spec: true

- name: Take it all back
  metax.gpu.cdi_runtime:
    state: absent
"""

RETURN = r"""
runtime_version:
  description: The runtime as the module judged it.
  returned: always
  type: str
  sample: containerd://1.7.24
reason:
  description: What the runtime needs, in one line.
  returned: always
  type: str
  sample: "containerd://1.7.24: CDI enabled by a drop-in"
files:
  description: Node paths written, restored or removed (would be, in check mode).
  returned: always
  type: list
  elements: str
  sample: [/etc/containerd/config.toml, /etc/containerd/conf.d/99-metax-gpu-cdi.toml]
kept:
  description: With O(state=absent), files changed by someone else since, left as they are.
  returned: always
  type: list
  elements: str
  sample: []
restart:
  description: The service to restart for the runtime to read the change; null when none is needed.
  returned: always
  type: str
  sample: containerd
restart_safe:
  description: Whether that restart keeps running containers (containerd; Docker only with live-restore).
  returned: always
  type: bool
  sample: true
spec:
  description: With O(write_spec), the spec file and whether it changed.
  returned: when O(write_spec) and O(state=present)
  type: dict
  sample: {path: /var/run/cdi/metax-tech.com-gpu.json, changed: true}
"""


from ansible.module_utils.basic import AnsibleModule

from ansible_collections.metax.gpu.plugins.module_utils.cdi import runtime_config, runtime_state
from ansible_collections.metax.gpu.plugins.module_utils.cdi.writer import refresh
from ansible_collections.metax.gpu.plugins.module_utils.common import (
    HOST_ROOT_ARGSPEC, InvalidOption, checked_host_root, merged_spec, node_path)
from ansible_collections.metax.gpu.plugins.module_utils.errors import MetaxGpuError

ARGUMENT_SPEC = {
    "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
    "runtime": {"type": "str", "choices": ["containerd", "docker"], "default": "containerd"},
    "runtime_version": {"type": "str"},
    "state_file": {"type": "path", "default": runtime_state.STATE_FILE},
    "write_spec": {"type": "bool", "default": False},
    "spec_dir": {"type": "path", "default": "/var/run/cdi"},
}
# where the node's runtime binary is looked for under a host root
TOOL_DIRS = ("usr/bin", "bin", "usr/sbin", "sbin", "usr/local/bin", "usr/local/sbin")
VERSION_COMMANDS = {"containerd": ["containerd", "--version"],
                    "docker": ["docker", "version", "--format", "{{.Server.Version}}"]}


def _text(host, path):
    return host.read_text(path) if host.exists(path) else None


def _diff(host, edits):
    out = []
    for edit in edits:
        before = _text(host, edit.path)
        out.append({"before_header": edit.path, "after_header": edit.path, "before": before or "",
                    "after": edit.content.decode("utf-8") if edit.content is not None else ""})
    return out


def _version_command(host, runtime):
    """The runtime's own version command on the node: under a host root, the node's binary, never
    the one of the machine the module runs on."""
    argv = VERSION_COMMANDS[runtime]
    if host.path == "/":
        return argv
    local = host.which(argv[0], TOOL_DIRS)
    if local is None:
        raise InvalidOption("%s is not installed under host_root %s (looked in %s); set runtime_version"
                            % (argv[0], host.path, ", ".join("/" + d for d in TOOL_DIRS)))
    return [local] + argv[1:] if host.is_simulated() else ["chroot", host.path] + argv


def main():
    module = AnsibleModule(argument_spec=merged_spec(HOST_ROOT_ARGSPEC, ARGUMENT_SPEC), supports_check_mode=True)
    params = module.params
    try:
        host = checked_host_root(params["host_root"])
        node_path(params["state_file"], "state_file")
        node_path(params["spec_dir"], "spec_dir")
        command = None if params["runtime_version"] else _version_command(host, params["runtime"])
    except MetaxGpuError as exc:
        module.fail_json(msg=str(exc))
    version = params["runtime_version"]
    if not version:
        rc, out, err = module.run_command(command)
        version = runtime_config.runtime_version_of(params["runtime"], out) if rc == 0 else None
        if version is None:
            module.fail_json(msg="cannot tell the %s version: %s" % (params["runtime"], (err or out).strip()))
    files = runtime_state.config_files(host)
    plan = runtime_config.plan(version, files)
    result = {"changed": False, "runtime_version": version, "reason": plan.reason, "files": [], "kept": [],
              "restart": plan.restart, "restart_safe": plan.restart_safe}
    if params["state"] == "absent":
        recorded = runtime_state.load_state(host, params["state_file"])
        if module.check_mode:
            result["files"] = sorted(recorded)
        else:
            outcome = runtime_state.revert(host, params["state_file"])
            result.update(files=outcome.changed, kept=outcome.kept)
            if outcome.messages:
                module.warn("; ".join(outcome.messages))
        result["changed"] = bool(result["files"])
        if not result["changed"]:
            result["restart"] = None
        module.exit_json(**result)
    pending = runtime_state.pending(host, plan)
    if module._diff:
        result["diff"] = _diff(host, pending)
    if not module.check_mode:
        outcome = runtime_state.apply(host, plan, params["state_file"])
        result["files"] = outcome.changed
        if params["write_spec"]:
            spec = refresh(host, params["spec_dir"] if host.path == "/" else host.join(params["spec_dir"]))
            result["spec"] = {"path": spec.path, "changed": spec.changed}
            result["changed"] = spec.changed
    else:
        result["files"] = [e.path for e in pending]
    result["changed"] = bool(result["files"]) or result["changed"]
    if not result["files"]:
        result["restart"] = None      # nothing changed: nothing to restart for
    module.exit_json(**result)


if __name__ == "__main__":
    main()
