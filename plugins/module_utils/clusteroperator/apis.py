# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Kinds the operator owns only where the cluster serves them: the Prometheus operator's, and
gpu-dra's DeviceClass (resource.k8s.io/v1, served from Kubernetes 1.34).

The Extensions chart renders gpu-exporter's ServiceMonitor and PrometheusRule
only when ``.Capabilities.APIVersions`` has them; ``helm template`` knows no
cluster, so the controller tells it (``--api-versions``) what discovery found.
The same answer decides which optional kinds it lists when pruning: listing a
kind whose CRD is absent fails, and most clusters (the local one too) have no
Prometheus operator. Pure functions and a cache over a discovery callable; the
discovery call itself is :meth:`cluster.Cluster.served_kinds`.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, FrozenSet, Iterable, List, Optional, Tuple

Kind = Tuple[str, str]   # (apiVersion, kind)

MONITORING_API = "monitoring.coreos.com/v1"
SERVICE_MONITOR: Kind = (MONITORING_API, "ServiceMonitor")
PROMETHEUS_RULE: Kind = (MONITORING_API, "PrometheusRule")
# gpu-dra's DeviceClasses (issue 41): resource.k8s.io/v1 is served from Kubernetes 1.34
DEVICE_CLASS: Kind = ("resource.k8s.io/v1", "DeviceClass")
# Kinds a component may own that a cluster may not serve, with the CRDs that serve them.
OPTIONAL_KINDS: Tuple[Kind, ...] = (SERVICE_MONITOR, PROMETHEUS_RULE, DEVICE_CLASS)
OPTIONAL_CRDS: FrozenSet[str] = frozenset(("servicemonitors.monitoring.coreos.com",
                                           "prometheusrules.monitoring.coreos.com"))
# How long a discovery answer is used by the paths that do not refresh it
# (drift repair, cleanup): a reconcile and an event of an OPTIONAL_CRDS CRD always ask again.
SERVED_TTL = 60.0


def group_versions(kinds: Iterable[Kind] = OPTIONAL_KINDS) -> Tuple[str, ...]:
    """The group/versions to ask discovery about (one request each), in first-seen order."""
    return tuple(dict.fromkeys(api_version for api_version, _kind in kinds))


def served_of(api_version: str, discovered_kinds: Iterable[str], kinds: Iterable[Kind] = OPTIONAL_KINDS) -> FrozenSet[Kind]:
    """Which of ``kinds`` in ``api_version`` the discovery answer (its resources' kinds) lists."""
    found = set(discovered_kinds)
    return frozenset(k for k in kinds if k[0] == api_version and k[1] in found)


def helm_api_versions(served: Iterable[Kind]) -> List[str]:
    """``helm template --api-versions`` values for the served optional kinds (sorted: a stable command)."""
    return sorted("%s/%s" % kind for kind in set(served) if kind in OPTIONAL_KINDS)


def owned_kinds(all_kinds: Iterable[Kind], served: Iterable[Kind]) -> Tuple[Kind, ...]:
    """``all_kinds`` in their order, without the optional kinds the cluster does not serve."""
    served_set = frozenset(served)
    return tuple(k for k in all_kinds if k not in OPTIONAL_KINDS or k in served_set)


def delete_policy(kind: Kind) -> str:
    """How the operator deletes an object it prunes. Foreground: a workload goes with its pods.
    Not the optional kinds: they own nothing, and the garbage collector, which clears a
    foreground deletion, notices a kind whose CRD is new only at its next resync (30 s)."""
    return "Background" if kind in OPTIONAL_KINDS else "Foreground"


class ServedKinds:
    """The optional kinds the cluster serves, asked at most once per ``ttl`` unless refreshed.

    ``discover`` is the I/O (an API call per group/version); it raises when
    discovery fails, and the caller's retry asks again (a failed answer is
    not cached).
    """

    def __init__(self, discover: Callable[[], FrozenSet[Kind]], ttl: float = SERVED_TTL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._discover = discover
        self._ttl = ttl
        self._clock = clock
        self._value: Optional[FrozenSet[Kind]] = None
        self._at = 0.0
        self._lock = threading.Lock()

    def get(self, refresh: bool = False) -> FrozenSet[Kind]:
        with self._lock:
            now = self._clock()
            if refresh or self._value is None or now - self._at >= self._ttl:
                self._value = frozenset(self._discover())
                self._at = now
            return self._value
