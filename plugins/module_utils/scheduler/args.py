# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Options of metax.gpu.scheduler_extender and their translation into a backend Request."""

from __future__ import annotations

from typing import Any, Mapping
from urllib.parse import urlsplit

from ansible_collections.metax.gpu.plugins.module_utils.common import node_path
from ansible_collections.metax.gpu.plugins.module_utils.names import RESOURCE_NAME
from ansible_collections.metax.gpu.plugins.module_utils.scheduler import config as cfg
from ansible_collections.metax.gpu.plugins.module_utils.scheduler.backend import Request

ARGUMENT_SPEC = {
    "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
    "url": {"type": "str"},
    "filter_verb": {"type": "str", "default": "filter"},
    "prioritize_verb": {"type": "str", "default": "prioritize"},
    "weight": {"type": "int", "default": 500},
    "enable_https": {"type": "bool", "default": False},
    # kube-scheduler's ExtenderTLSConfig; keyData is a private key: never in output (no_log, masked diff)
    "tls_config": {"type": "dict", "options": {
        "insecure": {"type": "bool"},
        "serverName": {"type": "str"},
        "certFile": {"type": "str"},
        "keyFile": {"type": "str", "no_log": False},   # a path to the key, not the key
        "caFile": {"type": "str"},
        "certData": {"type": "str"},
        "keyData": {"type": "str", "no_log": True},
        "caData": {"type": "str"},
    }},
    "node_cache_capable": {"type": "bool", "default": False},
    "ignorable": {"type": "bool", "default": False},
    "http_timeout": {"type": "str"},
    "managed_resources": {"type": "list", "elements": "str", "default": [RESOURCE_NAME]},
    "manifest_path": {"type": "path", "default": "/etc/kubernetes/manifests/kube-scheduler.yaml"},
    "config_path": {"type": "path", "default": "/etc/metax/extender.yaml"},
    "backup_dir": {"type": "path", "default": "/etc/kubernetes/metax-backup"},
    "kubernetes_version": {"type": "str"},
    "wait": {"type": "bool", "default": True},
    "wait_timeout": {"type": "int", "default": 180},
    "health_url": {"type": "str"},
    "check_extender": {"type": "bool", "default": True},
}


SECRET_TLS_KEYS = ("keyData",)


def check_url(value: str, option: str) -> str:
    """An http(s) URL with a host and, if given, a port 1-65535 (what kube-scheduler can call)."""
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as exc:
        raise cfg.SchedulerConfigError("%s %r is not a URL: %s" % (option, value, exc)) from exc
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in value):
        raise cfg.SchedulerConfigError("%s %r is not an http(s) URL with a host (for example http://10.96.12.34:8080)"
                                       % (option, value))
    if port == 0:
        raise cfg.SchedulerConfigError("%s %r: the port must be 1-65535" % (option, value))
    return value


def tls_config(value: Any) -> Any:
    """The options given (Ansible fills the ones not given with None: they are not written)."""
    if not value:
        return None
    return {key: item for key, item in value.items() if item is not None} or None


def request_from_params(params: Mapping[str, Any]) -> Request:
    """Validated Request; bad extender options fail here, before anything is read or written."""
    if params["wait_timeout"] <= 0:
        raise cfg.SchedulerConfigError("wait_timeout must be positive (got %d)" % params["wait_timeout"])
    for option in ("manifest_path", "config_path", "backup_dir"):
        node_path(params[option], option)
    if params["health_url"]:
        check_url(params["health_url"], "health_url")
    options = None
    if params["state"] == "present":
        check_url(params["url"], "url")
        options = cfg.ExtenderOptions(
            url=params["url"], filter_verb=params["filter_verb"] or "",
            prioritize_verb=params["prioritize_verb"] or "", weight=params["weight"],
            enable_https=params["enable_https"], tls_config=tls_config(params["tls_config"]),
            node_cache_capable=params["node_cache_capable"], ignorable=params["ignorable"],
            http_timeout=params["http_timeout"], managed_resources=list(params["managed_resources"] or []))
        cfg.build_extender(options)     # validates as kube-scheduler would
    return Request(
        state=params["state"], manifest_path=params["manifest_path"], config_path=params["config_path"],
        backup_dir=params["backup_dir"], options=options, kubernetes_version=params["kubernetes_version"],
        wait=params["wait"], wait_timeout=float(params["wait_timeout"]), health_url=params["health_url"],
        check_extender=params["check_extender"])
