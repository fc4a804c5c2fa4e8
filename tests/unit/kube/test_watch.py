# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""kube/watch.py: the state machine of the one list/watch without a server (410, bookmarks, resume after a
disconnect, relist), the loop over a scripted source, and RawSource over a fake client call.

gpu-aware's use against a fake API server through the real client: tests/unit/extender/test_cache.py;
driver-manager's: tests/unit/agents/test_driver_manager.py."""

from __future__ import annotations

import json
import logging
import threading
from typing import Any, Dict, List

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.backoff import Backoff
from ansible_collections.metax.gpu.plugins.module_utils.kube.client import ApiException
from ansible_collections.metax.gpu.plugins.module_utils.kube.pages import NotJson
from ansible_collections.metax.gpu.plugins.module_utils.kube.watch import (
    Expired, ListWatch, RawSource, WatchError, WatchPolicy, WatchState, classify)

LOG = logging.getLogger("test")


def obj(name: str, version: str) -> Dict[str, Any]:
    return {"kind": "ConfigMap", "metadata": {"name": name, "resourceVersion": version}}


def event(kind: str, name: str, version: str) -> Dict[str, Any]:
    return {"type": kind, "object": obj(name, version)}


BOOKMARK = {"type": "BOOKMARK", "object": {"kind": "ConfigMap", "metadata": {"resourceVersion": "15"}}}


def api_error(status: int) -> ApiException:
    exc = ApiException()
    exc.status, exc.reason = status, "error %d" % status
    return exc


# -- the decisions ------------------------------------------------------------------------------

def test_a_new_watch_lists_first_then_watches_from_the_lists_version():
    state = WatchState(WatchPolicy())
    assert state.must_list(0.0)
    state.listed("10", 0.0)
    assert not state.must_list(10_000.0) and state.version == "10"      # no resync: never again by itself


def test_each_object_event_and_a_bookmark_move_the_resume_point():
    state = WatchState(WatchPolicy())
    state.listed("10", 0.0)
    step = state.seen(event("MODIFIED", "a", "12"))
    assert (step.action, step.event_type, step.obj) == ("apply", "MODIFIED", obj("a", "12")) and state.version == "12"
    step = state.seen(BOOKMARK)
    assert step.action == "bookmark" and step.obj is None and state.version == "15"   # not handed to the handler
    # an event without a version (or no object) keeps the last one
    assert state.seen({"type": "ADDED", "object": {"metadata": {}}}).action == "apply" and state.version == "15"
    assert state.seen({"type": "ADDED", "object": "not an object"}).action == "skip" and state.version == "15"


def test_a_watch_the_server_ends_resumes_from_the_last_version_without_a_list():
    state = WatchState(WatchPolicy())
    state.listed("10", 0.0)
    state.seen(event("ADDED", "a", "11"))
    assert not state.ended(events=1, elapsed=240.0)          # an ordinary end: no pause
    assert not state.must_list(240.0) and state.version == "11"
    assert state.ended(events=0, elapsed=0.1)                # ended at once with nothing: pause, do not spin
    assert not state.ended(events=0, elapsed=240.0)


