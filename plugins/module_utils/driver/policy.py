# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""driver-manager's decisions (pure): deployPolicy, the node's OS family, module parameters.

The in-cluster driver-manager (agents/driver_manager.py) observes a node with
:mod:`.backend` (the code of ``metax.gpu.driver``) and asks this module what to
do; it then runs the backend's own plan/apply/verify. Nothing here reads a
file or calls the API.

deployPolicy (ClusterOperator ``spec.driver.deployPolicy``, manual Table 3.2):

* ``IfNotPresent`` (default): a node with no MetaX driver gets the payload's;
  a driver the administrator installed is left alone (``gpu.driver.mode=native``);
  a driver installed by driver-manager is kept loaded (``cloud``).
* ``Always``: the node runs the payload's version: installed, upgraded or
  downgraded to it (never a reinstall of the same version: that would unload
  the driver on every restart of the pod).
* ``Never``: the driver is not touched at all; the mode label still says
  whose driver it is.
* ``PreferCloud`` (MetaX operator 0.9.x; its meaning for us, docs/operator.md):
  the payload's driver is preferred, but never at the price of running work.
  Like ``Always`` on a node without a driver or with ours; an administrator's
  driver is replaced by the payload only while no GPU is in use. While GPUs
  are busy the native driver stays, labelled ``native``, without a Degraded
  condition (it is a preference, not an order), and the take-over is retried
  with backoff.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple

from ..errors import MetaxGpuError
from .package import driver_matches, kernel_driver_version

DEPLOY_POLICIES = ("IfNotPresent", "Always", "Never", "PreferCloud")
MODE_NATIVE = "native"
MODE_CLOUD = "cloud"
# Record of a driver driver-manager installed (node path under the host root):
# what makes a driver "ours" (cloud) rather than the administrator's (native).
OWNER_RECORD = "var/lib/metax-gpu/driver-manager.json"
# Where driver-manager copies the payload's packages for the node's own tools
# (dpkg/rpm/.run run on the node, so the files must be inside its root).
NODE_CACHE = "var/cache/metax-driver/payload"
# /etc/os-release ID / ID_LIKE words -> the package kind of the node
DEB_IDS = frozenset(("debian", "ubuntu", "kylin", "uos", "deepin", "linuxmint"))
RPM_IDS = frozenset(("rhel", "centos", "fedora", "rocky", "almalinux", "openeuler", "anolis", "sles",
                     "suse", "opensuse", "ol", "kylinsec", "euleros", "alinux", "tencentos"))


class PolicyError(MetaxGpuError, ValueError):
    """A deployPolicy or driver-config value driver-manager cannot act on."""


@dataclass(frozen=True)
class NodeDriver:
    """What the node runs, as driver-manager needs it for a decision."""

    loaded_version: Optional[str]
    installed_version: Optional[str]   # the package database's (or .run record's) view
    ours: bool                         # OWNER_RECORD present: driver-manager installed it
    in_use: bool = False

    @property
    def present(self) -> bool:
        return self.loaded_version is not None or self.installed_version is not None


@dataclass(frozen=True)
class Decision:
    """What driver-manager does on one node for one reconcile."""

    action: str                 # "keep" (only make sure it is loaded, if ours) | "converge" | "none"
    mode: Optional[str]         # gpu.driver.mode to publish (None: no driver, label removed)
    target: Optional[str]       # the version to converge to
    reason: str
    retry: bool = False         # a preference that could not be met now: retry with backoff

    @property
    def changes_driver(self) -> bool:
        return self.action == "converge"


def decide(policy: str, node: NodeDriver, payload_version: Optional[str],
           driver_version: Optional[str] = None) -> Decision:
    """The decision for ``policy`` on ``node`` given the payload's version and the kernel driver it
    declares (``driver_version``; None: the same number). The loaded module is compared with the latter."""
    if policy not in DEPLOY_POLICIES:
        raise PolicyError("deployPolicy %r: expected one of %s" % (policy, ", ".join(DEPLOY_POLICIES)))
    current_mode = (MODE_CLOUD if node.ours else MODE_NATIVE) if node.present else None
    if policy == "Never":
        return Decision("none", current_mode, None, "deployPolicy Never: the driver is not touched")
    if not payload_version:
        raise PolicyError("driver.payload.version is not set: driver-manager has nothing to install")
    if not node.present:
        return Decision("converge", MODE_CLOUD, payload_version, "no MetaX driver: install %s" % payload_version)
    if policy == "IfNotPresent":
        if node.ours:
            # ours: keep it (and loaded); a new payload version is the rolling upgrade's job
            return Decision("keep", MODE_CLOUD, node.installed_version or node.loaded_version,
                            "driver %s installed by driver-manager" % (node.installed_version or node.loaded_version))
        return Decision("none", MODE_NATIVE, None, "driver %s installed by the administrator: left alone"
                        % (node.loaded_version or node.installed_version))
    if policy == "PreferCloud" and not node.ours and node.in_use:
        return Decision("none", MODE_NATIVE, None, "deployPolicy PreferCloud: the administrator's driver %s "
                        "is in use; the payload's %s replaces it once the GPUs are idle"
                        % (node.loaded_version or node.installed_version, payload_version), retry=True)
    on_target = node.installed_version == payload_version and \
        driver_matches(node.loaded_version, kernel_driver_version(payload_version, driver_version))
    if on_target and node.ours:
        return Decision("keep", MODE_CLOUD, payload_version, "driver %s = payload" % payload_version)
    return Decision("converge", MODE_CLOUD, payload_version, "deployPolicy %s: %s -> %s" % (
        policy, node.loaded_version or node.installed_version, payload_version))


