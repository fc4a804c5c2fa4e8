# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The one place the collection builds a Kubernetes client.

The in-cluster agents (the service account, or a kubeconfig) and the modules
that talk to the API server from the controller (``kube_list``,
``node_metadata``, ``evict_gpu_pods``, ``driver``: their connection options)
both build it here. Below both the library (``deviceplugin``, ``extender``)
and the agent entrypoints, so neither imports the other for it. The
``kubernetes`` package is optional for everything else in plugins/: the
import is guarded and :func:`api_client` fails with a clear message when it
is missing.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from ..errors import MetaxGpuError

try:
    from kubernetes import client as k8s_client, config as k8s_config
    from kubernetes.client.exceptions import ApiException
    HAS_KUBERNETES = True
except ImportError:
    k8s_client = k8s_config = None  # type: ignore[assignment]
    HAS_KUBERNETES = False

    class ApiException(Exception):  # type: ignore[no-redef]
        """Stand-in so ``except ApiException`` parses without the package."""

        status = 0
        reason = ""

__all__ = ["ApiException", "HAS_KUBERNETES", "KubeClientError", "api_client", "coordination_v1", "core_v1"]

MISSING = "the 'kubernetes' Python package is required (requirements/agents.txt)"


class KubeClientError(MetaxGpuError):
    """No usable Kubernetes configuration (package missing, no kubeconfig, not in a cluster)."""


def api_client(kubeconfig: Optional[str] = None) -> Any:
    """An ApiClient from a kubeconfig file, or the in-cluster service account."""
    if not HAS_KUBERNETES:
        raise KubeClientError(MISSING)
    configuration = k8s_client.Configuration()
    if kubeconfig:
        if not os.path.isfile(kubeconfig):
            raise KubeClientError("kubeconfig %s: no such file" % kubeconfig)
        k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    else:
        try:
            k8s_config.load_incluster_config(client_configuration=configuration)
        except k8s_config.ConfigException as exc:
            raise KubeClientError("no kubeconfig given and not running in a cluster: %s" % exc)
    return k8s_client.ApiClient(configuration)


def core_v1(client: Any) -> Any:
    """CoreV1Api over an ApiClient from :func:`api_client`."""
    if not HAS_KUBERNETES:
        raise KubeClientError(MISSING)
    return k8s_client.CoreV1Api(client)


def coordination_v1(client: Any) -> Any:
    """CoordinationV1Api (Leases) over an ApiClient from :func:`api_client`."""
    if not HAS_KUBERNETES:
        raise KubeClientError(MISSING)
    return k8s_client.CoordinationV1Api(client)
