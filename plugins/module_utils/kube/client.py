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

import contextlib
import json
import os
import re
from typing import Any, Iterator, Optional

from ..errors import MetaxGpuError

try:
    from kubernetes import client as k8s_client, config as k8s_config
    from kubernetes.client.exceptions import ApiException
    import urllib3  # the kubernetes client's transport
    HAS_KUBERNETES = True
except ImportError:
    k8s_client = k8s_config = urllib3 = None  # type: ignore[assignment]
    HAS_KUBERNETES = False

    class ApiException(Exception):  # type: ignore[no-redef]
        """Stand-in so ``except ApiException`` parses without the package."""

        status = 0
        reason = ""

__all__ = ["ApiException", "HAS_KUBERNETES", "KubeClientError", "KubeApiError", "KubeConnectionError", "api_client", "coordination_v1",
           "core_v1", "custom_objects", "reaching"]

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
        try:
            k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        except Exception as exc:  # pylint: disable=broad-except  # ConfigException, YAML errors, KeyError, TypeError...
            raise KubeClientError("kubeconfig %s is not usable: %s" % (kubeconfig, one_line(exc))) from exc
    else:
        try:
            k8s_config.load_incluster_config(client_configuration=configuration)
        except k8s_config.ConfigException as exc:
            raise KubeClientError("no kubeconfig given and not running in a cluster: %s" % exc)
    return k8s_client.ApiClient(configuration)


class KubeConnectionError(KubeClientError):
    """The API server could not be reached (refused, unresolvable, timed out, TLS failed)."""


class KubeApiError(KubeClientError):
    """The API server answered with an error the caller did not handle (401, 403, 404...)."""


def one_line(exc: object, limit: int = 300) -> str:
    """An exception as one short line: the Kubernetes client's own messages run over several."""
    text = re.sub(r"\s+", " ", str(exc) or type(exc).__name__).strip()
    return text if len(text) <= limit else text[:limit - 3] + "..."


@contextlib.contextmanager
def reaching(client: Any, kubeconfig: Optional[str] = None) -> Iterator[None]:
    """Calls to the API server inside turn a connection failure into one line naming the server and the
    kubeconfig (a KubeConnectionError, a MetaxGpuError), instead of urllib3's traceback."""
    try:
        yield
    except ApiException as exc:
        if not getattr(exc, "status", None):
            raise _connection_error(client, kubeconfig, exc) from exc
        # the server answered (401 with a bad token, 403, 404...): its answer in one line, not the
        # client's multi-line dump of headers and body
        raise KubeApiError("the Kubernetes API server %s (%s) answered %s %s: %s" % (
            _host(client), _source(kubeconfig), exc.status, exc.reason or "", _api_message(exc))) from exc
    except Exception as exc:  # pylint: disable=broad-except
        if (urllib3 is not None and isinstance(exc, urllib3.exceptions.HTTPError)) or isinstance(exc, OSError):
            raise _connection_error(client, kubeconfig, exc) from exc
        raise


def _host(client: Any) -> str:
    return getattr(getattr(client, "configuration", None), "host", None) or "?"


def _source(kubeconfig: Optional[str]) -> str:
    return "kubeconfig %s" % kubeconfig if kubeconfig else "in-cluster service account"


def _api_message(exc: Any) -> str:
    try:
        message = json.loads(exc.body or "{}").get("message")
    except (TypeError, ValueError, AttributeError):
        message = None
    return one_line(message or exc.body or "")


def _connection_error(client: Any, kubeconfig: Optional[str], exc: BaseException) -> KubeConnectionError:
    reason = getattr(exc, "reason", None) or exc    # MaxRetryError: the cause, not the URL and retry count
    return KubeConnectionError("cannot reach the Kubernetes API server %s (%s): %s"
                               % (_host(client), _source(kubeconfig), one_line(reason)))


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


def custom_objects(client: Any) -> Any:
    """CustomObjectsApi over an ApiClient: any group's objects as dicts (gpu-dra's resource.k8s.io/v1,
    whose fields the typed models of an older client would drop)."""
    if not HAS_KUBERNETES:
        raise KubeClientError(MISSING)
    return k8s_client.CustomObjectsApi(client)
