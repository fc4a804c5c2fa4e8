# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The KubeSchedulerConfiguration that enables gpu-aware (manual section 2.1.5, Table 2.6).

Pure functions: build the extender entry, pick the apiVersion the running
Kubernetes accepts, validate as kube-scheduler's own validation does (a bad
configuration is a scheduler that does not start), merge into the
configuration the scheduler already runs with, and render the file with a
header recording what to put back on disable.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from ansible_collections.metax.gpu.plugins.module_utils.errors import MetaxGpuError
from ansible_collections.metax.gpu.plugins.module_utils.names import RESOURCE_NAME
from ansible_collections.metax.gpu.plugins.module_utils.scheduler import yamlsupport

GROUP = "kubescheduler.config.k8s.io"
KIND = "KubeSchedulerConfiguration"
MIN_VERSION = (1, 23)
# The kubeconfig kubeadm gives the scheduler; with --config the scheduler
# ignores its --kubeconfig flag, so the file must name it.
DEFAULT_KUBECONFIG = "/etc/kubernetes/scheduler.conf"
# extenderv1.MaxExtenderPriority: the scheduler multiplies it by the weight.
MAX_EXTENDER_PRIORITY = 10
MAX_INT64 = 2 ** 63 - 1
HEADER_MARK = "# metax.gpu.scheduler_extender previous-config-arg: "


class SchedulerConfigError(MetaxGpuError, ValueError):
    """A version, option or existing configuration the scheduler would not accept."""


def parse_version(text: str) -> Tuple[int, int]:
    """``1.28``, ``v1.28.3``, ``registry.k8s.io/kube-scheduler:v1.32.0`` -> ``(1, 28)``."""
    match = re.search(r"v?(\d+)\.(\d+)(?:\.\d+)?(?:[-+][0-9A-Za-z.-]*)?$", str(text).strip())
    if not match:
        raise SchedulerConfigError(
            "cannot read a Kubernetes version from %r; set kubernetes_version (for example 1.28)" % (text,))
    return int(match.group(1)), int(match.group(2))


def api_version_for(version: Tuple[int, int]) -> str:
    """v1beta3 for 1.23-1.24 (the manual's example), v1 from 1.25 (v1beta3 is gone in 1.29)."""
    if version < MIN_VERSION:
        raise SchedulerConfigError(
            "Kubernetes %d.%d is not supported: the scheduler extender configuration needs 1.23 or later "
            "(KubeSchedulerConfiguration v1beta3); upgrade the cluster first" % version)
    if version < (1, 25):
        return GROUP + "/v1beta3"
    return GROUP + "/v1"


def api_versions_accepted(version: Tuple[int, int]) -> Tuple[str, ...]:
    """Every KubeSchedulerConfiguration version the given kube-scheduler still loads."""
    names = []
    if version < (1, 26):
        names.append("v1beta2")
    if version < (1, 29):
        names.append("v1beta3")
    if version >= (1, 25):
        names.append("v1")
    return tuple(GROUP + "/" + name for name in names)


@dataclass(frozen=True)
class ExtenderOptions:
    """Table 2.6 of the manual, plus what a safe default needs (managedResources, httpTimeout)."""

    url: str
    filter_verb: str = "filter"
    prioritize_verb: str = "prioritize"
    weight: int = 500
    enable_https: bool = False
    tls_config: Optional[Dict[str, Any]] = None
    node_cache_capable: bool = False
    ignorable: bool = False
    http_timeout: Optional[str] = None
    # Only pods asking for a MetaX GPU go to the extender: an extender that is
    # down then blocks GPU pods only, never the rest of the cluster.
    managed_resources: List[str] = field(default_factory=lambda: [RESOURCE_NAME])


def build_extender(opts: ExtenderOptions) -> Dict[str, Any]:
    """The ``extenders[]`` entry, keys in the manual's order; validated."""
    entry: Dict[str, Any] = {"urlPrefix": opts.url, "enableHTTPS": bool(opts.enable_https)}
    if opts.tls_config:
        entry["tlsConfig"] = dict(opts.tls_config)
    if opts.filter_verb:
        entry["filterVerb"] = opts.filter_verb
    if opts.prioritize_verb:
        entry["prioritizeVerb"] = opts.prioritize_verb
    entry["nodeCacheCapable"] = bool(opts.node_cache_capable)
    entry["ignorable"] = bool(opts.ignorable)
    entry["weight"] = int(opts.weight)
    if opts.http_timeout:
        entry["httpTimeout"] = opts.http_timeout
    if opts.managed_resources:
        entry["managedResources"] = [{"name": name, "ignoredByScheduler": False}
                                     for name in opts.managed_resources]
    validate_extenders([entry])
    return entry


