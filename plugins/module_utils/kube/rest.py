# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The Kubernetes REST calls of the collection, as JSON, without the client's typed API classes.

A typed API class of the ``kubernetes`` package imports a model class for
every kind its methods name: ``CoreV1Api`` costs about 0.3 s of CPU with
kubernetes 36 and over 1 s with 37, whose models are pydantic classes built
at import. Every module run that talks to the API server and every agent start
paid it, and the collection reads a few fields of the JSON anyway
(:mod:`.pages`: ``_preload_content=False`` everywhere it counts).

:class:`JsonApi` sends the same requests over the ApiClient's own connection
pool (TLS, client certificate, proxy, retries as configured by the kubeconfig
loader) with its credentials (the kubeconfig's token hook runs before each
request, as in the client) and its default headers (User-Agent,
impersonation). Its methods keep the client's operation names and arguments
(``read_node(name)``, ``list_namespaced_pod(namespace, label_selector=...)``),
so a call reads as the API reference names it; the answer is the decoded JSON
object, or with ``_preload_content=False`` the urllib3 response (read it and
give its connection back: :func:`.pages.raw_json`). An error answer raises the
client's ApiException with its status, reason, body and headers.
"""

from __future__ import annotations

import datetime
import json
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import quote, urlencode

from .client import ApiException, KubeClientError, urllib3
from .pages import raw_json

__all__ = ["JsonApi", "query_name"]

CORE = "/api/v1"
COORDINATION = "/apis/coordination.k8s.io/v1"
APPS = "/apis/apps/v1"
JSON = "application/json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"

# the client's argument names whose query parameter is not their camelCase
_QUERY_NAMES = {"_continue": "continue"}


def query_name(argument: str) -> str:
    """``label_selector`` -> ``labelSelector``, as the client's generated methods map them."""
    if argument in _QUERY_NAMES:
        return _QUERY_NAMES[argument]
    head, *rest = argument.split("_")
    return head + "".join(word[:1].upper() + word[1:] for word in rest)


def _query_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _jsonable(value: Any) -> Any:
    """What json cannot write, as the client's serializer writes it (a datetime as ISO 8601)."""
    if isinstance(value, (datetime.datetime, datetime.date)):
        return value.isoformat()
    raise TypeError("%r is not JSON serializable" % (value,))


def _timeout(value: Any) -> Any:
    """The client's ``_request_timeout``: seconds in all, or (connect, read)."""
    if not value:
        return None
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return urllib3.Timeout(connect=value[0], read=value[1])
    return urllib3.Timeout(total=value)


def _segment(value: str) -> str:
    """A name or namespace as one path segment. "." and ".." would be dot segments, which urllib3 resolves
    (a DELETE of pod ".." would reach the namespace); "" would address the collection. The API server
    allows none of them as a name."""
    if value in ("", ".", ".."):
        raise KubeClientError("%r is not a Kubernetes object name" % value)
    return quote(value, safe="")


def _path(base: str, plural: str, namespace: Optional[str] = None, name: Optional[str] = None,
          subresource: Optional[str] = None) -> str:
    parts: List[str] = [base]
    if namespace is not None:
        parts += ["namespaces", _segment(namespace)]
    parts.append(plural)
    if name is not None:
        parts.append(_segment(name))
    if subresource:
        parts.append(subresource)
    return "/".join(parts)


def _custom(group: str, version: str) -> str:
    return "/apis/%s/%s" % (group, version)


def _error(resp: Any) -> ApiException:
    """The client's ApiException for an error answer (its body read, its connection given back)."""
    try:
        body = resp.data
    finally:
        resp.release_conn()
    exc = ApiException(status=resp.status, reason=resp.reason)
    exc.body = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    exc.headers = resp.headers
    return exc


