# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""List and watch through the ``kubernetes`` client, as raw JSON.

The client's model classes cost milliseconds per Node; gpu-aware reads a
handful of fields, so it asks for the raw response (``_preload_content=False``)
and decodes the JSON itself. The ApiClient comes from :mod:`..kube.client`.
"""

from __future__ import annotations

import json
import socket
import threading
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from ..kube.client import ApiException, core_v1
from ..kube.pages import list_all
from .cache import Expired

CONNECT_TIMEOUT = 10.0
LIST_READ_TIMEOUT = 120.0
# Items per list page. A Node decodes in 50-150 us here (4 KB with our annotations; real nodes
# with image lists are larger), so a page holds the GIL for a few milliseconds.
LIST_PAGE_SIZE = 50


def _lines(resp: Any) -> Iterator[bytes]:
    """The newline-delimited JSON of a watch response."""
    pending = b""
    for chunk in resp.stream(amt=None, decode_content=False):
        if not chunk:
            continue
        parts = (pending + chunk).split(b"\n")
        pending = parts.pop()
        for line in parts:
            if line.strip():
                yield line
    if pending.strip():
        yield pending


class KubeSource:
    """A :class:`~.cache.Source` over one ``list_*`` method of ``CoreV1Api``.

    ``call`` is e.g. ``core.list_node`` or ``functools.partial(core.list_namespaced_config_map, ns)``;
    ``params`` are fixed query parameters such as ``field_selector``. Lists are read ``page_size``
    items at a time (:func:`..kube.pages.list_all`: an expired continue token starts over).
    """

    def __init__(self, call: Callable[..., Any], page_size: int = LIST_PAGE_SIZE, **params: Any) -> None:
        self.call = call
        self.page_size = page_size
        self.params = params
        self._lock = threading.Lock()
        self._current: Optional[Any] = None

    def _page(self, limit: int, token: Optional[str]) -> Dict[str, Any]:
        extra = {"_continue": token} if token else {}
        resp = self.call(limit=limit, _preload_content=False, _request_timeout=(CONNECT_TIMEOUT, LIST_READ_TIMEOUT),
                         **extra, **self.params)
        try:
            document = json.loads(resp.data)
        finally:
            resp.release_conn()
        return document if isinstance(document, dict) else {}

    def list(self) -> Tuple[List[Dict[str, Any]], str]:
        # In pages, not one response: decoding a page is one C call that holds the GIL, so the
        # requests served meanwhile wait for one page (a few ms), not for the whole list (hundreds
        # of ms at 2,000 nodes, docs/scale.md). A list with a limit is a consistent snapshot.
        try:
            listing = list_all(self._page, self.page_size)
        except ApiException as exc:
            if getattr(exc, "status", 0) == 410:
                raise Expired() from None
            raise
        return listing.items, listing.resource_version

    def watch(self, resource_version: str, timeout_seconds: int) -> Iterator[Dict[str, Any]]:
        try:
            resp = self.call(watch=True, resource_version=resource_version, allow_watch_bookmarks=True,
                             timeout_seconds=int(timeout_seconds), _preload_content=False,
                             _request_timeout=(CONNECT_TIMEOUT, float(timeout_seconds) + 30.0), **self.params)
        except ApiException as exc:
            if getattr(exc, "status", 0) == 410:
                raise Expired() from None
            raise
        with self._lock:
            self._current = resp
        try:
            for line in _lines(resp):
                event = json.loads(line)
                if isinstance(event, dict):
                    yield event
        finally:
            with self._lock:
                self._current = None
            try:
                resp.close()
                resp.release_conn()
            except Exception:  # pylint: disable=broad-except
                pass

    def close(self) -> None:
        """Wake a blocked watch read (shutdown)."""
        with self._lock:
            resp = self._current
        if resp is None:
            return
        for holder in (getattr(resp, "connection", None), getattr(resp, "_connection", None)):
            sock = getattr(holder, "sock", None)
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        try:
            resp.close()
        except Exception:  # pylint: disable=broad-except
            pass


def node_source(api_client: Any) -> KubeSource:
    core = core_v1(api_client)
    return KubeSource(core.list_node)


def configmap_source(api_client: Any, namespace: str, name: str) -> KubeSource:
    core = core_v1(api_client)

    def call(**kwargs: Any) -> Any:
        return core.list_namespaced_config_map(namespace, **kwargs)

    return KubeSource(call, field_selector="metadata.name=" + name)