_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|\u00b5s|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "\u00b5s": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """Go's ``time.ParseDuration`` (what metav1.Duration uses), in seconds."""
    value = str(text).strip()
    sign = 1.0
    if value[:1] in "+-" and value:
        sign = -1.0 if value[0] == "-" else 1.0
        value = value[1:]
    if value == "0":
        return 0.0
    pos = 0
    total = 0.0
    while pos < len(value):
        match = _DURATION_PART.match(value, pos)
        if not match:
            raise SchedulerConfigError(
                "httpTimeout %r is not a duration (for example 5s, 1m30s, 500ms)" % (text,))
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        pos = match.end()
    if not value:
        raise SchedulerConfigError("httpTimeout is empty; leave it unset for the scheduler's 5s default")
    return sign * total


_QUALIFIED_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _qualified_name_error(name: str) -> Optional[str]:
    """apimachinery's IsQualifiedName: ``[prefix/]name``, prefix a DNS subdomain."""
    prefix, sep, base = name.rpartition("/")
    if sep and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return "prefix %r is not a DNS subdomain" % prefix
    if not _QUALIFIED_NAME.match(base):
        return "%r is not a qualified name (63 characters at most, alphanumerics, '-', '_', '.')" % base
    return None


def _extended_resource_error(name: Any) -> Optional[str]:
    """kube-scheduler's validateExtendedResourceName, as a message or None."""
    if not isinstance(name, str) or not name:
        return "the resource name is missing"
    if "/" not in name or "kubernetes.io/" in name or name.startswith("requests."):
        return "%r is not an extended resource name (it needs a domain prefix, like %s)" % (name, RESOURCE_NAME)
    error = _qualified_name_error(name) or _qualified_name_error("requests." + name)
    if error:
        return "%r is not a valid extended resource name: %s" % (name, error)
    return None


def validate_extenders(extenders: List[Dict[str, Any]]) -> None:
    """The checks kube-scheduler's validateExtenders makes, with the scheduler's reasons."""
    if not isinstance(extenders, list):
        raise SchedulerConfigError("extenders must be a list")
    binders = 0
    seen_resources: Dict[str, int] = {}
    for index, ext in enumerate(extenders):
        where = "extenders[%d]" % index
        if not isinstance(ext, dict):
            raise SchedulerConfigError("%s must be a mapping" % where)
        if not ext.get("urlPrefix"):
            raise SchedulerConfigError("%s.urlPrefix is empty: the scheduler needs the extender's address" % where)
        weight = ext.get("weight", 0)
        if not isinstance(weight, int) or isinstance(weight, bool):
            raise SchedulerConfigError("%s.weight must be an integer, not %r" % (where, weight))
        if ext.get("prioritizeVerb") and weight <= 0:
            raise SchedulerConfigError(
                "%s.weight must be greater than 0 when prioritizeVerb is set (got %d)" % (where, weight))
        if weight * MAX_EXTENDER_PRIORITY > MAX_INT64:
            raise SchedulerConfigError("%s.weight %d overflows the scheduler's score" % (where, weight))
        if ext.get("bindVerb"):
            binders += 1
        timeout = ext.get("httpTimeout")
        if timeout is not None and parse_duration(timeout) < 0:
            raise SchedulerConfigError("%s.httpTimeout must not be negative (got %s)" % (where, timeout))
        for res_index, resource in enumerate(ext.get("managedResources") or []):
            name = str(resource.get("name") or "") if isinstance(resource, dict) else ""
            error = _extended_resource_error(name)
            if error:
                raise SchedulerConfigError("%s.managedResources[%d]: %s" % (where, res_index, error))
            if name in seen_resources:
                raise SchedulerConfigError(
                    "%s.managedResources[%d]: %s is already managed by extenders[%d]; "
                    "a resource may be managed by one extender only" % (where, res_index, name,
                                                                        seen_resources[name]))
            seen_resources[name] = index
    if binders > 1:
        raise SchedulerConfigError("only one extender may implement bindVerb, %d do" % binders)


def is_ours(extender: Dict[str, Any], url: str) -> bool:
    """Our entry: same address, or the one that manages MetaX GPUs (the address changes with the Service)."""
    if extender.get("urlPrefix") == url:
        return True
    return any(isinstance(r, dict) and r.get("name") == RESOURCE_NAME
               for r in extender.get("managedResources") or [])


def parse_config(text: str, where: str) -> Dict[str, Any]:
    """An existing KubeSchedulerConfiguration file, checked enough to merge into safely."""
    try:
        data = yamlsupport.yaml.safe_load(text) if text.strip() else None
    except yamlsupport.yaml.YAMLError as exc:
        raise SchedulerConfigError("%s is not valid YAML: %s" % (where, exc))
    if not isinstance(data, dict):
        raise SchedulerConfigError("%s is not a KubeSchedulerConfiguration (not a mapping)" % where)
    if data.get("kind") != KIND or not str(data.get("apiVersion", "")).startswith(GROUP + "/"):
        raise SchedulerConfigError(
            "%s is not a KubeSchedulerConfiguration (kind %r, apiVersion %r)"
            % (where, data.get("kind"), data.get("apiVersion")))
    return data