class JsonApi:  # pylint: disable=too-many-public-methods  # one thin method per API operation the collection uses
    """The collection's Kubernetes calls over ``api_client`` (a ``kubernetes.client.ApiClient``), as JSON."""

    def __init__(self, api_client: Any) -> None:
        self.api_client = api_client

    def request(self, method: str, path: str, body: Any = None, _preload_content: bool = True,
                _request_timeout: Any = None, _content_type: Optional[str] = None, **params: Any) -> Any:
        """One request; ``params``: the client's query arguments (``label_selector``, ``_continue``...)."""
        configuration = self.api_client.configuration
        headers: Dict[str, Any] = {"Accept": JSON}
        headers.update(self.api_client.default_headers)
        # as the client's own calls: its auth settings (the token under the key each client version
        # keeps it), read through the kubeconfig loader's hook, which renews an expiring token first
        for setting in configuration.auth_settings().values():
            if setting.get("in") == "header" and setting.get("value"):
                headers[setting["key"]] = setting["value"]
        if "authorization" not in headers:
            # kubernetes 36.0.0 keeps the token under "authorization" and its auth settings read only
            # "BearerToken" (so its own calls send none): the key every other version writes
            token = configuration.get_api_key_with_prefix("authorization")
            if token:
                headers["authorization"] = token
        # after the hook, which may write the kubeconfig's server back (kube/client._keep_overrides)
        query: List[Tuple[str, str]] = [(query_name(k), _query_value(v)) for k, v in params.items() if v is not None]
        url = configuration.host.rstrip("/") + path + ("?" + urlencode(query) if query else "")
        data = None
        if body is not None:
            if method == "PATCH":
                headers["Content-Type"] = _content_type or (JSON_PATCH if isinstance(body, list) else STRATEGIC_MERGE_PATCH)
            else:
                headers["Content-Type"] = _content_type or JSON
            data = json.dumps(body, default=_jsonable)
        resp = self.api_client.rest_client.pool_manager.request(
            method, url, body=data, headers=headers, timeout=_timeout(_request_timeout), preload_content=False)
        if not 200 <= resp.status <= 299:
            raise _error(resp)
        # an empty answer is no object (as the client decodes it); anything else not JSON is an error, not
        # an empty list: a proxy's error page must not read as "no pods on the node"
        return resp if not _preload_content else raw_json(resp, empty_ok=True)

    # -- core/v1 -------------------------------------------------------------------------------
    def list_node(self, **kw: Any) -> Any:
        return self.request("GET", _path(CORE, "nodes"), **kw)

    def read_node(self, name: str, **kw: Any) -> Any:
        return self.request("GET", _path(CORE, "nodes", name=name), **kw)

    def patch_node(self, name: str, body: Any, **kw: Any) -> Any:
        return self.request("PATCH", _path(CORE, "nodes", name=name), body, **kw)

    def patch_node_status(self, name: str, body: Any, **kw: Any) -> Any:
        return self.request("PATCH", _path(CORE, "nodes", name=name, subresource="status"), body, **kw)

    def list_pod_for_all_namespaces(self, **kw: Any) -> Any:
        return self.request("GET", _path(CORE, "pods"), **kw)

    def list_namespaced_pod(self, namespace: str, **kw: Any) -> Any:
        return self.request("GET", _path(CORE, "pods", namespace), **kw)

    def read_namespaced_pod(self, name: str, namespace: str, **kw: Any) -> Any:
        return self.request("GET", _path(CORE, "pods", namespace, name), **kw)

    def delete_namespaced_pod(self, name: str, namespace: str, body: Any = None, **kw: Any) -> Any:
        return self.request("DELETE", _path(CORE, "pods", namespace, name), body, **kw)

    def create_namespaced_pod_eviction(self, name: str, namespace: str, body: Any, **kw: Any) -> Any:
        return self.request("POST", _path(CORE, "pods", namespace, name, "eviction"), body, **kw)

    def list_namespaced_config_map(self, namespace: str, **kw: Any) -> Any:
        return self.request("GET", _path(CORE, "configmaps", namespace), **kw)

    def read_namespaced_config_map(self, name: str, namespace: str, **kw: Any) -> Any:
        return self.request("GET", _path(CORE, "configmaps", namespace, name), **kw)

    def create_namespaced_event(self, namespace: str, body: Any, **kw: Any) -> Any:
        return self.request("POST", _path(CORE, "events", namespace), body, **kw)

    def read_namespaced_event(self, name: str, namespace: str, **kw: Any) -> Any:
        return self.request("GET", _path(CORE, "events", namespace, name), **kw)

    def patch_namespaced_event(self, name: str, namespace: str, body: Any, **kw: Any) -> Any:
        return self.request("PATCH", _path(CORE, "events", namespace, name), body, **kw)

    # -- coordination.k8s.io/v1 ----------------------------------------------------------------
    def list_namespaced_lease(self, namespace: str, **kw: Any) -> Any:
        return self.request("GET", _path(COORDINATION, "leases", namespace), **kw)

    def read_namespaced_lease(self, name: str, namespace: str, **kw: Any) -> Any:
        return self.request("GET", _path(COORDINATION, "leases", namespace, name), **kw)

    def create_namespaced_lease(self, namespace: str, body: Any, **kw: Any) -> Any:
        return self.request("POST", _path(COORDINATION, "leases", namespace), body, **kw)

    def replace_namespaced_lease(self, name: str, namespace: str, body: Any, **kw: Any) -> Any:
        return self.request("PUT", _path(COORDINATION, "leases", namespace, name), body, **kw)

    def delete_namespaced_lease(self, name: str, namespace: str, body: Any = None, **kw: Any) -> Any:
        return self.request("DELETE", _path(COORDINATION, "leases", namespace, name), body, **kw)

    # -- apps/v1 ---------------------------------------------------------------------------------
    def list_daemon_set_for_all_namespaces(self, **kw: Any) -> Any:
        return self.request("GET", _path(APPS, "daemonsets"), **kw)

    def read_namespaced_daemon_set(self, name: str, namespace: str, **kw: Any) -> Any:
        return self.request("GET", _path(APPS, "daemonsets", namespace, name), **kw)

    def read_namespaced_deployment(self, name: str, namespace: str, **kw: Any) -> Any:
        return self.request("GET", _path(APPS, "deployments", namespace, name), **kw)

    # -- any group (resource.k8s.io's ResourceSlices and ResourceClaims) ---------------------------
    def list_cluster_custom_object(self, group: str, version: str, plural: str, **kw: Any) -> Any:
        return self.request("GET", _path(_custom(group, version), plural), **kw)

    def create_cluster_custom_object(self, group: str, version: str, plural: str, body: Any, **kw: Any) -> Any:
        return self.request("POST", _path(_custom(group, version), plural), body, **kw)

    def replace_cluster_custom_object(self, group: str, version: str, plural: str, name: str, body: Any,
                                      **kw: Any) -> Any:
        return self.request("PUT", _path(_custom(group, version), plural, name=name), body, **kw)

    def delete_cluster_custom_object(self, group: str, version: str, plural: str, name: str, body: Any = None,
                                     **kw: Any) -> Any:
        return self.request("DELETE", _path(_custom(group, version), plural, name=name), body, **kw)

    def get_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str, name: str,
                                     **kw: Any) -> Any:
        return self.request("GET", _path(_custom(group, version), plural, namespace, name), **kw)
