# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""One node's driver from a payload, as driver-manager runs it (agents/driver_manager.py has
the round, its loop and its configuration). Each round :class:`DriverNode`

1. observes the driver, decides by deployPolicy, and installs or converges
   from the payload (copied from ``--payload-dir`` into the node's root, the
   package kind chosen by the node's ``/etc/os-release`` and package tool; a
   prebuilt tree, MetaX's own layout, when it has modules for the node's
   kernel);
2. verifies the loaded module against the kernel-driver version the payload
   declares (``<payload-dir>/metax-driver.version``; MetaX's payload 2.29.0.13
   installs 2.12.13; none: the payload's own number), ``/dev/mxcd`` and
   ``mx-smi``, publishes that declaration on its Node
   (``driver.payload.version``, ``driver.payload.driver-version``: the
   controller's "on target" compares gpu-label's labels with it), then writes ``--ready-file``
   (the pod's readiness probe; the controller then sets ``driver.ready``) and
   ``gpu.driver.mode``.

The rolling upgrade (docs/operator.md "driver upgradePolicy"): a loaded
driver that a new payload version concerns (``policy.rolled``) is never
replaced by a round on its own. The operator's controller cordons the node and
sets ``driver.upgrade-state=upgrade-required`` with the target version in
``driver.upgrade.target``; the node's driver-manager whose payload is that
version installs it (state ``driver-installed``), verifies it, restarts its
node's gpu-device and gpu-label pods (devices and version labels at once)
and sets ``done``; the controller then uncordons and clears. A failed
verification puts the previous driver back from the node's payload cache and
sets ``failed`` with the reason in ``driver.upgrade.message``: the node stays
cordoned for the administrator. A watch on its own Node wakes it at once.
With ``upgradePolicy.enableRollout`` false (the real CR's default) the
controller starts the upgrade in place (``driver.upgrade.in-place=true``, no
cordon): driver-manager then installs only while no pod on the node requests
a GPU and no process holds one, else it leaves ``pending: in use (...)`` in
``driver.upgrade.message`` and looks again next round; it never evicts.
While it installs, the node is held for ``driver-manager`` through the
node-maintenance protocol (``maintenance/nodeside.py``: an annotation, no
cordon); a node another procedure holds (a set_vfnum playbook, the health
ladder) waits, ``pending: the node is held by ...``, until it is resumed.

The API is reached only through :class:`..nodeapi.NodeApi` (this node's Node, its GPU pods, Events).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from .. import names
from ..host import HostRoot, HostRootError
from ..maintenance import nodeside
from ..maintenance.plan import MaintenanceConflict
from ..nodeapi import DRIVER_READERS_SELECTOR, NodeApi
from . import backend, inuse, policy
from .package import (DECLARATION_SUFFIX, DriverPackageError, check_payload_version, kernel_driver_version,
                      parse_declaration)

# driver-manager's log (the lines docs/operator.md and the benchmarks read carry its name)
LOG = logging.getLogger("driver-manager")
# who installed the driver, in policy.OWNER_RECORD
INSTALLED_BY = "driver-manager"
# The version an upgrade started from (node path): a pod restarted half-way
# through still knows what to roll back to.
UPGRADE_RECORD = "var/lib/metax-gpu/driver-upgrade.json"
# States in which this node's upgrade is driver-manager's to run (or to resume
# after a restart of its pod); done and failed are the controller's and the
# administrator's.
UPGRADE_STATE_INSTALLED = "driver-installed"
UPGRADE_PENDING = "pending"             # upgrade_driver's answer when an in-place upgrade waits for idle GPUs
UPGRADE_RUNNING = (names.DRIVER_UPGRADE_REQUIRED, UPGRADE_STATE_INSTALLED)
# the maintenance owner of its installs (maintenance/plan.py)
HOLD_OWNER = names.MAINTENANCE_OWNER_DRIVER_MANAGER
# A freshly loaded driver may need a moment to create /dev/mxcd: verified this often, a second apart.
VERIFY_ATTEMPTS = 5


@dataclass(frozen=True)
class NodeUpgrade:
    """This node's part of the rolling upgrade, as its Node says."""

    state: Optional[str] = None          # metax-tech.com/driver.upgrade-state
    target: Optional[str] = None         # metax-tech.com/driver.upgrade.target (the controller's)
    in_place: bool = False               # metax-tech.com/driver.upgrade.in-place: no cordon, only while idle


def node_upgrade(labels: Mapping[str, str], annotations: Mapping[str, str]) -> NodeUpgrade:
    return NodeUpgrade(labels.get(names.LABEL_DRIVER_UPGRADE_STATE) or None,
                       annotations.get(names.ANNOTATION_DRIVER_UPGRADE_TARGET) or None,
                       annotations.get(names.ANNOTATION_DRIVER_UPGRADE_IN_PLACE) == "true")


class DriverNode:
    """One node's driver, reconciled from a payload round after round, and its part of the rolling upgrade."""

    def __init__(self, host: HostRoot, api: NodeApi, deploy_policy: str, payload_dir: str,
                 payload_version: Optional[str], ready_file: str,
                 runner: Optional[Callable[[List[str]], Any]] = None) -> None:
        self.host = host
        self.api = api
        self.node_labels: Dict[str, str] = {}    # the Node's labels as this round read them (and wrote)
        self.node_annotations: Dict[str, str] = {}  # and its annotations
        self.policy = deploy_policy
        self.payload_dir = payload_dir
        self.payload_version = payload_version
        self._payload_driver: Optional[str] = None      # the payload's declaration, read once
        self.ready_file = ready_file
        self.cmds = backend.NodeCommands(host, runner)
        self.verify_pause = 1.0                   # seconds between verifications of a freshly loaded driver
        # the last verification passed (the next round may apply vfnum before the driver part)
        self.driver_verified = False

    def observe(self) -> policy.NodeDriver:
        seen = backend.observe(self.host, self.cmds, backend.Request())
        return policy.NodeDriver(seen.loaded_version, seen.package_version,
                                 ours=self.host.exists(policy.OWNER_RECORD), in_use=bool(seen.in_use))

    def payload_driver(self) -> Optional[str]:
        """The kernel-driver version this pod's payload installs: its declaration
        (``<payload-dir>/metax-driver.version``), else the payload's own version."""
        if self.payload_version is None:
            return None
        if self._payload_driver is None:
            path = os.path.join(self.payload_dir, backend.DEFAULT_PACKAGE + DECLARATION_SUFFIX)
            declared = None
            if os.path.isfile(path):
                try:
                    with open(path) as handle:
                        found = parse_declaration(handle.read(), path)
                except (OSError, UnicodeDecodeError, DriverPackageError) as exc:
                    raise backend.DriverError("the driver payload's declaration: %s" % exc)
                if found.version != self.payload_version:
                    raise backend.DriverError("the driver payload declares version %s in %s, but "
                                              "driver.payload.version is %s" % (found.version, path,
                                                                                self.payload_version))
                declared = found.driver
            self._payload_driver = kernel_driver_version(self.payload_version, declared)
        return self._payload_driver

    def driver_of(self, version: Optional[str]) -> Optional[str]:
        """The kernel driver the payload ``version`` installs: this pod's declaration for its own payload,
        the node's install record for an earlier one (a rollback's), else the same number."""
        if version is not None and version == self.payload_version:
            return self.payload_driver()
        return backend.declared_driver(self.host, version)

    def publish_payload(self, annotations: Mapping[str, str]) -> None:
        """Say on the Node what this pod's payload is and which kernel driver it installs (the controller's
        target for this node); written only when the Node says otherwise."""
        if self.payload_version is None:
            return
        want = {names.ANNOTATION_DRIVER_PAYLOAD_VERSION: self.payload_version,
                names.ANNOTATION_DRIVER_PAYLOAD_DRIVER: self.payload_driver()}
        if any(annotations.get(k) != v for k, v in want.items()):
            self.api.patch_node({}, want)

    def stage_payload(self, version: str) -> str:
        """Copy the payload for this node into its root; the node path of that directory.

        Its packages of the node's kinds (``deb/``, ``rpm/``, ``run/``), its
        declaration, and, when the payload directory is a prebuilt tree
        (``lib/modules/<release>/.../metax.ko``, ``usr/bin/``), that tree as
        ``prebuilt/`` (the backend uses it when it has modules for the node's
        kernel). Every file through backend.copy_payload_file, the one place
        payload files are unpacked.
        """
        release = {}
        if self.host.exists("etc/os-release"):
            release = policy.parse_os_release(self.host.read_text("etc/os-release"))
        kinds = policy.payload_kinds(policy.os_family(release, backend.node_kind(self.cmds)))
        # the version names a directory removed below: never a path of its own (../x)
        target = "%s/%s" % (policy.NODE_CACHE, check_payload_version(version))
        local = self.host.join(target)
        shutil.rmtree(local, ignore_errors=True)
        os.makedirs(local)
        copied = []
        for kind in kinds:
            src = os.path.join(self.payload_dir, kind)
            for name in sorted(os.listdir(src)) if os.path.isdir(src) else ():
                backend.copy_payload_file(os.path.join(src, name), self.host, "%s/%s" % (target, name))
                copied.append(name)
        declaration = backend.DEFAULT_PACKAGE + DECLARATION_SUFFIX
        if os.path.isfile(os.path.join(self.payload_dir, declaration)):
            backend.copy_payload_file(os.path.join(self.payload_dir, declaration), self.host,
                                      "%s/%s" % (target, declaration))
            if os.path.isdir(os.path.join(self.payload_dir, "lib", "modules")):
                tree = "%s/prebuilt" % target
                backend.copy_payload_file(os.path.join(self.payload_dir, declaration), self.host,
                                          "%s/%s" % (tree, declaration))
                for sub in ("lib/modules", "usr/bin"):
                    base = os.path.join(self.payload_dir, *sub.split("/"))
                    for dirpath, _dirs, files in os.walk(base):
                        for name in sorted(files):
                            source = os.path.join(dirpath, name)
                            rel = os.path.relpath(source, self.payload_dir).replace(os.sep, "/")
                            backend.copy_payload_file(source, self.host, "%s/%s" % (tree, rel))
                copied.append("prebuilt/")
        if not copied:
            raise backend.DriverError("the driver payload %s has no package for this node (%s, or a prebuilt "
                                      "tree) under %s" % (version, "/".join(kinds), self.payload_dir))
        return "/" + target

    def known_params(self, params: Sequence[str]) -> List[str]:
        """``params`` checked against ``modinfo -p metax`` on the node (skipped while no module is on disk)."""
        if not params:
            return []
        try:
            rc, out, _err = self.cmds.run(["modinfo", "-p", "metax"])
        except (backend.DriverError, HostRootError):
            rc, out = 1, ""             # no modinfo on the node: the grammar check alone
        return policy.check_known(params, policy.parse_modinfo_params(out) if rc == 0 else None)

    def reconcile_driver(self, params: Sequence[str]) -> Dict[str, object]:
        params = self.known_params(params)
        node = self.observe()
        decision = policy.decide(self.policy, node, self.payload_version,
                                 self.payload_driver() if self.policy != "Never" else None)
        if decision.changes_driver and node.loaded_version is not None and policy.rolled(self.policy, node.ours):
            # a new payload for a running driver: the rolling upgrade's (upgrade-required), never a round's
            decision = policy.Decision("none", policy.MODE_CLOUD if node.ours else policy.MODE_NATIVE, None,
                                       "driver %s loaded; the payload's %s waits for the rolling upgrade"
                                       % (node.loaded_version, self.payload_version))
        LOG.debug("driver decision: %s", decision.reason)
        out: Dict[str, object] = {"decision": decision.action, "reason": decision.reason, "mode": decision.mode}
        load = policy.load_command(params)
        if decision.changes_driver:
            if decision.target is None:
                raise policy.PolicyError("internal: a converge decision without a target version")
            src = self.stage_payload(decision.target)
            request = backend.Request(state="present", version=decision.target, src=src,
                                      deploy_policy="IfNotPresent", load_command=load)
            result = backend.run(self.host, request, False, runner=self.cmds.runner)
            out["result"] = result
            self.own(decision.target)
            LOG.info("driver %s installed from the payload (%s)", decision.target, decision.reason)
            if result.get("changed"):
                # the GPUs are bound anew: gpu-device registers the devices it finds at its start
                self.api.restart_gpu_device()
                self.api.event("DriverInstalled", decision.reason, warning=False)
        elif decision.action == "keep":
            request = backend.Request(state="present", deploy_policy="IfNotPresent", load_command=load)
            out["result"] = backend.run(self.host, request, False, runner=self.cmds.runner)
        verified = self.verified(self.driver_of(decision.target) if decision.action != "none" else None)
        if self.node_labels.get(names.LABEL_DRIVER_MODE) != decision.mode:
            # written when the Node (read at the round's start) says otherwise, not every round:
            # a write per node per interval, at 2,000 nodes 4,000 node writes a minute doing nothing
            self.api.patch_node({names.LABEL_DRIVER_MODE: decision.mode}, {})
            if decision.mode is None:
                self.node_labels.pop(names.LABEL_DRIVER_MODE, None)
            else:
                self.node_labels[names.LABEL_DRIVER_MODE] = decision.mode
        out["verified"] = verified
        return out

    def own(self, version: str) -> None:
        """Record the driver as driver-manager's (gpu.driver.mode=cloud from now on)."""
        self.write_record(policy.OWNER_RECORD, {"version": version, "installedBy": INSTALLED_BY})

    def write_record(self, rel: str, record: Mapping[str, Any]) -> None:
        os.makedirs(os.path.dirname(self.host.join(rel)), exist_ok=True)
        self.host.write_file_atomic(rel, (json.dumps(dict(record), sort_keys=True) + "\n").encode())

    # -- the rolling upgrade (the controller's upgrade-required) ----------------------
    def acts_on(self, upgrade: NodeUpgrade) -> bool:
        """Whether this pod runs its node's upgrade now: started (or resumed after a restart) to the
        version of this pod's payload. A pod of the previous payload leaves it to its successor."""
        return upgrade.state in UPGRADE_RUNNING and upgrade.target is not None \
            and upgrade.target == self.payload_version

    def in_use_reasons(self) -> List[str]:
        """Why the node's GPUs are in use now: pods on it requesting the GPU resource, processes holding
        a MetaX device, the module's refcount (empty: idle)."""
        reasons = ["pod %s requests %s" % (pod, names.RESOURCE_NAME) for pod in self.api.gpu_pods()]
        return reasons + inuse.in_use(self.host)

    def upgrade_pending(self, target: str, reasons: Sequence[str]) -> str:
        """An in-place upgrade that waits for idle GPUs: said on the node (once per reason), retried next round."""
        message = (names.PENDING_MESSAGE_PREFIX + "in use (%s); the upgrade to %s waits until the node's GPUs are idle "
                   "(upgradePolicy.enableRollout false: no cordon, no eviction)" % ("; ".join(reasons), target))[:900]
        if self.node_annotations.get(names.ANNOTATION_DRIVER_UPGRADE_MESSAGE) != message:
            LOG.info("upgrade: %s", message)
            self.api.patch_node({}, {names.ANNOTATION_DRIVER_UPGRADE_MESSAGE: message})
            self.node_annotations[names.ANNOTATION_DRIVER_UPGRADE_MESSAGE] = message
        self.verified(None)           # the driver it has stays ready meanwhile
        return UPGRADE_PENDING

    def upgrade_driver(self, target: str, params: Sequence[str], in_place: bool = False) -> str:
        """Install ``target``, verify, and report ``done``; after a failed verification (or install)
        the previous driver is put back and ``failed`` reported with the reason. The state written.

        Rolling (the node cordoned): a driver in use is refused (DriverInUseError, the state stays
        ``upgrade-required`` and the round reports it), so its GPU pods end or are evicted.
        In place (``in_place``, enableRollout false): nothing is done while the GPUs are in use;
        the node says ``pending: in use`` and the next round looks again (:meth:`upgrade_pending`).
        """
        params = self.known_params(params)
        if in_place:
            reasons = self.in_use_reasons()
            if reasons:
                return self.upgrade_pending(target, reasons)
        # the node held for the install (maintenance protocol): set_vfnum, the health ladder
        # and the budget see it; a node another procedure holds waits for it
        try:
            nodeside.hold(self.api, HOLD_OWNER)
        except MaintenanceConflict as exc:
            return self.upgrade_held(target, exc.holder)
        try:
            return self.install_upgrade(target, params, in_place)
        finally:
            try:
                nodeside.release(self.api, HOLD_OWNER)
            except MaintenanceConflict:
                pass            # never ours: another procedure's hold stays

    def upgrade_held(self, target: str, holder: str) -> str:
        """Another procedure holds the node: the upgrade waits (said on the node once), retried next round."""
        message = (names.PENDING_MESSAGE_PREFIX + "the node is held by %s's maintenance (%s); the upgrade to %s "
                   "waits until that procedure resumes it" % (holder, names.ANNOTATION_MAINTENANCE_OWNER, target))
        if self.node_annotations.get(names.ANNOTATION_DRIVER_UPGRADE_MESSAGE) != message:
            LOG.info("upgrade: %s", message)
            self.api.patch_node({}, {names.ANNOTATION_DRIVER_UPGRADE_MESSAGE: message})
            self.node_annotations[names.ANNOTATION_DRIVER_UPGRADE_MESSAGE] = message
        self.verified(None)           # the driver it has stays ready meanwhile
        return UPGRADE_PENDING

    def install_upgrade(self, target: str, params: Sequence[str], in_place: bool) -> str:
        """:meth:`upgrade_driver`'s install, verification and report, the node held."""
        node = self.observe()
        record = self.read_record(UPGRADE_RECORD)
        if record.get("to") != target:
            record = {"from": node.installed_version or node.loaded_version, "to": target}
            self.write_record(UPGRADE_RECORD, record)
        load = policy.load_command(params)
        started = time.monotonic()
        try:
            src = self.stage_payload(target)
            backend.run(self.host, backend.Request(state="present", version=target, src=src,
                                                   deploy_policy="IfNotPresent", load_command=load, verify=False),
                        False, runner=self.cmds.runner)
            installed = time.monotonic() - started
            self.own(target)
            self.api.patch_node({names.LABEL_DRIVER_UPGRADE_STATE: UPGRADE_STATE_INSTALLED}, {})
            self.verify_settled(self.driver_of(target))
        except backend.DriverInUseError as exc:
            if in_place:          # a process opened a GPU since the check: still only a wait
                return self.upgrade_pending(target, [str(exc).split(": ", 1)[-1]])
            raise
        except (backend.DriverError, HostRootError) as exc:
            return self.upgrade_failed(record, load, str(exc))
        # the devices registered anew and the version labels published now, not in a minute
        self.api.restart_gpu_device(DRIVER_READERS_SELECTOR)
        self.verified(self.driver_of(target))
        self.api.patch_node({names.LABEL_DRIVER_UPGRADE_STATE: names.DRIVER_UPGRADE_DONE,
                             names.LABEL_DRIVER_MODE: policy.MODE_CLOUD},
                            {names.ANNOTATION_DRIVER_UPGRADE_MESSAGE: None})
        self.remove_record(UPGRADE_RECORD)
        kmd = self.driver_of(target)
        message = "driver %s -> %s%s, installed in %.1f s, verified" % (
            record.get("from"), target, "" if kmd == target else " (kernel driver %s)" % kmd, installed)
        LOG.info("upgrade: %s", message)
        self.api.event("DriverUpgraded", message, warning=False)
        return names.DRIVER_UPGRADE_DONE

    def upgrade_failed(self, record: Mapping[str, Any], load: Sequence[str], reason: str) -> str:
        """The previous driver back when its package is in the node's payload cache; ``failed`` and why."""
        previous = record.get("from")
        outcome = "not rolled back (no previous driver)"
        if previous:
            cache = "%s/%s" % (policy.NODE_CACHE, previous)
            outcome = "not rolled back (no package of %s in /%s)" % (previous, cache)
            if self.host.isdir(cache):
                try:
                    backend.run(self.host, backend.Request(
                        state="present", version=previous, src="/" + cache, deploy_policy="IfNotPresent",
                        force=True, load_command=tuple(load), verify=False), False, runner=self.cmds.runner)
                    self.own(previous)
                    self.verify_settled(self.driver_of(previous))
                    outcome = "rolled back to %s" % previous
                except (backend.DriverError, HostRootError) as exc:
                    outcome = "rollback to %s failed: %s" % (previous, exc)
        message = ("%s; %s" % (reason, outcome))[:900]
        LOG.error("upgrade to %s failed: %s", record.get("to"), message)
        self.api.restart_gpu_device(DRIVER_READERS_SELECTOR)
        self.verified(None)
        # cordoned it stays (the controller never finishes a failed node): the administrator's now
        self.api.patch_node({names.LABEL_DRIVER_UPGRADE_STATE: "failed"},
                            {names.ANNOTATION_DRIVER_UPGRADE_MESSAGE: message})
        self.remove_record(UPGRADE_RECORD)
        self.api.event("DriverUpgradeFailed", message)
        return "failed"

    def verify_settled(self, version: Optional[str]) -> None:
        """backend.verify (``version``: the kernel driver expected), given a freshly loaded driver a few
        seconds to come up."""
        for attempt in range(VERIFY_ATTEMPTS):
            try:
                backend.verify(self.host, self.cmds, version)
                return
            except backend.DriverVerifyError:
                if attempt == VERIFY_ATTEMPTS - 1:
                    raise
                time.sleep(self.verify_pause)

    def read_record(self, rel: str) -> Dict[str, Any]:
        try:
            found = json.loads(self.host.read_text(rel)) if self.host.exists(rel) else {}
        except ValueError:
            found = {}
        return found if isinstance(found, dict) else {}

    def remove_record(self, rel: str) -> None:
        if os.path.lexists(self.host.join(rel)):
            os.unlink(self.host.join(rel))

    def verified(self, version: Optional[str]) -> bool:
        """Version (``version``: the kernel driver expected, :meth:`driver_of`; None: any), /dev/mxcd,
        mx-smi; the ready file follows the answer (the readiness probe reads it)."""
        try:
            backend.verify(self.host, self.cmds, version)
            ok = True
        except backend.DriverVerifyError as exc:
            LOG.info("driver not ready: %s", exc)
            ok = False
        self.driver_verified = ok
        if ok:
            os.makedirs(os.path.dirname(self.ready_file), exist_ok=True)
            with open(self.ready_file, "w") as handle:
                handle.write("ok\n")
        elif os.path.exists(self.ready_file):
            os.unlink(self.ready_file)
        return ok
