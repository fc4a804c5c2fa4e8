# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The operator-controller's process around kopf (issue 38): /healthz of leader and standby, the wait
for an older install's namespaced CRD to be migrated, failures posted as Events. The Lease itself:
tests/unit/kube/test_leader.py; the whole process against a real API server:
tests/integration/test_operator_controller_apiserver.py."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from typing import Any, List

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.agents import operator_controller as oc
from ansible_collections.metax.gpu.plugins.module_utils.agents import operator_handlers as oh
from ansible_collections.metax.gpu.plugins.module_utils.agents.operator_handlers import failure_event, kopf_retry
from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator.operator import Retry
from ansible_collections.metax.gpu.plugins.module_utils.kube.leader import LeaderElector


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def elector(clock: Clock) -> LeaderElector:
    return LeaderElector(None, "metax-operator", "metax-operator-controller", "pod-a", clock=clock)


def test_health_of_a_standby_and_of_a_leader_that_stopped_renewing():
    clock = Clock()
    election = elector(clock)
    health = oc.Health(election, clock=clock)
    assert health.state() == (True, {"leader": False, "identity": "pod-a"})     # a standby trying
    health.leading = True
    election.last_renewed = 99.0
    assert health.state()[0] is True
    clock.now = 99.0 + election.lease_duration + 0.1                             # stuck: unhealthy
    assert health.state()[0] is False


def test_healthz_is_served_for_both_roles():
    clock = Clock()
    health = oc.Health(elector(clock), clock=clock)
    server = health.serve(0)
    port = server.server_address[1]
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d/healthz" % port, timeout=60) as resp:
            assert resp.status == 200 and json.loads(resp.read()) == {"leader": False, "identity": "pod-a"}
        health.leading = True          # never renewed: 503
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen("http://127.0.0.1:%d/healthz" % port, timeout=60)
        assert err.value.code == 503
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen("http://127.0.0.1:%d/other" % port, timeout=60)
        assert err.value.code == 404
    finally:
        server.shutdown()
        server.server_close()


class Scopes:
    """crd_scope answers in turn (what the API server says while the migration Job runs)."""

    def __init__(self, answers: List[Any]) -> None:
        self.answers = answers
        self.asked: List[str] = []
        self.invalidated = 0
        self.dynamic = self
        self.resources = self

    def invalidate_cache(self) -> None:
        self.invalidated += 1

    def crd_scope(self, name: str) -> Any:
        self.asked.append(name)
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def test_the_leader_waits_while_the_crd_is_still_namespaced():
    cluster = Scopes(["Namespaced", "Namespaced", "Cluster"])
    assert oc.wait_for_cluster_scope(cluster, threading.Event(), pause=0.0)     # type: ignore[arg-type]
    assert cluster.asked == ["clusteroperators.gpu.metax-tech.com"] * 3
    assert cluster.invalidated == 1      # discovery asked afresh once the CRD changed
    assert oc.wait_for_cluster_scope(Scopes([None]), threading.Event(), pause=0.0)   # type: ignore[arg-type]
    stop = threading.Event()
    stop.set()
    assert not oc.wait_for_cluster_scope(Scopes(["Namespaced"]), stop, pause=0.0)    # type: ignore[arg-type]


class Posting:
    def __init__(self) -> None:
        self.events: List[tuple] = []

    def post_event(self, owner: Any, event_type: str, reason: str, message: str, now: str) -> None:
        self.events.append((event_type, reason, message))


def test_a_failed_handler_is_a_warning_event_and_still_fails():
    cluster = Posting()
    operator = oc.Operator(cluster, "helm", "/nonexistent")     # type: ignore[arg-type]
    body = {"metadata": {"name": "cluster-operator", "uid": "u"}}
    with pytest.raises(RuntimeError):
        with failure_event(operator, body, "ReconcileFailed"):
            raise RuntimeError("helm template failed: boom")
    assert cluster.events == [("Warning", "ReconcileFailed", "helm template failed: boom")]
    with failure_event(operator, body, "ReconcileFailed"):
        pass
    assert len(cluster.events) == 1


