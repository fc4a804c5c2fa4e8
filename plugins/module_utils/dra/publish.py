# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""gpu-dra and the API server: its ResourceSlices, the claims it prepares, its node's mode.

Objects travel as dicts (kube/rest.JsonApi): the typed models of
a Python client older than the cluster would drop fields such as a device's
``taints``. :class:`SliceApi` is the whole API surface gpu-dra uses; tests
give :func:`publish` a stand-in with the same four methods.
``plugin_allocatable`` is gpu-dra's half of one mode per node: it publishes
nothing while the device plugin still serves the node.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ..kube.client import ApiException, KubeClientError, core_v1, custom_objects, one_line
from ..kube.node import OwnNode
from ..names import DRA_DRIVER, LABEL_DEVICE_MODE
from .prepare import ClaimError
from .slices import Plan, plan
from .switch import plugin_allocatable

LOG = logging.getLogger("gpu-dra.publish")
GROUP = "resource.k8s.io"
VERSION = "v1"


class SliceApi:
    """ResourceSlices of this driver on one node, ResourceClaims, the Node's mode label."""

    def __init__(self, client: Any, node_name: str, timeout: float = 10.0) -> None:
        self.custom = custom_objects(client)
        self.core = core_v1(client)
        self.node_name = node_name
        self.timeout = timeout

    def list(self) -> List[Dict[str, Any]]:
        answer = self.custom.list_cluster_custom_object(
            GROUP, VERSION, "resourceslices",
            field_selector="spec.nodeName=%s,spec.driver=%s" % (self.node_name, DRA_DRIVER),
            _request_timeout=self.timeout)
        return list(answer.get("items") or [])

    def create(self, body: Dict[str, Any]) -> None:
        self.custom.create_cluster_custom_object(GROUP, VERSION, "resourceslices", body,
                                                 _request_timeout=self.timeout)

    def replace(self, body: Dict[str, Any]) -> None:
        self.custom.replace_cluster_custom_object(GROUP, VERSION, "resourceslices", body["metadata"]["name"], body,
                                                  _request_timeout=self.timeout)

    def delete(self, name: str) -> None:
        try:
            self.custom.delete_cluster_custom_object(GROUP, VERSION, "resourceslices", name,
                                                     _request_timeout=self.timeout)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def get_claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        try:
            return self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "resourceclaims", name,
                                                            _request_timeout=self.timeout)
        except ApiException as exc:
            if exc.status == 404:
                raise ClaimError("resourceclaim %s/%s not found" % (namespace, name))
            raise ClaimError("cannot read resourceclaim %s/%s: %s %s" % (namespace, name, exc.status, exc.reason))
        except Exception as exc:  # pylint: disable=broad-except  # urllib3 errors: the kubelet retries
            raise ClaimError("cannot read resourceclaim %s/%s: %s" % (namespace, name, one_line(exc)))

    def node_mode(self) -> Optional[str]:
        """The node's ``gpu.device-mode`` label (None: unset)."""
        return OwnNode(self.core, self.node_name, timeout=self.timeout).labels().get(LABEL_DEVICE_MODE)

    def plugin_allocatable(self) -> int:
        """The device plugin's ``metax-tech.com/gpu`` in the node's allocatable (0: it serves nothing)."""
        return plugin_allocatable(OwnNode(self.core, self.node_name, timeout=self.timeout).read())


def publish(api: Any, node_name: str, devices: Sequence[Dict[str, Any]], attempts: int = 3) -> Plan:
    """Make the API server hold exactly ``devices`` as this node's pool; returns what was done.

    A conflict (the slice changed since it was listed: another writer, or our own earlier
    attempt) lists again and plans again, up to ``attempts`` times.
    """
    last: Optional[Exception] = None
    for _attempt in range(attempts):
        existing = api.list()
        todo = plan(node_name, devices, existing)
        try:
            for item in todo.create:
                api.create(item)
            for item in todo.update:
                api.replace(item)
            for name in todo.delete:
                api.delete(name)
        except ApiException as exc:
            if exc.status in (409, 404):
                LOG.info("ResourceSlice changed while writing (%s): listing again", exc.status)
                last = exc
                continue
            raise
        if todo.changed:
            LOG.info("published pool %s generation %d: %d device(s), %d created, %d updated, %d deleted",
                     node_name, todo.generation, len(devices), len(todo.create), len(todo.update), len(todo.delete))
        return todo
    raise KubeClientError("cannot publish the ResourceSlices of %s after %d attempts: %s"
                          % (node_name, attempts, one_line(last)))