def rolled(policy: str, ours: bool) -> bool:
    """Whether a new payload version reaches a node with a loaded driver only through the rolling
    upgrade (cordon, ``upgrade-required``, validate: docs/operator.md "driver upgradePolicy").

    ``Always`` rolls every node's driver; ``IfNotPresent`` and ``PreferCloud`` the
    ones the operator installed (``ours``); ``Never`` none. The controller's
    scope (clusteroperator/driver_rollout.py) and driver-manager's gate both ask
    this, so they cannot disagree about a node. ``PreferCloud`` taking over an
    idle administrator's driver is an install (its own decision), not an upgrade.
    """
    if policy == "Always":
        return True
    return policy in ("IfNotPresent", "PreferCloud") and ours


# -- the node's OS -----------------------------------------------------------------
def parse_os_release(text: str) -> Dict[str, str]:
    """KEY=value lines of /etc/os-release (quotes removed, comments skipped)."""
    out: Dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, value = line.split("=", 1)
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        out[key.strip()] = value
    return out


def os_family(os_release: Mapping[str, str], node_tool: Optional[str] = None) -> Optional[str]:
    """deb | rpm | None (only the vendor .run fits) for a node.

    ``ID`` then ``ID_LIKE`` decide; the package tool the node actually has
    (``node_tool``, from backend.node_kind) wins when they disagree, since it
    is what installs the package.
    """
    if node_tool in ("deb", "rpm"):
        return node_tool
    words = [os_release.get("ID", "")] + os_release.get("ID_LIKE", "").split()
    for word in (w.lower() for w in words if w):
        if word in DEB_IDS:
            return "deb"
        if word in RPM_IDS:
            return "rpm"
    return None


def payload_kinds(family: Optional[str]) -> Tuple[str, ...]:
    """The payload's package directories a node of ``family`` uses, preferred first."""
    return (family, "run") if family else ("run",)


# -- driver-config: module parameters -------------------------------------------------
# A kernel module parameter is a C identifier (the kernel takes '-' for '_'). Anything else, above
# all a word starting with '-', would reach ``modprobe metax ...`` (run as root on the node) as an
# option: ``--config=FILE`` or ``-d=DIR`` change what modprobe reads and loads.
_PARAM_NAME = re.compile(r"\A[A-Za-z_][A-Za-z0-9_-]{0,63}\Z")
_PARAM_VALUE = re.compile(r"\A[\x21-\x7e]{1,1024}\Z")     # printable, no space: one argv word


def _check_param(source: str, word: str) -> Tuple[str, str]:
    if word.startswith("-"):
        raise PolicyError("%s: %r is a modprobe option, not a module parameter (name=value)" % (source, word))
    key, sep, value = word.partition("=")
    if not sep or not key or not value:
        raise PolicyError("%s: %r is not key=value" % (source, word))
    if not _PARAM_NAME.match(key):
        raise PolicyError("%s: %r is not a module parameter name (a C identifier)" % (source, key))
    if not _PARAM_VALUE.match(value):
        raise PolicyError("%s: the value of %s is not printable ASCII of 1 to 1024 characters" % (source, key))
    return key, value


def parse_modinfo_params(text: str) -> FrozenSet[str]:
    """The parameter names of ``modinfo -p metax`` (``name:description (type)`` lines), '-' as '_'."""
    names = set()
    for line in text.splitlines():
        name, sep, _rest = line.partition(":")
        if sep and _PARAM_NAME.match(name.strip()):
            names.add(name.strip().replace("-", "_"))
    return frozenset(names)


def check_known(params: Sequence[str], known: Optional[FrozenSet[str]]) -> List[str]:
    """``params`` if each names a parameter the module has (``known``: from ``modinfo -p``; None: the
    module is not on disk yet, nothing to ask; the grammar of :func:`module_params` still held)."""
    if known is None:
        return list(params)
    unknown = sorted(p.split("=", 1)[0] for p in params if p.split("=", 1)[0].replace("-", "_") not in known)
    if unknown:
        raise PolicyError("driver-config: the metax module has no parameter %s (modinfo -p metax lists: %s)"
                          % (", ".join(unknown), ", ".join(sorted(known)) or "none"))
    return list(params)


def module_params(config: Mapping[str, object], node: str) -> List[str]:
    """``key=value`` arguments for ``modprobe metax``: ``module-params``, then the node's ``node-module-params``.

    Both are strings of space-separated ``key=value`` (the real driver-config's
    shape); a node's value for a key replaces the global one. Raises PolicyError
    for a word that is not ``key=value`` with a parameter name (never a modprobe option).
    """
    merged: Dict[str, str] = {}
    global_params = config.get("module-params") or ""
    per_node = config.get("node-module-params") or {}
    if not isinstance(per_node, Mapping):
        raise PolicyError("node-module-params must map node names to parameter strings")
    for source, text in (("module-params", global_params), ("node-module-params." + node, per_node.get(node) or "")):
        if not isinstance(text, str):
            raise PolicyError("%s must be a string of key=value words, got %r" % (source, text))
        for word in text.split():
            key, value = _check_param(source, word)
            merged[key] = value
    return ["%s=%s" % (k, v) for k, v in merged.items()]


def load_command(params: Sequence[str]) -> Tuple[str, ...]:
    for param in params:        # whatever built them: never an option on modprobe's command line
        _check_param("module parameters", param)
    return ("modprobe", "metax") + tuple(params)
