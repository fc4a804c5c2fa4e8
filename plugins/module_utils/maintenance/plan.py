# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The node-maintenance protocol as pure functions: a Node (a dict) and a request in, a merge patch out.

One protocol for every procedure that takes a GPU node out of service (the
``set_vfnum`` and ``driver_upgrade`` roles, driver-manager, the health
ladder, the device-mode switch of dra/switch_run.py); docs/maintenance.md says
it for administrators. The rules:

* a node is *held* by one procedure, its *owner* (``names.MAINTENANCE_OWNERS``),
  recorded in ``maintenance.owner``; a pause by another owner is refused
  (:class:`MaintenanceConflict`), and so is a resume;
* pausing the node agents sets ``agents.paused`` (the charts' affinity keeps
  gpu-device and gpu-label off the node) to the owner's name;
* the cordon is recorded in ``maintenance.cordon`` in the same patch that
  cordons: ``ours`` when the pause cordoned the node, ``admin`` when it was
  cordoned already; a resume lifts only ``ours``: an administrator's cordon is
  kept;
* each owner with a state vocabulary of its own (the driver upgrade's
  ``driver.upgrade-state``, set_vfnum's ``gpu.vfnum.state``) writes it and its
  message annotation through the same patch (``procedure_state``, ``message``).

Before the protocol the driver upgrade paused with ``agents.paused=true`` and
recorded an administrator's cordon in ``driver.upgrade.pre-cordoned``: both
still read as they did (``true`` is the driver upgrade's pause; a cordoned
node in the driver upgrade's state without that record is its own cordon).
Standard library only: driver-manager runs it on the node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Tuple

from .. import names as N
from ..errors import MetaxGpuError
from ..kube.node import strip_change

__all__ = ["MaintenanceConflict", "MaintenanceError", "NodeView", "Change", "node_view", "owner_of", "check_owner",
           "plan_pause", "plan_resume", "held", "cordon_record", "agent_label_removal", "STATE_KEYS", "LEGACY_PAUSE"]

# Each owner's own state label and message annotation (None: it has none yet).
STATE_KEYS: Dict[str, Tuple[Optional[str], Optional[str]]] = {
    N.MAINTENANCE_OWNER_DRIVER_UPGRADE: (N.LABEL_DRIVER_UPGRADE_STATE, N.ANNOTATION_DRIVER_UPGRADE_MESSAGE),
    N.MAINTENANCE_OWNER_SET_VFNUM: (N.LABEL_VFNUM_STATE, N.ANNOTATION_VFNUM_MESSAGE),
    N.MAINTENANCE_OWNER_DRIVER_MANAGER: (None, None),
    # the remediation ladder's state (health/ladder.py) is its message: written with the hold, removed with it
    N.MAINTENANCE_OWNER_HEALTH: (None, N.ANNOTATION_HEALTH_REMEDIATION),
    N.MAINTENANCE_OWNER_DEVICE_MODE: (None, None),
}
# agents.paused values written before the protocol, and whose pause they were
LEGACY_PAUSE = {"true": N.MAINTENANCE_OWNER_DRIVER_UPGRADE}


class MaintenanceError(MetaxGpuError):
    """A maintenance request that cannot be carried out (nothing was changed by it)."""


class MaintenanceConflict(MaintenanceError):
    """Another procedure holds the node: ``holder`` is its owner, ``owner`` the one refused."""

    def __init__(self, node: str, owner: str, holder: str) -> None:
        super().__init__(
            "node %s is held by %s's maintenance (%s=%s): %s leaves it alone until %s resumes it, or an "
            "administrator removes the hold (docs/maintenance.md)" % (
                node, holder, N.ANNOTATION_MAINTENANCE_OWNER, holder, owner, holder))
        self.node = node
        self.owner = owner
        self.holder = holder


@dataclass(frozen=True)
class NodeView:
    """What the protocol reads of a Node."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    cordoned: bool = False


def node_view(node: Mapping[str, Any]) -> NodeView:
    """A Node dict (k8s_info, kube_list, the API client's JSON), or its ``metadata`` alone (NodeApi)."""
    meta = node.get("metadata") if "metadata" in node else node
    meta = meta or {}
    return NodeView(name=str(meta.get("name") or ""), labels=dict(meta.get("labels") or {}),
                    annotations=dict(meta.get("annotations") or {}),
                    cordoned=bool((node.get("spec") or {}).get("unschedulable")))


def owner_of(view: NodeView) -> Optional[str]:
    """The procedure holding the node: its record, else the pause label's value (a pause from before
    the protocol: ``true`` is the driver upgrade's); None: no one."""
    owner = view.annotations.get(N.ANNOTATION_MAINTENANCE_OWNER)
    if owner:
        return owner
    paused = view.labels.get(N.LABEL_AGENTS_PAUSED)
    if paused:
        return LEGACY_PAUSE.get(paused, paused)
    return None


def held(node: Mapping[str, Any]) -> Optional[str]:
    """:func:`owner_of` a Node dict: who holds it (the rollout budget counts such a node unavailable)."""
    return owner_of(node_view(node))


def agent_label_removal(labels: Optional[Mapping[str, str]]) -> Dict[str, None]:
    """The labels under metax-tech.com/ that the node agents publish (every one but the day-two labels,
    names.DAY_TWO_LABELS), each mapped to None: the merge patch removing them (the manual's section 2.4)."""
    ours = {k: v for k, v in (labels or {}).items() if k not in N.DAY_TWO_LABELS}
    change = strip_change({"metadata": {"labels": ours}}, [N.LABEL_PREFIX], [])   # the one strip routine
    return change.metadata_patch().get("labels", {}) if change is not None else {}


def check_owner(owner: str) -> str:
    if owner not in N.MAINTENANCE_OWNERS:
        raise MaintenanceError("owner %r: expected one of %s" % (owner, ", ".join(N.MAINTENANCE_OWNERS)))
    return owner


def _check_free(view: NodeView, owner: str) -> Optional[str]:
    holder = owner_of(view)
    if holder is not None and holder != owner:
        raise MaintenanceConflict(view.name, owner, holder)
    return holder


def _pause_is(view: NodeView, owner: str) -> bool:
    value = view.labels.get(N.LABEL_AGENTS_PAUSED)
    return value is not None and value != "" and LEGACY_PAUSE.get(value, value) == owner


def cordon_record(view: NodeView, owner: str) -> Optional[str]:
    """Whose the node's cordon is, as recorded; before the protocol the driver upgrade recorded only an
    administrator's (pre-cordoned), so a cordon with its state label and no such record was its own."""
    record = view.annotations.get(N.ANNOTATION_MAINTENANCE_CORDON)
    if record in (N.MAINTENANCE_CORDON_OURS, N.MAINTENANCE_CORDON_ADMIN):
        # a record outlives its hold only beside the owner's state (a failed node's): once the
        # administrator has cleared that state, a cordon left in place is theirs to keep
        state_label = STATE_KEYS.get(owner, (None, None))[0]
        if owner_of(view) is not None or (state_label is not None and view.labels.get(state_label)):
            return record
        return None
    if owner == N.MAINTENANCE_OWNER_DRIVER_UPGRADE and view.cordoned:
        if N.ANNOTATION_PRE_CORDONED in view.annotations:
            return N.MAINTENANCE_CORDON_ADMIN
        if view.labels.get(N.LABEL_DRIVER_UPGRADE_STATE) and \
                view.annotations.get(N.ANNOTATION_DRIVER_UPGRADE_IN_PLACE) != "true":
            return N.MAINTENANCE_CORDON_OURS
    return None


@dataclass
class Change:
    """One node's merge patch and what it changes (``before``/``after``: the keys touched, Ansible's diff)."""

    node: str
    owner: str
    holder: Optional[str]                    # who held the node before (None: no one)
    labels: Dict[str, Optional[str]] = field(default_factory=dict)
    annotations: Dict[str, Optional[str]] = field(default_factory=dict)
    unschedulable: Optional[bool] = None     # True: cordon, False: uncordon, None: untouched
    cordon_kept: bool = False                # a cordon stays that is not ours to lift (the administrator's)
    before: Dict[str, Any] = field(default_factory=dict)
    after: Dict[str, Any] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return bool(self.labels or self.annotations or self.unschedulable is not None)

    @property
    def patch(self) -> Dict[str, Any]:
        """The JSON merge patch (``None`` deletes a key); {} when nothing changes."""
        body: Dict[str, Any] = {}
        meta: Dict[str, Any] = {}
        if self.labels:
            meta["labels"] = dict(self.labels)
        if self.annotations:
            meta["annotations"] = dict(self.annotations)
        if meta:
            body["metadata"] = meta
        if self.unschedulable is not None:
            body["spec"] = {"unschedulable": self.unschedulable}
        return body


class _Edit:
    """Collects the changes of one plan against ``view``: only keys whose value differs."""

    def __init__(self, view: NodeView, owner: str, holder: Optional[str]) -> None:
        self.view = view
        self.change = Change(view.name, owner, holder)

    def _set(self, kind: str, have: Mapping[str, str], key: str, value: Optional[str]) -> None:
        if have.get(key) == value or (value is None and key not in have):
            return
        getattr(self.change, kind)[key] = value
        self.change.before.setdefault(kind, {})[key] = have.get(key)
        self.change.after.setdefault(kind, {})[key] = value

    def label(self, key: str, value: Optional[str]) -> None:
        self._set("labels", self.view.labels, key, value)

    def annotation(self, key: str, value: Optional[str]) -> None:
        self._set("annotations", self.view.annotations, key, value)

    def cordon(self, value: bool) -> None:
        if self.view.cordoned != value:
            self.change.unschedulable = value
            self.change.before["unschedulable"] = self.view.cordoned
            self.change.after["unschedulable"] = value

    def procedure(self, owner: str, state: Optional[str], message: Optional[str]) -> None:
        """The owner's own state label and message: None leaves it, "" removes it."""
        label, annotation = STATE_KEYS[owner]
        for value, key, what in ((state, label, "procedure_state"), (message, annotation, "message")):
            if value is None:
                continue
            if key is None:
                raise MaintenanceError("%s has no %s of its own on the node" % (owner, what))
            if key == label:
                self.label(key, value or None)
            else:
                self.annotation(key, value or None)


def plan_pause(view: NodeView, owner: str, cordon: bool = True, pause_agents: bool = True,
               procedure_state: Optional[str] = None, message: Optional[str] = None,
               remove_agent_labels: bool = False) -> Change:
    """Hold ``view`` for ``owner``: record it, cordon (recording whose cordon it is) when ``cordon``,
    pause the agents when ``pause_agents`` (False un-pauses them: the hold stays), and set the owner's
    state and message. Refused (MaintenanceConflict) while another owner holds the node.

    ``cordon`` False never lifts a cordon: only :func:`plan_resume` does, and only its own.
    ``remove_agent_labels`` removes the agents' labels (:func:`agent_label_removal`): once their pods
    have left, else gpu-label puts them back.
    """
    check_owner(owner)
    holder = _check_free(view, owner)
    edit = _Edit(view, owner, holder)
    edit.annotation(N.ANNOTATION_MAINTENANCE_OWNER, owner)
    if cordon:
        record = cordon_record(view, owner)
        if not view.cordoned:
            # cordon and record in one patch: no reader ever sees our cordon without its record
            edit.cordon(True)
            edit.annotation(N.ANNOTATION_MAINTENANCE_CORDON, N.MAINTENANCE_CORDON_OURS)
        else:
            # already cordoned: the record says whose (a hold resumed after a crash keeps its own);
            # with none, the administrator's
            edit.annotation(N.ANNOTATION_MAINTENANCE_CORDON, record or N.MAINTENANCE_CORDON_ADMIN)
            edit.change.cordon_kept = (record or N.MAINTENANCE_CORDON_ADMIN) == N.MAINTENANCE_CORDON_ADMIN
    if pause_agents:
        edit.label(N.LABEL_AGENTS_PAUSED, owner)
    elif _pause_is(view, owner):
        edit.label(N.LABEL_AGENTS_PAUSED, None)
    edit.procedure(owner, procedure_state, message)
    if remove_agent_labels:
        for key in sorted(agent_label_removal(view.labels)):
            edit.label(key, None)
    return edit.change


def plan_resume(view: NodeView, owner: str, uncordon: bool = True, procedure_state: Optional[str] = None,
                message: Optional[str] = None) -> Change:
    """Release ``owner``'s hold on ``view``: un-pause its agents, lift the cordon if the hold made it
    (never the administrator's), remove the records, set the owner's state and message.

    ``uncordon`` False keeps the cordon, and its record, so that a later hold knows whose it is (a
    failed node stays cordoned for the administrator). Refused while another owner holds the node;
    with no hold at all only the owner's state and message are written (a second resume changes nothing).
    """
    check_owner(owner)
    holder = _check_free(view, owner)
    edit = _Edit(view, owner, holder)
    if holder is None:
        # nothing of ours to release: a cordon is never lifted without the hold that made it
        edit.change.cordon_kept = view.cordoned
        edit.procedure(owner, procedure_state, message)
        return edit.change
    record = cordon_record(view, owner)
    if uncordon:
        if view.cordoned and record == N.MAINTENANCE_CORDON_OURS:
            edit.cordon(False)
        edit.change.cordon_kept = view.cordoned and record != N.MAINTENANCE_CORDON_OURS
        edit.annotation(N.ANNOTATION_MAINTENANCE_CORDON, None)
        if owner == N.MAINTENANCE_OWNER_DRIVER_UPGRADE:
            edit.annotation(N.ANNOTATION_PRE_CORDONED, None)     # the record from before the protocol
    else:
        edit.change.cordon_kept = view.cordoned
        if view.cordoned and record is not None:
            edit.annotation(N.ANNOTATION_MAINTENANCE_CORDON, record)
    if _pause_is(view, owner):
        edit.label(N.LABEL_AGENTS_PAUSED, None)
    edit.annotation(N.ANNOTATION_MAINTENANCE_OWNER, None)
    edit.procedure(owner, procedure_state, message)
    return edit.change