def merge(base: Optional[Dict[str, Any]], extender: Dict[str, Any], version: Tuple[int, int],
          kubeconfig: str = DEFAULT_KUBECONFIG) -> Dict[str, Any]:
    """Our extender inside ``base`` (the configuration the scheduler already runs with), all else kept.

    Our earlier entry (see :func:`is_ours`) is replaced in place; profiles,
    other extenders, clientConnection and leaderElection are untouched.
    """
    if base is None:
        result: Dict[str, Any] = {
            "apiVersion": api_version_for(version),
            "kind": KIND,
            "clientConnection": {"kubeconfig": kubeconfig},
            "extenders": [],
        }
    else:
        result = copy.deepcopy(base)
        if result.get("apiVersion") not in api_versions_accepted(version):
            raise SchedulerConfigError(
                "the existing scheduler configuration is %s, which kube-scheduler %d.%d does not load; "
                "migrate it to %s first"
                % (result.get("apiVersion"), version[0], version[1], api_version_for(version)))
        client = result.setdefault("clientConnection", {})
        if not isinstance(client, dict):
            raise SchedulerConfigError("clientConnection in the existing scheduler configuration is not a mapping")
        client.setdefault("kubeconfig", kubeconfig)
    extenders = result.get("extenders") or []
    if not isinstance(extenders, list):
        raise SchedulerConfigError("extenders in the existing scheduler configuration is not a list")
    merged: List[Dict[str, Any]] = []
    placed = False
    for ext in extenders:
        if isinstance(ext, dict) and is_ours(ext, extender["urlPrefix"]):
            if not placed:
                merged.append(copy.deepcopy(extender))
                placed = True
            continue
        merged.append(ext)
    if not placed:
        merged.append(copy.deepcopy(extender))
    result["extenders"] = merged
    validate_extenders(merged)
    return result


def render(config: Dict[str, Any], previous_arg: Optional[str]) -> str:
    """The file we own: a header (what to put back on disable) and the configuration."""
    header = (
        "# Written by metax.gpu.scheduler_extender (gpu-aware, manual section 2.1.5).\n"
        "# kube-scheduler runs with --config pointing here; disable with state=absent.\n"
        + HEADER_MARK + json.dumps(previous_arg) + "\n"
    )
    return header + yamlsupport.safe_dump(config)


def previous_arg_of(text: str) -> Tuple[bool, Optional[str]]:
    """``(written_by_us, previous --config argument or None)`` from a file :func:`render` wrote."""
    for line in text.splitlines():
        if line.startswith(HEADER_MARK):
            try:
                value = json.loads(line[len(HEADER_MARK):])
            except ValueError:
                raise SchedulerConfigError("the header of the extender configuration is damaged: %r" % line)
            if value is not None and not isinstance(value, str):
                raise SchedulerConfigError("the header of the extender configuration is damaged: %r" % line)
            return True, value
        if not line.startswith("#"):
            break
    return False, None


# -- secrets ---------------------------------------------------------------------------------------
# tlsConfig.keyData is a private key (base64 PEM): masked wherever the configuration is shown, and the
# file holding it is 0600. The other *Data keys are certificates, public.
SECRET_KEYS = ("keyData",)
_SECRET_INLINE = re.compile(r"""(["']?\bkeyData["']?[ \t]*:[ \t]*)(?![|>])([^\s,}\]][^\n,}\]]*)""")
_SECRET_OPEN = re.compile(r"""^([ \t-]*["']?\bkeyData["']?[ \t]*:)[ \t]*(?:[|>][-+0-9]*)?[ \t]*(?:#.*)?$""")


def holds_secret(text: Optional[str]) -> bool:
    return bool(text) and any(key in text for key in SECRET_KEYS)  # type: ignore[operator]


def mask_secrets(text: Optional[str]) -> Optional[str]:
    """``text`` (a scheduler configuration as YAML) with every keyData value replaced by a mask that
    carries a short fingerprint, so that a diff still shows that the key changed.

    Works on the text, not on parsed YAML, so the diff keeps the file's own layout: a value on the
    key's line (block or flow style) and a block scalar or continuation lines below the key."""
    if not text or not holds_secret(text):
        return text
    out: List[str] = []
    block: Optional[int] = None          # indentation of a keyData key whose value follows on more-indented lines
    collected: List[str] = []
    lines = text.splitlines(True)

    def flush(prefix_line: str) -> None:
        out.append(prefix_line + " " + _mask("".join(collected)) + "\n")

    pending_prefix = ""
    for line in lines:
        if block is not None:
            stripped = line.strip()
            indent = len(line) - len(line.lstrip(" \t-"))
            if not stripped or indent > block:
                collected.append(stripped)
                continue
            flush(pending_prefix)
            block, collected = None, []
        opened = _SECRET_OPEN.match(line.rstrip("\n"))
        if opened:
            block = len(line) - len(line.lstrip(" \t-"))
            pending_prefix = opened.group(1)
            continue
        out.append(_SECRET_INLINE.sub(lambda m: m.group(1) + _mask(m.group(2)), line))
    if block is not None:
        flush(pending_prefix)
    return "".join(out)


def _mask(value: str) -> str:
    digest = hashlib.sha256(value.strip().strip("'\"").encode("utf-8", "replace")).hexdigest()[:12]
    return "'******** (masked; sha256 %s)'" % digest
