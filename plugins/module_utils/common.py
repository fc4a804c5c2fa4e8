# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Argument specs shared by the node-side modules (kept next to the doc fragments)."""

from __future__ import annotations

import copy
import os
from typing import Any, Dict

from ansible_collections.metax.gpu.plugins.module_utils.errors import MetaxGpuError
from ansible_collections.metax.gpu.plugins.module_utils.host import HostRoot

HOST_ROOT_ARGSPEC = {
    "host_root": {"type": "path", "default": "/"},
}

# The modules that talk to the API server (doc fragment metax.gpu.k8s_auth): kubernetes.core's connection
# options with its names, types and aliases (its args_common.AUTH_ARG_SPEC), so a play moves its connection
# settings between kubernetes.core.k8s_* tasks and ours unchanged. The K8S_AUTH_* fallbacks are read by
# kube/client.auth_from_params. Two differences, both about secrets: client_key is no_log here; kubeconfig is
# not (its path is named in errors), and a kubeconfig given as a dictionary has its credentials masked by
# kube/client.module_client instead.
K8S_AUTH_PROXY_HEADERS_ARGSPEC = {
    "proxy_basic_auth": {"type": "str", "no_log": True},
    "basic_auth": {"type": "str", "no_log": True},
    "user_agent": {"type": "str"},
}
K8S_AUTH_ARGSPEC = {
    "host": {"type": "str"},
    "api_key": {"type": "str", "no_log": True},
    "kubeconfig": {"type": "raw"},
    "context": {"type": "str"},
    "username": {"type": "str"},
    "password": {"type": "str", "no_log": True},
    "validate_certs": {"type": "bool", "aliases": ["verify_ssl"]},
    "ca_cert": {"type": "path", "aliases": ["ssl_ca_cert"]},
    "client_cert": {"type": "path", "aliases": ["cert_file"]},
    "client_key": {"type": "path", "aliases": ["key_file"], "no_log": True},
    "proxy": {"type": "str"},
    "no_proxy": {"type": "str"},
    "proxy_headers": {"type": "dict", "options": K8S_AUTH_PROXY_HEADERS_ARGSPEC},
    "persist_config": {"type": "bool"},
    "impersonate_user": {"type": "str"},
    "impersonate_groups": {"type": "list", "elements": "str"},
}


def merged_spec(*specs: Dict[str, Any]) -> Dict[str, Any]:
    """One module's argument spec from shared ones and its own (deep copies: AnsibleModule mutates them)."""
    out: Dict[str, Any] = {}
    for spec in specs:
        out.update(copy.deepcopy(spec))
    return out


class InvalidOption(MetaxGpuError, ValueError):
    """A module option that would act on something else than the caller meant (raised before any change)."""


def checked_host_root(path: str) -> HostRoot:
    """The HostRoot of ``host_root``, refused unless it is an existing directory.

    A missing directory is not read as an empty node: every file would look absent and
    every command would run on the machine the module runs on (the bastion's own
    containerd was reported as the node's). ``""`` is refused too: HostRoot maps it to ``/``.
    """
    if not path:
        raise InvalidOption("host_root is empty: give / for the machine itself, or the directory the node is mounted at")
    host = HostRoot(path)
    host.check()
    return host


def node_path(value: str, option: str) -> str:
    """A node path option: absolute and without ``..``, so that under a host root it stays inside it."""
    if not value or not value.startswith("/") or ".." in value.split("/") or "\0" in value:
        raise InvalidOption("%s %r must be an absolute node path without '..'" % (option, value))
    return value


def local_path(value: str, option: str, must_exist: bool = False) -> str:
    """A path on the machine the module runs on, made absolute: refused when empty or holding a NUL
    byte (the operating system would raise in the middle of the work), or when it must exist and does not."""
    if not value or "\0" in value:
        raise InvalidOption("%s %r is not a path" % (option, value))
    if must_exist and not os.path.exists(value):
        raise InvalidOption("%s %s: no such file or directory" % (option, value))
    return os.path.abspath(value)