def test_the_command_line_has_the_lease_and_migration_and_no_peering():
    args = oc.build_parser().parse_args(["--migrate"])
    assert args.migrate and args.lease == "metax-operator-controller"
    assert (args.lease_duration, args.renew_deadline, args.retry_period) == (8, 6, 1.5)
    with pytest.raises(SystemExit):
        oc.build_parser().parse_args(["--peering", "x"])


class Terminating(Posting):
    """A cluster whose component pods are still going: the cleanup must wait, not strip the nodes."""

    def __init__(self) -> None:
        super().__init__()
        self.pruned: List[Any] = []

    def prune(self, uid: str, component: Any) -> int:
        self.pruned.append((uid, component))
        return 0

    def pods(self, uid: str, component: Any = None) -> List[str]:
        return ["metax-gpu-label-x"]

    def nodes(self) -> List[Any]:
        raise AssertionError("the nodes are not touched while pods are left")


def test_a_cleanup_with_pods_left_is_retried_by_kopf_after_two_seconds():
    """The work raises its own Retry (no kopf in clusteroperator/); the wiring makes it kopf's
    TemporaryError with the work's delay, not kopf's backoff, and posts the failure once."""
    import kopf   # requirements/agents.txt: in the test venv too
    cluster = Terminating()
    operator = oc.Operator(cluster, "helm", "/nonexistent")     # type: ignore[arg-type]
    body = {"metadata": {"name": "cluster-operator", "uid": "u"}}
    with pytest.raises(kopf.TemporaryError) as info:
        with kopf_retry(), failure_event(operator, body, "CleanupFailed"):
            operator.cleanup(body)
    assert info.value.delay == 2 and str(info.value) == "component pods are still terminating"
    assert isinstance(info.value.__cause__, Retry)
    assert cluster.pruned == [("u", None)]
    assert cluster.events == [("Warning", "CleanupFailed", "component pods are still terminating")]
    with pytest.raises(RuntimeError):            # anything else goes through unchanged
        with kopf_retry():
            raise RuntimeError("helm template failed")


class StatusRound:
    """The Operator's side of a status round, recorded; ``delete_at`` marks the live body deleted
    when that call comes (kopf updates a timer's body in place as watch events arrive)."""

    def __init__(self, body: dict, delete_at: str = "") -> None:
        self.body, self.delete_at, self.calls = body, delete_at, []   # type: ignore[var-annotated]
        self.cluster = self

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if name == self.delete_at:
            self.body["metadata"]["deletionTimestamp"] = "2026-11-29T02:06:15Z"

    def roll_driver(self, body: Any, now: float) -> None:
        self._call("roll_driver")

    def audit_unwatched(self, body: Any, watched: Any, handled: bool) -> List[Any]:
        self._call("audit_unwatched")
        return [("ServiceMonitor", "gpu-exporter", "recreated")]

    def status(self, body: Any, now: str, rollout: Any) -> dict:
        self._call("status")
        return {"nodes": {"gpu": 2, "ready": 2, "total": 3}}

    def post_event(self, *args: Any) -> None:
        self._call("post_event")


def test_the_status_timer_leaves_a_cr_being_deleted_alone():
    """A status write during the deletion changes the resourceVersion kopf's finalizer removal tests:
    no rollout step, no status, once the (live) body shows the deletion, even mid-round."""
    def handled(body: Any) -> bool:
        return True

    for delete_at, calls, written in (("", ["roll_driver", "audit_unwatched", "status"], True),
                                      ("before", [], False),
                                      ("status", ["roll_driver", "audit_unwatched", "status"], False)):
        body = {"metadata": {"name": "cluster-operator", "uid": "u"}, "status": {}}
        if delete_at == "before":
            body["metadata"]["deletionTimestamp"] = "2026-11-29T02:06:15Z"
        operator = StatusRound(body, delete_at)
        status: dict = {}
        repaired = oh.status_round(operator, body, status, set(), handled)   # type: ignore[arg-type]
        assert operator.calls == calls, delete_at
        assert bool(status) is written and (not written or status["nodes"]["gpu"] == 2), (delete_at, status)
        assert repaired == ([("ServiceMonitor", "gpu-exporter", "recreated")] if calls else []), delete_at
