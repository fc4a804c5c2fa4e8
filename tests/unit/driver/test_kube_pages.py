"""Paginated lists (module_utils/kube/pages.py): every page read, one snapshot after an expired token.

The real apiserver's pages are read in tests/integration/test_scale_smoke.py (200 fake nodes, small
pages); here an in-memory list answers ``limit``/``continue`` as the apiserver does, so the restart
after 410 Gone is covered.
"""
from __future__ import annotations

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.errors import MetaxGpuError
from ansible_collections.metax.gpu.plugins.module_utils.kube.client import ApiException
from ansible_collections.metax.gpu.plugins.module_utils.kube.pages import (
    NotJson, PagingError, list_all, query, raw_get, raw_list)


class Store:
    """Items 0..n-1 behind limit/continue; ``expire`` = continue tokens that answer 410 (once each)."""

    def __init__(self, count, expire=()):
        self.items = [{"metadata": {"name": "n%d" % i}} for i in range(count)]
        self.expire = set(expire)
        self.calls = []

    def fetch(self, limit, token):
        self.calls.append((limit, token))
        if token in self.expire:
            self.expire.discard(token)
            exc = ApiException()
            exc.status, exc.reason = 410, "Gone"
            raise exc
        start = int(token or 0)
        end = start + limit
        meta = {"resourceVersion": "7"}
        if end < len(self.items):
            meta["continue"] = str(end)
        return {"items": self.items[start:end], "metadata": meta}


@pytest.mark.parametrize("count,size,pages", [(0, 500, 1), (1, 500, 1), (500, 500, 1), (501, 500, 2), (2003, 500, 5)])
def test_every_item_once_in_order(count, size, pages):
    store = Store(count)
    got = list_all(store.fetch, size)
    assert [i["metadata"]["name"] for i in got.items] == ["n%d" % i for i in range(count)]
    assert got.pages == pages == len(store.calls) and got.restarts == 0 and got.resource_version == "7"
    assert [call[0] for call in store.calls] == [size] * pages


def test_expired_token_starts_over_from_the_first_page():
    store = Store(1200, expire={"1000"})
    got = list_all(store.fetch, 500)
    assert len(got.items) == 1200 and len({i["metadata"]["name"] for i in got.items}) == 1200
    assert got.restarts == 1
    assert store.calls == [(500, None), (500, "500"), (500, "1000"), (500, None), (500, "500"), (500, "1000")]


def test_gives_up_when_the_token_keeps_expiring():
    class Always(Store):
        def fetch(self, limit, token):
            if token:
                self.expire.add(token)
            return super().fetch(limit, token)

    with pytest.raises(PagingError, match="expired 4 times") as info:
        list_all(Always(30).fetch, 10, restarts=3)
    assert isinstance(info.value, MetaxGpuError)


def test_other_errors_and_first_page_errors_pass_through():
    def forbidden(limit, token):
        exc = ApiException()
        exc.status, exc.reason = 403, "Forbidden"
        raise exc

    with pytest.raises(ApiException):
        list_all(forbidden)
    with pytest.raises(PagingError, match="at least 1"):
        list_all(Store(3).fetch, 0)


def test_selectors_join_as_k8s_info_does():
    assert query(["a=b", "c"], ["spec.nodeName=n1"]) == {"label_selector": "a=b,c", "field_selector": "spec.nodeName=n1"}
    assert query([], None) == {}


class RawAnswer:
    """urllib3's answer to a call with ``_preload_content=False``."""

    def __init__(self, body):
        self.data = body
        self.released = False

    def release_conn(self):
        self.released = True


def test_raw_list_reads_a_client_call_in_pages_as_json_and_gives_every_connection_back():
    import json
    store = Store(5)
    calls, answers = [], []

    def list_namespaced_pod(namespace, **kwargs):
        calls.append((namespace, kwargs))
        assert kwargs["_preload_content"] is False and kwargs["label_selector"] == "app=x"
        answers.append(RawAnswer(json.dumps(store.fetch(kwargs["limit"], kwargs.get("_continue"))).encode()))
        return answers[-1]
    listing = raw_list(list_namespaced_pod, "ns", page_size=2, resource_version="0", label_selector="app=x")
    assert [i["metadata"]["name"] for i in listing.items] == ["n%d" % i for i in range(5)] and listing.pages == 3
    assert all(ns == "ns" for ns, _kw in calls) and all(a.released for a in answers)
    # the version goes with the first page only: a continue token carries its own
    assert calls[0][1]["resource_version"] == "0" and all("resource_version" not in kw for _ns, kw in calls[1:])


def test_an_answer_that_is_not_json_is_an_error_unless_lenient():
    def read_node(name, **kwargs):
        return RawAnswer(b"<html>a proxy's error page</html>")
    with pytest.raises(NotJson):
        raw_get(read_node, "n1")
    assert raw_get(read_node, "n1", lenient=True) == {}
    with pytest.raises(NotJson):
        raw_list(lambda **kwargs: RawAnswer(b"[]"))
