# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""A Kubernetes list read page by page (``limit`` + ``continue``), as one list.

One unpaged list of 2,000 Nodes makes the apiserver build and send the whole
answer in one response (tens of MiB held at once on both sides); pages of a
few hundred keep each response small and let the apiserver serve them from
its watch cache. kubernetes.core.k8s_info (6.2) has no ``limit``/``continue``,
so the playbooks' lists that grow with the cluster go through here
(module ``metax.gpu.kube_list``). docs/scale.md.

A ``continue`` token expires when etcd compacts past it (410 Gone, after about
five minutes by default); the list then starts again from the first page, so
the result is always one consistent snapshot, never two halves of different
ones.

:func:`raw_list` and :func:`raw_get` are the collection's one way to read the
API server's JSON without the client's model classes (``_preload_content=False``:
a model costs milliseconds per Node, and the callers read a few fields):
the operator's status round, the ``node_metadata`` module, the list of
:mod:`.watch` and :mod:`.node`'s read of one node.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..errors import MetaxGpuError
from .client import ApiException

__all__ = ["DEFAULT_PAGE_SIZE", "Listing", "NotJson", "PagingError", "list_all", "query", "raw_get", "raw_json",
           "raw_list"]

DEFAULT_PAGE_SIZE = 500
# (connect, read) seconds of one list page or one get: a server that stops answering is an error the
# caller retries, not a thread blocked for good.
REQUEST_TIMEOUT = (10.0, 120.0)
# Restarts after an expired continue token before giving up (each restart re-reads from the first page).
RESTARTS = 3

# fetch(limit, continue_token) -> the decoded list object ({"items": [...], "metadata": {"continue": ...}})
Fetch = Callable[[int, Optional[str]], Dict[str, Any]]


class PagingError(MetaxGpuError):
    """The list could not be read to its end (continue token kept expiring, or a bad page size)."""


class NotJson(MetaxGpuError):
    """The API server's answer was not a JSON object (a proxy's error page, a cut connection)."""


@dataclass
class Listing:
    items: List[Dict[str, Any]] = field(default_factory=list)
    pages: int = 0              # requests made, restarts included
    restarts: int = 0
    resource_version: str = ""  # of the snapshot the items come from


def _page(obj: Dict[str, Any]) -> Tuple[List[Dict[str, Any]], Optional[str], str]:
    meta = obj.get("metadata") or {}
    return list(obj.get("items") or []), meta.get("continue") or None, str(meta.get("resourceVersion") or "")


def list_all(fetch: Fetch, page_size: int = DEFAULT_PAGE_SIZE, restarts: int = RESTARTS) -> Listing:
    """Every item of the list, reading ``page_size`` at a time; a 410 on a later page starts over."""
    if page_size < 1:
        raise PagingError("page size must be at least 1 (got %d)" % page_size)
    out = Listing()
    while True:
        items: List[Dict[str, Any]] = []
        token: Optional[str] = None
        try:
            while True:
                page, token, version = _page(fetch(page_size, token))
                out.pages += 1
                if not items:
                    out.resource_version = version
                items.extend(page)
                if not token:
                    out.items = items
                    return out
        except ApiException as exc:
            if getattr(exc, "status", None) != 410 or token is None:
                raise
            if out.restarts >= restarts:
                raise PagingError("the list's continue token expired %d times (410 Gone); the cluster changes "
                                  "faster than %d items are read: try a larger page size"
                                  % (out.restarts + 1, len(items)))
            out.restarts += 1


def query(label_selectors: Optional[List[str]] = None, field_selectors: Optional[List[str]] = None) -> Dict[str, str]:
    """k8s_info's selector lists as the list call's query parameters (joined with commas, as k8s_info does)."""
    params: Dict[str, str] = {}
    if label_selectors:
        params["label_selector"] = ",".join(label_selectors)
    if field_selectors:
        params["field_selector"] = ",".join(field_selectors)
    return params


def raw_json(resp: Any, lenient: bool = False, empty_ok: bool = False) -> Dict[str, Any]:
    """A raw answer (``_preload_content=False``) read to its end and decoded, its connection given back
    to the pool. A body that is not a JSON object raises NotJson, or is {} when ``lenient`` (and, with
    ``empty_ok``, when the body is empty)."""
    try:
        body = resp.data
        if not body and empty_ok:
            return {}
        document = json.loads(body) if body else None
    except (TypeError, ValueError):
        document = None
    finally:
        resp.release_conn()
    if isinstance(document, dict):
        return document
    if lenient:
        return {}
    raise NotJson("the API server's answer is not a JSON object: %r" % (str(getattr(resp, "data", ""))[:120],))


def raw_list(call: Callable[..., Any], *args: Any, page_size: int = DEFAULT_PAGE_SIZE,
             resource_version: Optional[str] = None, timeout: Any = REQUEST_TIMEOUT, **params: Any) -> Listing:
    """Every item of a ``list_*`` call of the ``kubernetes`` client (``args``: its positional
    arguments, such as the namespace; ``params``: selectors), ``page_size`` per request, as JSON.

    ``resource_version`` "0" lets the API server answer from its watch cache; it goes with the first
    page only (a continue token carries its own).
    """
    def fetch(limit: int, token: Optional[str]) -> Dict[str, Any]:
        extra: Dict[str, Any] = {"_continue": token} if token else {}
        if resource_version is not None and not token:
            extra["resource_version"] = resource_version
        return raw_json(call(*args, limit=limit, _preload_content=False, _request_timeout=timeout, **extra, **params))
    return list_all(fetch, page_size)


def raw_get(call: Callable[..., Any], *args: Any, lenient: bool = False, timeout: Any = REQUEST_TIMEOUT,
            **params: Any) -> Dict[str, Any]:
    """One object of a ``read_*`` (or ``patch_*``) call as JSON; ``lenient``: {} for an answer that is
    not JSON, as the client's own decoding would not raise either."""
    return raw_json(call(*args, _preload_content=False, _request_timeout=timeout, **params), lenient)
