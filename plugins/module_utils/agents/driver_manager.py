# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""driver-manager: the GPU Operator's driver component on one node (manual section 3.1, 3.2.3).

    python -m ansible_collections.metax.gpu.plugins.module_utils.agents.driver_manager \\
        --host-root /host --node-name NODE --deploy-policy IfNotPresent \\
        --payload-dir /payload --payload-version 2.14.3 [--config-map driver-config]

Thin: every decision is in ``driver/policy.py`` and ``vfnum/config.py``, every
node change in ``driver/backend.py`` and ``vfnum/backend.py`` (the code of
``metax.gpu.driver`` and ``metax.gpu.vfnum``). Each round it

1. reads ``driver-config`` (``module-params``, ``node-module-params``, its
   node's ``node-vfnums`` entry);
2. observes the driver, decides by deployPolicy, and installs or converges
   from the payload (copied from ``--payload-dir`` into the node's root, the
   package kind chosen by the node's ``/etc/os-release`` and package tool; a
   prebuilt tree, MetaX's own layout, when it has modules for the node's
   kernel);
3. verifies the loaded module against the kernel-driver version the payload
   declares (``<payload-dir>/metax-driver.version``; MetaX's payload 2.29.0.13
   installs 2.12.13; none: the payload's own number), ``/dev/mxcd`` and
   ``mx-smi``, publishes that declaration on its Node
   (``driver.payload.version``, ``driver.payload.driver-version``: the
   controller's "on target" compares gpu-label's labels with it), then writes ``--ready-file``
   (the pod's readiness probe; the controller then sets ``driver.ready``) and
   ``gpu.driver.mode``;
4. applies its node's vfnum entry: state label ``gpu.vfnum.state``
   pending -> success | failed, then deletes only its node's gpu-device pod
   so that it registers the new devices. While pods on the node hold its GPUs
   the change is refused, or with ``--vfnum-evict-in-use`` (the CR's
   ``spec.driver.vfnumPolicy.evictInUse``) they are evicted through the
   eviction API first; and only ``--vfnum-max-parallel`` nodes change at once
   (a slot of ``kube/slots.py`` taken before, given back after). A node
   waiting for a slot is not failing: a watch of the slot Leases wakes its
   round when its turn comes (``Slots.wait_turn``), not the failure backoff.

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

A failure (driver in use, invalid entry) is an Event on the ClusterOperator
and the node annotation ``driver.message`` / ``gpu.vfnum.message``, from which
the controller's status makes the ``Degraded`` condition; the same failure is
retried with backoff, never in a tight loop. Between rounds it watches the
ConfigMap, so an edit is applied within a second or two.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from .. import names
from ..backoff import Backoff
from ..driver import backend, inuse, policy
from ..driver.package import (DECLARATION_SUFFIX, DriverPackageError, check_payload_version, kernel_driver_version,
                              parse_declaration)
from ..errors import MetaxGpuError
from ..host import HostRoot, HostRootError
from ..kube import evict as kube_evict
from ..kube.client import ApiException, coordination_v1, core_v1
from ..kube.slots import POOL_LABEL, SlotError, Slots
from ..vfnum import backend as vfnum_backend
from ..vfnum import config as vfnum_config
from ..vfnum.plan import VfnumError
from ..vfnum.plan import plan as vfnum_plan
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
try:
    from kubernetes import watch as k8s_watch
except ImportError:  # with the kubernetes client (requirements/agents.txt); kube_api_client says so first
    k8s_watch = None  # type: ignore[assignment]

COMPONENT = "driver-manager"
LOG = logging.getLogger(COMPONENT)
DEFAULT_READY_FILE = "/run/driver-manager/ready"
GPU_DEVICE_SELECTOR = "app.kubernetes.io/name=" + names.DAEMONSET_GPU_DEVICE
# the node agents that read the driver: restarted after an upgrade so that the
# devices are registered and the version labels published at once (gpu-label's
# own round is a minute)
DRIVER_READERS_SELECTOR = "app.kubernetes.io/name in (%s, %s)" % (names.DAEMONSET_GPU_DEVICE, names.DAEMONSET_GPU_LABEL)
# The version an upgrade started from (node path): a pod restarted half-way
# through still knows what to roll back to.
UPGRADE_RECORD = "var/lib/metax-gpu/driver-upgrade.json"
# States in which this node's upgrade is driver-manager's to run (or to resume
# after a restart of its pod); done and failed are the controller's and the
# administrator's.
UPGRADE_STATE_INSTALLED = "driver-installed"
UPGRADE_PENDING = "pending"             # upgrade_driver's answer when an in-place upgrade waits for idle GPUs
UPGRADE_RUNNING = (names.DRIVER_UPGRADE_REQUIRED, UPGRADE_STATE_INSTALLED)
# A watch the server ends after WATCH_SECONDS; the client gives up on a connection that
# does not open in 10 s or stays silent past the server's end, so a watch that hangs
# (no TCP keepalive in the client) is reopened instead of leaving edits to the interval.
WATCH_SECONDS = 300
WATCH_REQUEST_TIMEOUT = (10.0, WATCH_SECONDS + 30.0)
# The pause before a broken watch is listed and opened again.
WATCH_RETRY_PAUSE = 5.0
# A freshly loaded driver may need a moment to create /dev/mxcd: verified this often, a second apart.
VERIFY_ATTEMPTS = 5
# The budget of nodes changing vfnum at once: Leases <prefix>-<i> in the operator's namespace.
VFNUM_SLOT_PREFIX = "metax-vfnum-slot"
# Without a watched view of the slots (the watch not open, or broken) a node waiting for a slot
# retries after SLOT_RETRY to twice that, at random (the waiters do not retry in step); with the
# view, its round is woken when the view shows a slot free for it (kube/slots.py wait_turn).
SLOT_RETRY = 5.0
# How long a round waits for evicted pods to leave. A PodDisruptionBudget's 429 is not
# waited out inside the round: the round's backoff (5 s doubling to 5 min) retries it.
EVICT_TIMEOUT = 10.0


@dataclass(frozen=True)
class VfnumPolicy:
    """spec.driver.vfnumPolicy: evict the pods holding the GPUs (else refuse), and how many nodes at once."""

    evict_in_use: bool = False
    max_parallel: int = 1


class VfnumPending(VfnumError):
    """The change waits (a slot, an eviction): state ``pending``, retried with the round's backoff.
    ``event`` is the reason it is reported under (Event and ``gpu.vfnum.message``); None: not a
    failure to report (waiting for a slot is the budget working)."""

    def __init__(self, message: str, event: Optional[str] = None) -> None:
        super().__init__(message)
        self.event = event


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


def event_changes_config(event: Mapping[str, Any], seen_version: Optional[str]) -> bool:
    """Whether a watch event of the ConfigMap differs from the version last read."""
    if event.get("type") == "DELETED":
        return seen_version is not None
    obj = event.get("object")
    meta = getattr(obj, "metadata", None)
    return getattr(meta, "resource_version", None) != seen_version


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
        meta = getattr(event.get("object"), "metadata", None)
        # the start of a change's way to the node (docs/operator.md "driver-config" times it)
        LOG.info("%s %s (resourceVersion %s): round woken", self.kube.config_map, str(event.get("type")).lower(),
                 getattr(meta, "resource_version", None))
        return True


class NodeWatched(Watched):
    """This node's Node: a change is another upgrade state or target than the last event's."""

    def __init__(self) -> None:
        self.seen: Optional[NodeUpgrade] = None

    def changed(self, event: Mapping[str, Any]) -> bool:
        meta = getattr(event.get("object"), "metadata", None)
        now = node_upgrade(getattr(meta, "labels", None) or {}, getattr(meta, "annotations", None) or {})
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


def watch_objects(wake: threading.Event, stop: threading.Event, lister: Callable[..., Any], args: Sequence[Any],
                  selector: Mapping[str, str], watched: Watched) -> None:
    """Until ``stop``: a watch of what ``selector`` picks, resumed when the server ends it, listed
    and reopened after a pause when it breaks; whatever ``watched`` says is a change wakes a round
    (sets ``wake``).

    The first opening, and each after a break (a 410 too), lists the objects from the API server's
    cache (resourceVersion "0") and watches from that list's version. A watch without a version
    asks for a consistent read, which the server answers with 504 "Too large resource version"
    after 3 s whenever the cache of this kind lags behind etcd -- on a busy cluster, for a kind as
    quiet as a ConfigMap, every time: the watch never opened and an edit waited for the interval
    (docs/operator.md "driver-config"). A watch the server ended after WATCH_SECONDS is resumed
    from the last version it saw, bookmarks included, without a list: three lists per node every
    WATCH_SECONDS were 20 lists a second at 2,000 nodes (docs/scale.md).
    """
    if k8s_watch is None:
        return
    version: Optional[str] = None
    while not stop.is_set():
        stream = k8s_watch.Watch()
        try:
            if version is None:
                found = lister(*args, resource_version="0", _request_timeout=WATCH_REQUEST_TIMEOUT, **selector)
                if watched.opened(found.items or []):
                    wake.set()
                version = found.metadata.resource_version
            for event in stream.stream(lister, *args, resource_version=version, allow_watch_bookmarks=True,
                                       timeout_seconds=WATCH_SECONDS, _request_timeout=WATCH_REQUEST_TIMEOUT,
                                       **selector):
                # a bookmark only moves the version to resume from (the stream keeps it), it is no object
                if event.get("type") != "BOOKMARK" and watched.changed(event):
                    wake.set()
                if stop.is_set():
                    break
            version = stream.resource_version or version
        except Exception as exc:  # pylint: disable=broad-except  # a broken watch (a 410 too): listed again
            LOG.warning("watch (%s) broken, listed and reopened in %.0f s: %s", ",".join(selector.values()),
                        WATCH_RETRY_PAUSE, str(exc).replace("\n", " ")[:300])
            version = None
            watched.broken()
            stop.wait(WATCH_RETRY_PAUSE)
        finally:
            stream.stop()


def _raw_json(resp: Any, decode: bool = True) -> Any:
    """A raw answer (``_preload_content=False``) read to its end, its connection given back to the
    pool; its JSON when ``decode`` (None for a body that is not JSON, as the client's own decoding
    would not raise either: the round goes on with what it has)."""
    try:
        body = resp.data
        return json.loads(body) if decode and body else None
    except ValueError:
        return None
    finally:
        resp.release_conn()


class Kube:
    """The API calls driver-manager makes (RBAC: nodes get/list/watch/patch, pods list and
    pods/eviction create cluster-wide; configmaps get/watch, pods delete, events create, leases
    list/watch/create/update/delete in its namespace)."""

    def __init__(self, api: Any, node: str, namespace: str, config_map: str) -> None:
        self.api = api
        self.core = core_v1(api)
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
        self.config_version = found.metadata.resource_version
        return found.data or {}

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
        conditions), in every round of every node."""
        found = _raw_json(self.core.read_node(self.node, _preload_content=False))
        meta = found.get("metadata") if isinstance(found, dict) else None
        return meta if isinstance(meta, dict) else {}

    def patch_node(self, labels: Mapping[str, Optional[str]], annotations: Mapping[str, Optional[str]]) -> None:
        meta: Dict[str, Any] = {}
        if labels:
            meta["labels"] = dict(labels)
        if annotations:
            meta["annotations"] = dict(annotations)
        if meta:
            # the answer (the whole Node) is not read: not built into models
            _raw_json(self.core.patch_node(self.node, {"metadata": meta}, _content_type="application/merge-patch+json",
                                           _preload_content=False), decode=False)

    def restart_gpu_device(self, selector: str = GPU_DEVICE_SELECTOR) -> List[str]:
        """Delete this node's gpu-device pod, or the pods ``selector`` picks (their DaemonSets
        recreate them); the names deleted."""
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=selector,
                                             field_selector="spec.nodeName=" + self.node).items
        for pod in pods:
            self.core.delete_namespaced_pod(pod.metadata.name, self.namespace, grace_period_seconds=1)
        return [p.metadata.name for p in pods]

    def gpu_pods(self) -> List[str]:
        """``namespace/name`` of the pods on this node that request the GPU resource (the eviction
        code's own selection: the pods it would evict)."""
        return kube_evict.evict(self.core, self.node, check_mode=True)["selected"]

    def evict_gpu_pods(self, timeout: float) -> List[str]:
        """Evict them (policy/v1 Eviction, never forced) and wait up to ``timeout`` for them to
        leave; kube_evict.EvictionError names those left, and comes at once on a budget's refusal
        (429: the round's backoff retries it, no wait inside the round)."""
        return kube_evict.evict(self.core, self.node, timeout=timeout, retry_refused=False)["evicted"]

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
    """One node's driver and vfnum, reconciled round after round."""

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
        self.vfnum_state: Optional[str] = None    # the state label this process wrote last
        self.node_labels: Dict[str, str] = {}    # the Node's labels as this round read them (and wrote)
        self.node_annotations: Dict[str, str] = {}  # and its annotations
        self.policy = deploy_policy
        self.payload_dir = payload_dir
        self.payload_version = payload_version
        self._payload_driver: Optional[str] = None      # the payload's declaration, read once
        self.ready_file = ready_file
        self.cmds = backend.NodeCommands(host, runner)
        self.last_failure: Dict[str, str] = {}    # what -> message, so each failure is reported once
        self.verify_pause = 1.0                   # seconds between verifications of a freshly loaded driver
        self.round_started = time.monotonic()
        # the last verification passed (the next round may apply vfnum before the driver part)
        self.driver_verified = False
        # driver-config as last parsed, and the ConfigMap's resourceVersion it was parsed from
        self._config: Optional[Config] = None
        self._config_version: Optional[str] = None

    # -- driver ---------------------------------------------------------------
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
            self.kube.patch_node({}, want)

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
                self.kube.restart_gpu_device()
                self.kube.event("DriverInstalled", decision.reason, warning=False)
        elif decision.action == "keep":
            request = backend.Request(state="present", deploy_policy="IfNotPresent", load_command=load)
            out["result"] = backend.run(self.host, request, False, runner=self.cmds.runner)
        verified = self.verified(self.driver_of(decision.target) if decision.action != "none" else None)
        if self.node_labels.get(names.LABEL_DRIVER_MODE) != decision.mode:
            # written when the Node (read at the round's start) says otherwise, not every round:
            # a write per node per interval, at 2,000 nodes 4,000 node writes a minute doing nothing
            self.kube.patch_node({names.LABEL_DRIVER_MODE: decision.mode}, {})
            if decision.mode is None:
                self.node_labels.pop(names.LABEL_DRIVER_MODE, None)
            else:
                self.node_labels[names.LABEL_DRIVER_MODE] = decision.mode
        out["verified"] = verified
        return out

    def own(self, version: str) -> None:
        """Record the driver as driver-manager's (gpu.driver.mode=cloud from now on)."""
        self.write_record(policy.OWNER_RECORD, {"version": version, "installedBy": COMPONENT})

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
        reasons = ["pod %s requests %s" % (pod, names.RESOURCE_NAME) for pod in self.kube.gpu_pods()]
        return reasons + inuse.in_use(self.host)

    def upgrade_pending(self, target: str, reasons: Sequence[str]) -> str:
        """An in-place upgrade that waits for idle GPUs: said on the node (once per reason), retried next round."""
        message = (names.PENDING_MESSAGE_PREFIX + "in use (%s); the upgrade to %s waits until the node's GPUs are idle "
                   "(upgradePolicy.enableRollout false: no cordon, no eviction)" % ("; ".join(reasons), target))[:900]
        if self.node_annotations.get(names.ANNOTATION_DRIVER_UPGRADE_MESSAGE) != message:
            LOG.info("upgrade: %s", message)
            self.kube.patch_node({}, {names.ANNOTATION_DRIVER_UPGRADE_MESSAGE: message})
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
            self.kube.patch_node({names.LABEL_DRIVER_UPGRADE_STATE: UPGRADE_STATE_INSTALLED}, {})
            self.verify_settled(self.driver_of(target))
        except backend.DriverInUseError as exc:
            if in_place:          # a process opened a GPU since the check: still only a wait
                return self.upgrade_pending(target, [str(exc).split(": ", 1)[-1]])
            raise
        except (backend.DriverError, HostRootError) as exc:
            return self.upgrade_failed(record, load, str(exc))
        # the devices registered anew and the version labels published now, not in a minute
        self.kube.restart_gpu_device(DRIVER_READERS_SELECTOR)
        self.verified(self.driver_of(target))
        self.kube.patch_node({names.LABEL_DRIVER_UPGRADE_STATE: names.DRIVER_UPGRADE_DONE,
                              names.LABEL_DRIVER_MODE: policy.MODE_CLOUD},
                             {names.ANNOTATION_DRIVER_UPGRADE_MESSAGE: None})
        self.remove_record(UPGRADE_RECORD)
        kmd = self.driver_of(target)
        message = "driver %s -> %s%s, installed in %.1f s, verified" % (
            record.get("from"), target, "" if kmd == target else " (kernel driver %s)" % kmd, installed)
        LOG.info("upgrade: %s", message)
        self.kube.event("DriverUpgraded", message, warning=False)
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
        self.kube.restart_gpu_device(DRIVER_READERS_SELECTOR)
        self.verified(None)
        # cordoned it stays (the controller never finishes a failed node): the administrator's now
        self.kube.patch_node({names.LABEL_DRIVER_UPGRADE_STATE: "failed"},
                             {names.ANNOTATION_DRIVER_UPGRADE_MESSAGE: message})
        self.remove_record(UPGRADE_RECORD)
        self.kube.event("DriverUpgradeFailed", message)
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

    # -- vfnum ----------------------------------------------------------------
    def reconcile_vfnum(self, wanted: Optional[int]) -> Optional[str]:
        """Bring the node's VFs to ``wanted`` (None: no entry); the state label written, if any.

        Who holds the GPUs is asked only when a change is planned: the node (processes holding
        the device nodes) and the API (pods on this node requesting the GPU resource, which the
        refusal names). Refused while held, unless the policy says evict. The change itself
        (eviction included: it is the disruption the budget bounds) runs inside a slot.
        """
        if wanted is None:
            return None
        pfs = vfnum_backend.read_pfs(self.host)
        plan = vfnum_plan(pfs, wanted)           # allowed values, sriov_totalvfs, gpu.sriov=forbidden
        if not plan.changed:
            return None
        pods = self.kube.gpu_pods()
        reasons = vfnum_backend.in_use(self.host, pfs, plan, pods)
        evict = bool(reasons) and bool(pods) and self.vfnum_policy.evict_in_use
        if reasons and not evict:
            hint = "" if self.vfnum_policy.evict_in_use or not pods else \
                "; spec.driver.vfnumPolicy.evictInUse: true evicts the pods"
            raise VfnumError("vfnum %d refused: the GPUs are in use (%s)%s" % (wanted, "; ".join(reasons), hint))
        LOG.info("vfnum %d: entry validated %.2f s into the round", wanted, self.round_clock())
        if self.slots.take() is None:
            self.mark_vfnum("pending")
            raise VfnumPending("vfnum %d waits for one of %d vfnum slots (held by %s)"
                               % (wanted, self.vfnum_policy.max_parallel, ", ".join(self.slots.holders) or "?"))
        try:
            self.mark_vfnum("pending")
            if evict:
                self.evict_holders(wanted, pods)
                reasons = vfnum_backend.in_use(self.host, pfs, plan, self.kube.gpu_pods())
                if reasons:
                    raise VfnumError("vfnum %d refused after the eviction: the GPUs are still in use (%s)"
                                     % (wanted, "; ".join(reasons)))
            return self.apply_vfnum(wanted, plan)
        finally:
            self.slots.release()

    def evict_holders(self, wanted: int, pods: Sequence[str]) -> None:
        """Evict the pods holding the GPUs; a refusal (a PodDisruptionBudget) or pods slow to leave
        keep the change pending, reported and retried with the round's backoff."""
        LOG.info("vfnum %d: evicting %s", wanted, ", ".join(pods))
        try:
            evicted = self.kube.evict_gpu_pods(EVICT_TIMEOUT)
        except kube_evict.EvictionError as exc:
            if exc.refused:
                why = "; ".join("eviction of %s refused: %s" % item for item in sorted(exc.refused.items()))
            elif exc.remaining:
                why = "evicted pod(s) %s still on the node after %.0f s" % (", ".join(exc.remaining), EVICT_TIMEOUT)
            else:
                why = str(exc)
            raise VfnumPending("vfnum %d pending: %s; retried" % (wanted, why),
                               event="VfnumEvictionRefused" if exc.refused else "VfnumEvictionPending")
        LOG.info("vfnum %d: %s evicted %.2f s into the round", wanted, ", ".join(evicted) or "(none)",
                 self.round_clock())
        self.kube.event("VfnumEvicted", "vfnum %d: evicted %s" % (wanted, ", ".join(evicted)), warning=False)

    def mark_vfnum(self, state: str) -> None:
        if self.vfnum_state != state:
            self.kube.patch_node({names.LABEL_VFNUM_STATE: state}, {})
            self.vfnum_state = state

    def apply_vfnum(self, wanted: int, plan: Any) -> str:
        try:
            vfnum_backend.apply(self.host, plan)
        except VfnumError as exc:
            self.kube.patch_node({names.LABEL_VFNUM_STATE: "failed"}, {names.ANNOTATION_VFNUM_MESSAGE: str(exc)})
            self.vfnum_state = "failed"
            raise
        LOG.info("vfnum %d: written to sysfs %.2f s into the round", wanted, self.round_clock())
        # gpu.vfnum is gpu-label's (it reads sysfs): only the state is ours
        self.kube.patch_node({names.LABEL_VFNUM_STATE: "success"}, {names.ANNOTATION_VFNUM_MESSAGE: None})
        self.vfnum_state = "success"
        deleted = self.kube.restart_gpu_device()
        LOG.info("vfnum %d applied; gpu-device pod(s) %s deleted %.2f s into the round", wanted,
                 ", ".join(deleted) or "(none)", self.round_clock())
        self.kube.event("VfnumApplied", "vfnum %d applied" % wanted, warning=False)
        return "success"

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
        self.node_labels = dict(meta.get("labels") or {})
        self.node_annotations = dict(meta.get("annotations") or {})
        upgrade = node_upgrade(self.node_labels, self.node_annotations)
        target = upgrade.target if self.acts_on(upgrade) else None    # the version to upgrade to now
        vfnum_first = self.driver_verified and target is None
        vfnum_ok = self.vfnum_round(config) if vfnum_first else True
        ok = True
        try:
            # the controller's target for this node is the kernel driver this payload declares
            self.publish_payload(self.node_annotations)
            if target is not None:
                # a failed upgrade is reported on the node (state failed), rolled back, and not retried
                self.upgrade_driver(target, params, upgrade.in_place)
            else:
                self.reconcile_driver(params)
            LOG.debug("driver reconciled %.2f s into the round", self.round_clock())
            self.report("DriverFailed", names.ANNOTATION_DRIVER_MESSAGE, None)
        except (backend.DriverError, policy.PolicyError, HostRootError) as exc:
            self.verified(None)
            self.report("DriverFailed", names.ANNOTATION_DRIVER_MESSAGE, str(exc))
            ok = False
        if not vfnum_first:
            vfnum_ok = self.vfnum_round(config)
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
                self.reconcile_vfnum(config.vfnum)
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
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(COMPONENT, args)
    if not args.node_name:
        raise UsageError("--node-name is required (or NODE_NAME from the downward API)")
    if not HAS_YAML:
        raise UsageError("PyYAML is required to read driver-config")
    host = checked_host_root(args, "sys")
    kube = Kube(kube_api_client(args.kubeconfig), args.node_name, args.namespace, args.config_map)
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
