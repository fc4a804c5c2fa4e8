# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""What a node procedure (driver/node_upgrade.py, vfnum/reconcile.py) asks of the Kubernetes API
about its own node: a typing Protocol, so that the procedures import no client.

driver-manager's ``Kube`` (agents/driver_manager.py) implements it against the API server; the
unit tests' recorder (tests/unit/agents/test_driver_manager.py) against a dict. Standard library only.
"""

from __future__ import annotations

from typing import Any, List, Mapping, Optional, Protocol

from . import names

# this node's gpu-device pod (deleted: its DaemonSet recreates it, which registers the devices anew)
GPU_DEVICE_SELECTOR = "app.kubernetes.io/name=" + names.DAEMONSET_GPU_DEVICE
# the node agents that read the driver: restarted after an upgrade so that the
# devices are registered and the version labels published at once (gpu-label's
# own round is a minute)
DRIVER_READERS_SELECTOR = "app.kubernetes.io/name in (%s, %s)" % (names.DAEMONSET_GPU_DEVICE, names.DAEMONSET_GPU_LABEL)


class NodeApi(Protocol):
    """One node's view of the API: its own Node, the GPU pods on it, Events about it."""

    def node_metadata(self) -> Mapping[str, Any]:
        """This node's ``metadata`` (``labels``, ``annotations``)."""

    def patch_node(self, labels: Mapping[str, Optional[str]], annotations: Mapping[str, Optional[str]]) -> None:
        """A merge patch of this node's labels and annotations (None: delete the key)."""

    def gpu_pods(self) -> List[str]:
        """``namespace/name`` of the pods on this node that request the GPU resource."""

    def evict_gpu_pods(self, timeout: float) -> List[str]:
        """Evict them and wait up to ``timeout`` for them to leave (kube/evict.EvictionError when they
        do not, or a budget refuses); the names evicted."""

    def restart_gpu_device(self, selector: str = GPU_DEVICE_SELECTOR) -> List[str]:
        """Delete this node's pods that ``selector`` picks (their DaemonSets recreate them); the names deleted."""

    def event(self, reason: str, message: str, warning: bool = True) -> None:
        """An Event about this node's procedure."""


class RemediationApi(NodeApi, Protocol):
    """What the remediation ladder (health/remediation.py) asks beyond :class:`NodeApi`."""

    def read_node(self) -> Mapping[str, Any]:
        """This node as the API server's JSON (metadata with resourceVersion, spec, status)."""

    def merge_patch_node(self, body: Mapping[str, Any]) -> None:
        """A JSON merge patch of this node (the maintenance protocol's, with its resourceVersion);
        maintenance.run.Stale when the node changed since it was read."""

    def write_condition(self, condition: Mapping[str, Any]) -> None:
        """This node's status condition of ``condition["type"]`` (merged by type: the others stay)."""

    def node_event(self, reason: str, message: str, warning: bool = True) -> None:
        """An Event about this Node (in the agent's namespace: ``kubectl describe node`` shows it)."""

    def health_policy(self) -> Optional[str]:
        """The health policy ConfigMap's policy.json (None: no ConfigMap, the shipped defaults)."""
