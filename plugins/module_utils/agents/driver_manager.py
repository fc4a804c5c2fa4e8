# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""driver-manager: the GPU Operator's driver component on one node (manual section 3.1, 3.2.3).

    python -m ansible_collections.metax.gpu.plugins.module_utils.agents.driver_manager \\
        --host-root /host --node-name NODE --deploy-policy IfNotPresent \\
        --payload-dir /payload --payload-version 2.14.3 [--config-map driver-config]

Thin: every decision is in ``driver/policy.py`` and ``vfnum/config.py``, every
node change in ``driver/backend.py`` and ``vfnum/backend.py`` (the code of
``metax.gpu.driver`` and ``metax.gpu.vfnum``). Each round it (the procedures in
``driver/node_upgrade.py`` and ``vfnum/reconcile.py``, which say more)

1. reads ``driver-config`` (``module-params``, ``node-module-params``, its
   node's ``node-vfnums`` entry);
2. observes the driver, decides by deployPolicy, installs or converges from
   the payload, verifies it and writes ``--ready-file`` (``DriverNode``);
3. runs its node's part of the rolling upgrade when the controller asks for
   it (``driver.upgrade-state=upgrade-required``, docs/operator.md "driver
   upgradePolicy"): never a round of its own;
4. applies its node's vfnum entry (``VfnumNode``): state label
   ``gpu.vfnum.state``, at most ``--vfnum-max-parallel`` nodes at once.

A failure (driver in use, invalid entry) is an Event on the ClusterOperator and the node
annotation ``driver.message`` / ``gpu.vfnum.message``, from which the controller's status makes
``Degraded``; it is retried with backoff, never in a tight loop. Between rounds it watches the
ConfigMap (an edit applies within a second or two); work left waiting is looked at again soon.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import random
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from .. import names
from ..backoff import Backoff
from ..driver import backend, policy
from ..driver.node_upgrade import UPGRADE_PENDING, DriverNode, node_upgrade
from ..driver.reload import reload_driver
from ..errors import MetaxGpuError
from ..health.ladder import NONE as LADDER_IDLE, health_condition, remediating
from ..health.remediation import Ladder
from ..health.remediation_kube import RemediationKube
from ..host import HostRoot, HostRootError
from ..kube import evict as kube_evict
from ..kube.client import ApiException, coordination_v1, core_v1
from ..kube.node import OwnNode
from ..kube.pages import DEFAULT_PAGE_SIZE
from ..kube.watch import ListWatch, RawSource, WatchPolicy
from ..kube.slots import POOL_LABEL, SlotError, Slots
from ..kubelet.constants import POD_RESOURCES_SOCKET
from ..kubelet.podresources import gpu_holders
from ..nodeapi import GPU_DEVICE_SELECTOR
from ..vfnum import config as vfnum_config
from ..vfnum.plan import VfnumError
from ..vfnum.reconcile import VfnumNode, VfnumPending, VfnumPolicy
from .common import (UsageError, add_common_flags, checked_host_root, kube_api_client, positive_float,
                     positive_int, run_main, setup_logging, stop_event)

try:
    import yaml
    HAS_YAML = True
    # libyaml's parser when PyYAML has it (the agent image's wheel does): node-vfnums names
    # every node, and the pure-Python parser takes ~0.1 s per round for 500 entries
    SAFE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
except ImportError:  # the agent image has PyYAML (requirements/agents.txt)
    yaml = None
    HAS_YAML = False
    SAFE_LOADER = None

COMPONENT = "driver-manager"
LOG = logging.getLogger(COMPONENT)
DEFAULT_READY_FILE = "/run/driver-manager/ready"
# A watch the server ends after WATCH_SECONDS; the client gives up on a connection that
# does not open in 10 s or stays silent past the server's end (kube/watch.py), so a watch that
# hangs (no TCP keepalive in the client) is reopened instead of leaving edits to the interval.
WATCH_SECONDS = 300
# The pause before a broken watch is listed and opened again.
WATCH_RETRY_PAUSE = 5.0
# The budget of nodes changing vfnum at once: Leases <prefix>-<i> in the operator's namespace.
VFNUM_SLOT_PREFIX = "metax-vfnum-slot"
# Without a watched view of the slots (the watch not open, or broken) a node waiting for a slot
# retries after SLOT_RETRY to twice that, at random (the waiters do not retry in step); with the
# view, its round is woken when the view shows a slot free for it (kube/slots.py wait_turn).
SLOT_RETRY = 5.0
# Work left waiting (an in-place upgrade for idle GPUs, a remediation step) is looked at again after
# this, doubling up to the interval: no watch sees a GPU pod end or a slot free, and days cost no more.
WAITING_RETRY = 5.0


@dataclass
class Config:
    """driver-config as this node needs it."""

    params: List[str] = field(default_factory=list)
    vfnum: Optional[int] = None
    error: Optional[str] = None          # the config (or this node's part of it) is invalid


def parse_config(data: Mapping[str, str], node: str) -> Config:
    """driver-config's data -> this node's Config (pure; YAML through PyYAML)."""
    out = Config()
    try:
        doc: Dict[str, Any] = {}
        for key in ("module-params",):
            if data.get(key):
                doc[key] = str(data[key]).strip()
        if data.get("node-module-params"):
            doc["node-module-params"] = yaml.load(data["node-module-params"], Loader=SAFE_LOADER) if HAS_YAML else {}
        out.params = policy.module_params(doc, node)
        vfnums = yaml.load(data.get(vfnum_config.NODE_VFNUMS_KEY) or "", Loader=SAFE_LOADER) if HAS_YAML else None
        out.vfnum = vfnum_config.node_entry(vfnums, node)
    except (policy.PolicyError, VfnumError) as exc:
        out.error = str(exc)
    except Exception as exc:  # pylint: disable=broad-except  # yaml.YAMLError without importing yaml's types
        out.error = "driver-config is not valid YAML: %s" % exc
    return out


def _meta(obj: Any) -> Mapping[str, Any]:
    """An object's ``metadata`` as the watch hands it (the API server's JSON); {} for none."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    return meta if isinstance(meta, Mapping) else {}


def event_changes_config(event: Mapping[str, Any], seen_version: Optional[str]) -> bool:
    """Whether a watch event of the ConfigMap differs from the version last read."""
    if event.get("type") == "DELETED":
        return seen_version is not None
    return _meta(event.get("object")).get("resourceVersion") != seen_version


class Watched:
    """What a watch does with what it sees: ``opened`` with each (re)opening's list, ``changed`` with
    each event (True: wake a round), ``broken`` when the watch breaks.

    The decision is here, not in the watch loop, so that one piece of logic serves the pod's own
    watches (:func:`watch_objects`) and a fleet of stand-ins fed from one shared watch per kind
    (benchmarks/vfnum_fleet.py)."""

    def opened(self, items: Sequence[Any]) -> bool:
        """The listed objects as ADDED events through ``changed`` (none listed: one DELETED), so that
        it keeps what it has seen and an object edited while a round ran wakes the next."""
        opening = [{"type": "ADDED", "object": item} for item in items] or [{"type": "DELETED", "object": None}]
        woken = False
        for event in opening:          # every one through changed, not only up to the first wake
            woken = self.changed(event) or woken
        return woken

    def changed(self, event: Mapping[str, Any]) -> bool:
        raise NotImplementedError

    def broken(self) -> None:
        """The watch broke (it is reopened after a pause)."""


class ConfigWatched(Watched):
    """driver-config: a change is any version other than the one ``kube``'s last round read."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube

    def changed(self, event: Mapping[str, Any]) -> bool:
        if not event_changes_config(event, self.kube.config_version):
            return False
        # the start of a change's way to the node (docs/operator.md "driver-config" times it)
        LOG.info("%s %s (resourceVersion %s): round woken", self.kube.config_map, str(event.get("type")).lower(),
                 _meta(event.get("object")).get("resourceVersion"))
        return True


class NodeWatched(Watched):
    """This node's Node: a change is another upgrade state or target, or remediating findings, than the last event's."""

    def __init__(self) -> None:
        self.seen: Optional[Any] = None

    def changed(self, event: Mapping[str, Any]) -> bool:
        meta = _meta(event.get("object"))
        node = event.get("object") if isinstance(event.get("object"), Mapping) else {}
        # the remediation ladder's input too: a remediating finding coming or going wakes a round
        now = (node_upgrade(meta.get("labels") or {}, meta.get("annotations") or {}),
               remediating(health_condition(node or {})))
        if self.seen == now:
            return False
        self.seen = now
        return True


class SlotsWatched(Watched):
    """The slot Leases: the view of ``slots`` kept; never a wake of its own (the slot waiter of
    run_loop wakes the round, after its turn's pause)."""

    def __init__(self, slots: Slots) -> None:
        self.slots = slots

    def opened(self, items: Sequence[Any]) -> bool:
        self.slots.relisted(items)
        return False

    def changed(self, event: Mapping[str, Any]) -> bool:
        self.slots.seen(str(event.get("type")), event.get("object"))
        return False

    def broken(self) -> None:
        self.slots.unwatched()


class _Waking:
    """A :class:`Watched` as the handler of kube/watch.py's list/watch: its decisions set ``wake``."""

    def __init__(self, watched: Watched, wake: threading.Event) -> None:
        self.watched = watched
        self.wake = wake

    def replace(self, items: List[Dict[str, Any]]) -> None:
        if self.watched.opened(items):
            self.wake.set()

    def apply(self, event_type: str, obj: Dict[str, Any]) -> None:
        if self.watched.changed({"type": event_type, "object": obj}):
            self.wake.set()

    def broken(self) -> None:
        self.watched.broken()


def watch_objects(wake: threading.Event, stop: threading.Event, lister: Callable[..., Any], args: Sequence[Any],
                  selector: Mapping[str, str], watched: Watched) -> None:
    """Until ``stop``: a watch of what ``selector`` picks (kube/watch.py, the collection's one),
    resumed when the server ends it, listed and reopened after a pause when it breaks; whatever
    ``watched`` says is a change wakes a round (sets ``wake``). Objects are the API server's JSON.

    The first opening, and each after a break (a 410 too), lists the objects from the API server's
    cache (resourceVersion "0") and watches from that list's version. A watch without a version
    asks for a consistent read, which the server answers with 504 "Too large resource version"
    after 3 s whenever the cache of this kind lags behind etcd -- on a busy cluster, for a kind as
    quiet as a ConfigMap, every time: the watch never opened and an edit waited for the interval
    (docs/operator.md "driver-config"). A watch the server ended after WATCH_SECONDS is resumed
    from the last version it saw, bookmarks included, without a list: three lists per node every
    WATCH_SECONDS were 20 lists a second at 2,000 nodes (docs/scale.md).
    """
    policy = WatchPolicy(list_version="0", resync_seconds=None, relist_after_error=True, watch_seconds=WATCH_SECONDS)
    source = RawSource(functools.partial(lister, *args), DEFAULT_PAGE_SIZE, **selector)
    ListWatch(",".join(selector.values()) or "watch", source, _Waking(watched, wake), LOG, policy,
              Backoff(initial=WATCH_RETRY_PAUSE, cap=WATCH_RETRY_PAUSE), stop=stop).run()


class Kube(RemediationKube):
    """The API calls driver-manager makes (RBAC: nodes get/list/watch/patch and pods/eviction create
    cluster-wide, admitted for its own node's pods only by eviction_webhook.py; configmaps get/watch,
    pods list/delete, events create, leases in its namespace). ``holders``: its node's GPU pods."""

    def __init__(self, api: Any, node: str, namespace: str, config_map: str,
                 holders: Optional[Callable[[], List[str]]] = None) -> None:
        self.api = api
        self.core = core_v1(api)
        self.holders = holders if holders is not None else gpu_holders()   # the kubelet's answer
        self.node = node
        self.namespace = namespace
        self.config_map = config_map
        # the ConfigMap's resourceVersion the last config() read (None: it did not exist)
        self.config_version: Optional[str] = None

    def config(self) -> Mapping[str, str]:
        try:
            found = self.core.read_namespaced_config_map(self.config_map, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                self.config_version = None
                return {}
            raise
        self.config_version = (found.get("metadata") or {}).get("resourceVersion")
        return found.get("data") or {}

    def watch_config(self, wake: threading.Event, stop: threading.Event) -> None:
        """Until ``stop``: set ``wake`` whenever the ConfigMap differs from what the last round read."""
        watch_objects(wake, stop, self.core.list_namespaced_config_map, (self.namespace,),
                      {"field_selector": "metadata.name=" + self.config_map}, ConfigWatched(self))

    def watch_node(self, wake: threading.Event, stop: threading.Event) -> None:
        """Until ``stop``: set ``wake`` when the controller changes this node's upgrade state or target."""
        watch_objects(wake, stop, self.core.list_node, (), {"field_selector": "metadata.name=" + self.node},
                      NodeWatched())

    def watch_slots(self, slots: Slots, stop: threading.Event) -> None:
        """Until ``stop``: keep ``slots``' view of its pool (every Lease of it: one label selector),
        from which a waiting node learns of a freed slot without an API call of its own."""
        watch_objects(threading.Event(), stop, coordination_v1(self.api).list_namespaced_lease, (self.namespace,),
                      {"label_selector": "%s=%s" % (POOL_LABEL, slots.prefix)}, SlotsWatched(slots))

    def node_metadata(self) -> Mapping[str, Any]:
        """This node's ``metadata`` (labels, annotations) from the Node as raw JSON: a round needs
        those two maps, not the client's V1Node models built for the whole object (status, images,
        conditions), in every round of every node (kube/node.py)."""
        self.last_node = OwnNode(self.core, self.node).read()    # the remediation ladder reads the rest
        meta = self.last_node.get("metadata")
        return meta if isinstance(meta, dict) else {}

    def patch_node(self, labels: Mapping[str, Optional[str]], annotations: Mapping[str, Optional[str]]) -> None:
        """A merge patch of these keys of this node (none: no request; kube/node.py)."""
        OwnNode(self.core, self.node).patch(labels, annotations)

    def restart_gpu_device(self, selector: str = GPU_DEVICE_SELECTOR) -> List[str]:
        """Delete this node's gpu-device pod, or the pods ``selector`` picks (their DaemonSets
        recreate them); the names deleted."""
        pods = [pod["metadata"]["name"] for pod in self.core.list_namespaced_pod(
            self.namespace, label_selector=selector, field_selector="spec.nodeName=" + self.node).get("items") or []]
        for name in pods:
            self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=1)
        return pods

    def gpu_pods(self) -> List[str]:
        """``namespace/name`` of the pods holding this node's GPUs (the ones evict_gpu_pods evicts)."""
        return kube_evict.evict(self.core, self.node, check_mode=True, holders=self.holders)["selected"]

    def evict_gpu_pods(self, timeout: float) -> List[str]:
        """Evict them (policy/v1 Eviction, never forced) and wait up to ``timeout`` for them to
        leave; kube_evict.EvictionError names those left, and comes at once on a budget's refusal
        (429: the round's backoff retries it, no wait inside the round)."""
        return kube_evict.evict(self.core, self.node, timeout=timeout, retry_refused=False,
                                holders=self.holders)["evicted"]

    def vfnum_slots(self, size: int) -> Slots:
        return Slots(coordination_v1(self.api), self.namespace, VFNUM_SLOT_PREFIX, size, self.node)

    def event(self, reason: str, message: str, warning: bool = True) -> None:
        """An Event on the ClusterOperator (what `kubectl describe clusteroperator` shows)."""
        import datetime
        now = datetime.datetime.now(datetime.timezone.utc)
        body = {
            "metadata": {"generateName": "driver-manager-%s." % self.node, "namespace": self.namespace},
            "involvedObject": {"apiVersion": "%s/%s" % (names.OPERATOR_GROUP, names.OPERATOR_VERSION),
                               "kind": names.OPERATOR_KIND, "name": names.OPERATOR_CR_NAME,
                               "namespace": self.namespace},
            "reason": reason, "message": "%s: %s" % (self.node, message)[:1000],
            "type": "Warning" if warning else "Normal",
            "source": {"component": COMPONENT, "host": self.node},
            "firstTimestamp": now.isoformat(), "lastTimestamp": now.isoformat(), "count": 1,
        }
        try:
            self.core.create_namespaced_event(self.namespace, body)
        except ApiException as exc:
            LOG.warning("cannot record event %s: %s", reason, exc.reason)


class Manager:
    """One node's driver and vfnum, reconciled round after round: the round and its reports here,
    the procedures in driver/node_upgrade.py (``driver``) and vfnum/reconcile.py (``vfnum``)."""

    def __init__(self, host: HostRoot, kube: Kube, deploy_policy: str, payload_dir: str,
                 payload_version: Optional[str], ready_file: str,
                 runner: Optional[Callable[[List[str]], Any]] = None,
                 vfnum_policy: VfnumPolicy = VfnumPolicy()) -> None:
        self.host = host
        self.kube = kube
        self.vfnum_policy = vfnum_policy
        self.slots = kube.vfnum_slots(vfnum_policy.max_parallel)
        # set by a round whose vfnum change waits for a slot (run_loop's slot waiter wakes the next)
        self.slot_wanted = threading.Event()
        self.waiting = False        # the last round left work waiting on the node (run_loop looks again soon)
        self.driver = DriverNode(host, kube, deploy_policy, payload_dir, payload_version, ready_file, runner)
        self.vfnum = VfnumNode(host, kube, vfnum_policy, self.slots, self.round_clock)
        self.ladder = Ladder(kube, kube.node, host, lambda: reload_driver(host, self.driver.cmds, kube.gpu_pods()),
                             lambda size: kube.health_slots(size))  # pylint: disable=unnecessary-lambda  # looked up when used
        self.last_failure: Dict[str, str] = {}    # what -> message, so each failure is reported once
        self.round_started = time.monotonic()
        # driver-config as last parsed, and the ConfigMap's resourceVersion it was parsed from
        self._config: Optional[Config] = None
        self._config_version: Optional[str] = None

    @property
    def driver_verified(self) -> bool:
        """The last verification passed (the next round may apply vfnum before the driver part)."""
        return self.driver.driver_verified

    @driver_verified.setter
    def driver_verified(self, value: bool) -> None:
        self.driver.driver_verified = value

    # -- one round ------------------------------------------------------------------
    def report(self, what: str, annotation: str, error: Optional[str], reason: Optional[str] = None) -> None:
        """A failure once as an Event (``reason``, default ``what``) and a node annotation (the
        controller's Degraded reads it); cleared after."""
        if error == self.last_failure.get(what):
            return
        if error:
            LOG.error("%s: %s", what, error)
            self.kube.event(reason or what, error)
            self.kube.patch_node({}, {annotation: error})
        else:
            self.kube.patch_node({}, {annotation: None})
        self.last_failure[what] = error or ""

    def round_clock(self) -> float:
        """Seconds since this round began (the step times in the log)."""
        return time.monotonic() - self.round_started

    def round(self) -> bool:
        """One reconcile; True when nothing failed.

        With the driver verified by the previous round and no upgrade to run,
        the vfnum entry goes first: the driver part (package queries, mx-smi:
        several processes) then no longer delays an edit of driver-config,
        which on a loaded node cost seconds of the 15 s target (docs/operator.md).
        Otherwise the driver comes first, since VFs need the PF driver bound.
        """
        self.round_started = time.monotonic()
        config = self.read_config()
        params = config.params if config.error is None else []
        meta = self.kube.node_metadata()
        driver = self.driver
        driver.node_labels = dict(meta.get("labels") or {})
        driver.node_annotations = dict(meta.get("annotations") or {})
        upgrade = node_upgrade(driver.node_labels, driver.node_annotations)
        target = upgrade.target if driver.acts_on(upgrade) else None    # the version to upgrade to now
        vfnum_first = self.driver_verified and target is None
        vfnum_ok = self.vfnum_round(config) if vfnum_first else True
        ok, upgrade_state = True, None
        try:
            # the controller's target for this node is the kernel driver this payload declares
            driver.publish_payload(driver.node_annotations)
            if target is not None:
                # a failed upgrade is reported on the node (state failed), rolled back, and not retried
                upgrade_state = driver.upgrade_driver(target, params, upgrade.in_place)
            else:
                driver.reconcile_driver(params)
            LOG.debug("driver reconciled %.2f s into the round", self.round_clock())
            self.report("DriverFailed", names.ANNOTATION_DRIVER_MESSAGE, None)
        except (backend.DriverError, policy.PolicyError, HostRootError) as exc:
            driver.verified(None)
            self.report("DriverFailed", names.ANNOTATION_DRIVER_MESSAGE, str(exc))
            ok = False
        if not vfnum_first:
            vfnum_ok = self.vfnum_round(config)
        ladder_action = LADDER_IDLE
        try:     # the health remediation ladder (health/remediation.py): its failure is not the driver's
            if getattr(self.kube, "last_node", None) is not None:
                ladder_action = self.ladder.round(self.kube.last_node)
        except (ApiException, MetaxGpuError, OSError) as exc:
            LOG.warning("remediation ladder: %s", exc)
        self.waiting = upgrade_state == UPGRADE_PENDING or ladder_action != LADDER_IDLE
        return ok and vfnum_ok

    def read_config(self) -> Config:
        """driver-config for this node; parsed again only when its resourceVersion moved (a round
        of a node waiting for a slot, or a quiet one, reads the ConfigMap but does not re-parse it)."""
        data = self.kube.config()
        version = self.kube.config_version
        if version is None or version != self._config_version or self._config is None:
            self._config = parse_config(data, self.kube.node)
            self._config_version = version
        return self._config

    def vfnum_round(self, config: Config) -> bool:
        """This node's node-vfnums entry applied, or the reason it is not reported; True when it is."""
        error = config.error
        reason = None
        self.slot_wanted.clear()
        if error is None:
            try:
                self.vfnum.reconcile_vfnum(config.vfnum)
            except VfnumPending as exc:
                if exc.event is None:
                    # waiting for a slot is the budget working, not a failure: no backoff; the slot
                    # waiter wakes the next round when the watched pool shows a slot for this node
                    LOG.info("%s", exc)
                    self.slot_wanted.set()
                    if self.last_failure.get("VfnumRejected"):    # an earlier reason no longer holds
                        self.report("VfnumRejected", names.ANNOTATION_VFNUM_MESSAGE, None)
                    return True
                error, reason = str(exc), exc.event
            except (VfnumError, SlotError) as exc:
                error = str(exc)
        if error is not None:
            # nothing changed: the state label stays (success/absent) unless the apply itself failed
            self.report("VfnumRejected", names.ANNOTATION_VFNUM_MESSAGE, error, reason)
            return False
        if self.last_failure.get("VfnumRejected"):
            self.report("VfnumRejected", names.ANNOTATION_VFNUM_MESSAGE, None)
        return True


def slot_retry(rnd: Callable[[], float] = random.random) -> float:
    """The blind retry of a node waiting for a slot without a watched view: SLOT_RETRY to twice it."""
    return SLOT_RETRY * (1.0 + rnd())


def wait_for_slots(manager: Manager, wake: threading.Event, stop: threading.Event) -> None:
    """Until ``stop``: while a round waits for a vfnum slot, wake the next one at this node's turn."""
    while not stop.is_set():
        if not manager.slot_wanted.wait(5.0):
            continue
        if manager.slots.wait_turn(stop, slot_retry()):
            manager.slot_wanted.clear()
            wake.set()


def open_watches(manager: Manager, wake: threading.Event, stop: threading.Event) -> None:
    """The pod's own watches, each in a thread: driver-config edits and the controller's
    upgrade-required wake a round at once; the slot Leases keep the view the slot waiter reads."""
    for target in (manager.kube.watch_config, manager.kube.watch_node):
        threading.Thread(target=target, args=(wake, stop), daemon=True).start()
    threading.Thread(target=manager.kube.watch_slots, args=(manager.slots, stop), daemon=True).start()


def run_loop(manager: Manager, interval: float, stop: threading.Event, watch: bool = True,
             watches: Callable[[Manager, threading.Event, threading.Event], None] = open_watches) -> int:
    """Rounds until ``stop``, woken early by the watches that ``watches`` opens (the pod's own,
    :func:`open_watches`; the scale fleet's feed many stand-ins from one per kind)."""
    backoff = Backoff(initial=5.0, cap=300.0)
    patience = Backoff(initial=min(WAITING_RETRY, interval), cap=interval)     # rounds that left work waiting
    wake = threading.Event()

    def stopped() -> None:
        # SIGTERM ends the wait too (the DaemonSet's rollout of a new payload waits for this pod to go)
        stop.wait()
        wake.set()
    threading.Thread(target=stopped, daemon=True).start()
    if watch:
        watches(manager, wake, stop)
        # a freed vfnum slot (in the view the slot watch keeps) wakes the round of a node waiting for one
        threading.Thread(target=wait_for_slots, args=(manager, wake, stop), daemon=True).start()
    while not stop.is_set():
        try:
            ok = manager.round()
        except (ApiException, MetaxGpuError, OSError) as exc:
            LOG.warning("round failed: %s", exc)
            ok = False
        # a failure is retried with growing pauses (never a tight loop); a config edit still wakes us
        wait = interval if ok else backoff.next_delay()
        if ok:
            backoff.reset()
        if ok and manager.waiting:
            wait = min(wait, patience.next_delay())
        else:
            patience.reset()
        if manager.slot_wanted.is_set() and not watch:
            wait = min(wait, slot_retry())      # no slot waiter: the blind, jittered retry
        wake.wait(wait)
        wake.clear()
    LOG.info("stopping")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=COMPONENT, description=__doc__.split("\n\n", maxsplit=1)[0])
    add_common_flags(parser)
    parser.add_argument("--node-name", default=os.environ.get("NODE_NAME", ""))
    parser.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE", names.OPERATOR_NAMESPACE))
    parser.add_argument("--deploy-policy", choices=policy.DEPLOY_POLICIES, default="IfNotPresent")
    parser.add_argument("--payload-dir", default="/payload",
                        help="the payload image's packages (deb/, rpm/, run/), or its prebuilt tree, and its "
                             "declaration metax-driver.version")
    parser.add_argument("--payload-version", default="",
                        help="the payload's own version (the kernel driver it installs is its declaration's, "
                             "else the same)")
    parser.add_argument("--config-map", default=names.DRIVER_CONFIGMAP)
    parser.add_argument("--ready-file", default=DEFAULT_READY_FILE)
    parser.add_argument("--interval", type=positive_float, default=30.0, help="seconds between rounds")
    parser.add_argument("--vfnum-evict-in-use", choices=("true", "false"), default="false",
                        help="evict the pods holding the GPUs before a vfnum change (else refuse it)")
    parser.add_argument("--vfnum-max-parallel", type=positive_int, default=1,
                        help="nodes changing vfnum at once, cluster-wide (Leases %s-<i>)" % VFNUM_SLOT_PREFIX)
    parser.add_argument("--pod-resources-socket", default=POD_RESOURCES_SOCKET,
                        help="the kubelet's pod-resources socket: which pods hold the node's GPUs (it lists no pods)")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(COMPONENT, args)
    if not args.node_name:
        raise UsageError("--node-name is required (or NODE_NAME from the downward API)")
    if not HAS_YAML:
        raise UsageError("PyYAML is required to read driver-config")
    host = checked_host_root(args, "sys")
    kube = Kube(kube_api_client(args.kubeconfig), args.node_name, args.namespace, args.config_map,
                gpu_holders(args.pod_resources_socket))
    manager = Manager(host, kube, args.deploy_policy, args.payload_dir, args.payload_version or None,
                      args.ready_file, vfnum_policy=VfnumPolicy(args.vfnum_evict_in_use == "true",
                                                                args.vfnum_max_parallel))
    LOG.info("driver-manager starting", extra={"fields": {
        "node": args.node_name, "host_root": host.path, "deploy_policy": args.deploy_policy,
        "payload_version": args.payload_version, "vfnum_evict_in_use": args.vfnum_evict_in_use,
        "vfnum_max_parallel": args.vfnum_max_parallel}})
    return run_loop(manager, args.interval, stop_event())


if __name__ == "__main__":
    run_main(COMPONENT, lambda: main(sys.argv[1:]))
