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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..errors import MetaxGpuError
from .client import ApiException

__all__ = ["DEFAULT_PAGE_SIZE", "Listing", "PagingError", "list_all", "query"]

DEFAULT_PAGE_SIZE = 500
# Restarts after an expired continue token before giving up (each restart re-reads from the first page).
RESTARTS = 3

# fetch(limit, continue_token) -> the decoded list object ({"items": [...], "metadata": {"continue": ...}})
Fetch = Callable[[int, Optional[str]], Dict[str, Any]]


class PagingError(MetaxGpuError):
    """The list could not be read to its end (continue token kept expiring, or a bad page size)."""


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