@pytest.mark.parametrize("error", [{"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}])
def test_410_gone_lists_again(error):
    state = WatchState(WatchPolicy())
    state.listed("10", 0.0)
    with pytest.raises(Expired):
        state.seen(error)
    state.expired()
    assert state.must_list(1.0) and state.version is None


def test_another_error_event_is_a_break_not_an_event():
    with pytest.raises(WatchError, match="500: internal"):
        classify({"type": "ERROR", "object": {"code": 500, "message": "internal"}})


def test_after_a_disconnect_the_watch_resumes_from_its_version_unless_the_view_must_be_rebuilt():
    resume = WatchState(WatchPolicy())
    resume.listed("10", 0.0)
    resume.seen(event("MODIFIED", "a", "13"))
    assert not resume.failed() and resume.version == "13" and not resume.must_list(1.0)
    rebuild = WatchState(WatchPolicy(relist_after_error=True))       # driver-manager's: the view is dropped
    rebuild.listed("10", 0.0)
    assert rebuild.failed() and rebuild.must_list(1.0)
    never_listed = WatchState(WatchPolicy())                          # a failed first list: still a list next
    assert never_listed.failed() and never_listed.must_list(0.0)


def test_the_periodic_resync_lists_again_and_cuts_the_watch_to_it():
    state = WatchState(WatchPolicy(resync_seconds=300.0, watch_seconds=240))
    state.listed("10", 1000.0)
    assert state.watch_timeout(1000.0) == 240
    assert state.watch_timeout(1200.0) == 100                # the next watch ends at the resync
    assert state.watch_timeout(1299.9) == 1                  # never 0 (the server's default is minutes)
    assert not state.must_list(1299.0) and state.must_list(1300.0)


# -- the loop over a scripted source ----------------------------------------------------------

class Scripted:
    """A Source: lists and watches answer from scripts (an exception raises); the end of the last watch sets ``stop``."""

    def __init__(self, lists: List[Any], watches: List[Any], stop: threading.Event) -> None:
        self.lists, self.watches, self.stop = list(lists), list(watches), stop
        self.calls: List[str] = []

    def list(self, resource_version):
        self.calls.append("list %s" % resource_version)
        item = self.lists.pop(0)
        if isinstance(item, Exception):
            raise item
        return item

    def watch(self, version, timeout):
        self.calls.append("watch %s" % version)
        step = self.watches.pop(0)
        last = not self.watches
        if isinstance(step, Exception):
            if last:
                self.stop.set()
            raise step
        yield from step
        if last:                   # the server ended the last watch: the test is over
            self.stop.set()

    def close(self):
        self.calls.append("close")


class Recorder:
    def __init__(self, fail_on=None):
        self.seen: List[Any] = []
        self.fail_on = fail_on

    def replace(self, items):
        self.seen.append(("replace", [i["metadata"]["name"] for i in items]))

    def apply(self, kind, item):
        self.seen.append((kind, item["metadata"]["name"]))
        if kind == self.fail_on:
            raise ValueError("a handler's bug")

    def broken(self):
        self.seen.append("broken")


def run(source, handler, policy=WatchPolicy(), **kwargs):
    listed, restarted = [], []
    loop = ListWatch("things", source, handler, LOG, policy, Backoff(0.0, 0.0), stop=source.stop,
                     listed=listed.append, restarted=lambda: restarted.append(1), **kwargs)
    loop.run()
    return loop, listed, restarted


def test_the_loop_resumes_relists_on_410_and_reconnects_after_a_failure():
    stop = threading.Event()
    source = Scripted(
        lists=[([obj("a", "5")], "5"), ([obj("a", "20")], "20")],
        watches=[[event("ADDED", "b", "6"), BOOKMARK],                   # ended by the server
                 ConnectionResetError("reset"),                          # a disconnect: resumed from 15
                 [event("MODIFIED", "b", "16"), {"type": "ERROR", "object": {"code": 410}}],
                 [event("DELETED", "a", "21")]], stop=stop)
    handler = Recorder()
    loop, listed, restarted = run(source, handler, WatchPolicy(list_version="0"))
    assert source.calls == ["list 0", "watch 5", "watch 15", "watch 15", "list 0", "watch 20"]
    assert handler.seen == [("replace", ["a"]), ("ADDED", "b"), ("MODIFIED", "b"), "broken", ("replace", ["a"]),
                            ("DELETED", "a")]
    assert listed == [1, 1] and restarted == [1] and loop.lists == 2 and loop.restarts == 1


def test_a_view_that_must_not_outlive_a_break_is_dropped_and_listed_again():
    stop = threading.Event()
    source = Scripted(lists=[RuntimeError("apiserver down"), ([], "3"), ([], "7")],
                      watches=[RuntimeError("connection reset"), [event("ADDED", "a", "8")]], stop=stop)
    handler = Recorder()
    _loop, _listed, restarted = run(source, handler, WatchPolicy(relist_after_error=True))
    assert source.calls == ["list None", "list None", "watch 3", "list None", "watch 7"]
    assert handler.seen == ["broken", ("replace", []), "broken", ("replace", []), ("ADDED", "a")]
    assert restarted == [1, 1]


def test_a_handlers_exception_is_logged_and_the_watch_goes_on(caplog):
    stop = threading.Event()
    source = Scripted(lists=[([], "1")], watches=[[event("ADDED", "a", "2"), event("MODIFIED", "a", "3")]], stop=stop)
    handler = Recorder(fail_on="ADDED")
    with caplog.at_level(logging.ERROR):
        loop, _listed, restarted = run(source, handler)
    assert handler.seen[1:] == [("ADDED", "a"), ("MODIFIED", "a")] and restarted == []
    assert loop.state.version == "3" and "handling a ADDED event failed" in caplog.text


def test_stop_ends_the_loop_and_closes_the_source():
    stop = threading.Event()
    opened = threading.Event()

    class Blocking(Scripted):
        def watch(self, version, timeout):
            self.calls.append("watch %s" % version)
            opened.set()
            stop.wait(60)          # until the test stops the loop (generous: it must come first)
            yield event("ADDED", "late", "9")     # read after stop: not applied

    source = Blocking(lists=[([], "1")], watches=[], stop=stop)
    handler = Recorder()
    loop = ListWatch("things", source, handler, LOG, stop=stop).start()
    assert opened.wait(60)
    loop.stop(timeout=60)
    assert loop.thread is not None and not loop.thread.is_alive()
    assert "close" in source.calls and handler.seen == [("replace", [])]


# -- RawSource over the client's raw calls ----------------------------------------------------

class Answer:
    def __init__(self, body=b"", chunks=()):
        self.data = body
        self.chunks = list(chunks)
        self.released = False

    def stream(self, amt=None, decode_content=False):
        yield from self.chunks

    def release_conn(self):
        self.released = True

    def close(self):
        pass


def test_raw_source_lists_in_pages_with_the_version_on_the_first_page_only():
    calls, answers = [], []
    pages = [{"items": [obj("a", "1"), obj("b", "2")], "metadata": {"resourceVersion": "40", "continue": "t1"}},
             {"items": [obj("c", "3")], "metadata": {"resourceVersion": "40"}}]

    def call(**kwargs):
        calls.append(kwargs)
        answers.append(Answer(json.dumps(pages[len(calls) - 1]).encode()))
        return answers[-1]
    items, version = RawSource(call, page_size=2, field_selector="metadata.name=x").list("0")
    assert [i["metadata"]["name"] for i in items] == ["a", "b", "c"] and version == "40"
    assert calls[0]["resource_version"] == "0" and "resource_version" not in calls[1]
    assert calls[1]["_continue"] == "t1" and all(c["limit"] == 2 and c["_preload_content"] is False for c in calls)
    assert all(c["field_selector"] == "metadata.name=x" for c in calls) and all(a.released for a in answers)


def test_raw_source_watches_with_bookmarks_and_splits_lines_across_chunks():
    calls = []
    body = b"".join(json.dumps(e).encode() + b"\n" for e in (event("ADDED", "a", "5"), BOOKMARK))
    answer = Answer(chunks=[body[:7], b"", body[7:40], body[40:]])

    def call(**kwargs):
        calls.append(kwargs)
        return answer
    events = list(RawSource(call).watch("4", 60))
    assert events == [event("ADDED", "a", "5"), BOOKMARK] and answer.released
    assert calls[0]["watch"] and calls[0]["allow_watch_bookmarks"] and calls[0]["resource_version"] == "4"
    assert calls[0]["timeout_seconds"] == 60 and calls[0]["_request_timeout"][1] > 60


def test_raw_source_410_is_expired_and_a_page_that_is_not_json_is_an_error():
    def gone(**kwargs):
        raise api_error(410)
    with pytest.raises(Expired):
        RawSource(gone).list(None)
    with pytest.raises(Expired):
        list(RawSource(gone).watch("4", 60))

    def html(**kwargs):
        return Answer(b"<html>a proxy's error page</html>")
    with pytest.raises(NotJson):            # never an empty list that would empty a cache
        RawSource(html).list(None)
