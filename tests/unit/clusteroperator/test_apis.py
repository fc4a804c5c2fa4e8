# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The Prometheus operator's kinds: rendered, owned and pruned only where the cluster serves them.

- the ``--api-versions`` the controller passes to ``helm template`` follow
  discovery, and with them the Extensions chart (real helm) renders
  gpu-exporter's ServiceMonitor and PrometheusRule, owned like its other
  objects, or neither;
- the kinds pruned leave out an optional kind that is not served, in order;
- discovery is cached per TTL, refreshed on demand, a failure not cached;
- the operator chart grants the controller every verb on every kind it owns
  (apply, prune, the drift watch), and nothing on Secrets.
"""

from __future__ import annotations

import subprocess

import pytest
import yaml

from ansible_collections.metax.gpu.plugins.module_utils import names
from ansible_collections.metax.gpu.plugins.module_utils.agents.operator_handlers import DRIFT_WATCHED
from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator import apis, render
from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator.cluster import CLUSTER_KINDS, OWNED_KINDS

from charts.helm import CHART, CHARTS, find_helm, helm_required

HELM = find_helm()
OWNER = {"metadata": {"name": names.OPERATOR_CR_NAME, "namespace": names.OPERATOR_NAMESPACE, "uid": "u-1"}}
EXPORTER = {"dataExporter": {"deploy": True}}
BOTH = frozenset(apis.OPTIONAL_KINDS)
MONITORING = frozenset((apis.SERVICE_MONITOR, apis.PROMETHEUS_RULE))


def test_api_versions_name_exactly_the_served_optional_kinds():
    assert apis.helm_api_versions(frozenset()) == []
    assert apis.helm_api_versions(BOTH) == ["monitoring.coreos.com/v1/PrometheusRule",
                                            "monitoring.coreos.com/v1/ServiceMonitor", "resource.k8s.io/v1/DeviceClass"]
    assert apis.helm_api_versions({apis.SERVICE_MONITOR, ("apps/v1", "DaemonSet")}) == [
        "monitoring.coreos.com/v1/ServiceMonitor"]     # only what the controller asks discovery about


def test_discovery_answer_is_read_by_kind():
    listed = ["Alertmanager", "PodMonitor", "Prometheus", "PrometheusRule", "ServiceMonitor"]
    assert apis.served_of("monitoring.coreos.com/v1", listed) == MONITORING
    assert apis.served_of("monitoring.coreos.com/v1", ["ServiceMonitor"]) == {apis.SERVICE_MONITOR}
    assert apis.served_of("monitoring.coreos.com/v1alpha1", listed) == frozenset()
    assert apis.group_versions() == ("monitoring.coreos.com/v1", "resource.k8s.io/v1")
    assert apis.served_of("resource.k8s.io/v1", ["DeviceClass", "ResourceSlice"]) == {apis.DEVICE_CLASS}


def test_owned_kinds_leave_out_what_is_not_served_and_keep_the_order():
    without = apis.owned_kinds(OWNED_KINDS, frozenset())
    assert not set(without) & BOTH
    assert without == tuple(k for k in OWNED_KINDS if k not in BOTH)
    assert apis.owned_kinds(OWNED_KINDS, BOTH) == OWNED_KINDS
    one = apis.owned_kinds(OWNED_KINDS, {apis.PROMETHEUS_RULE})
    assert apis.PROMETHEUS_RULE in one and apis.SERVICE_MONITOR not in one
    # namespaced before cluster-scoped, so nothing namespaced outlives a role it names
    scoped = [kind in CLUSTER_KINDS for _api, kind in OWNED_KINDS]
    assert scoped == sorted(scoped)


def test_pruned_workloads_wait_for_their_pods_the_optional_kinds_do_not_wait_for_the_gc():
    assert apis.delete_policy(("apps/v1", "DaemonSet")) == "Foreground"
    assert apis.delete_policy(("v1", "ConfigMap")) == "Foreground"
    # a foreground deletion of a kind whose CRD the garbage collector has not synced yet would hang
    assert {apis.delete_policy(k) for k in apis.OPTIONAL_KINDS} == {"Background"}


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_discovery_is_cached_for_its_ttl_and_refreshed_on_demand():
    answers = [frozenset(), BOTH, frozenset({apis.SERVICE_MONITOR})]
    calls = []

    def discover():
        calls.append(1)
        return answers[len(calls) - 1]

    clock = Clock()
    served = apis.ServedKinds(discover, ttl=60, clock=clock)
    assert served.get() == frozenset() and len(calls) == 1
    clock.now += 59
    assert served.get() == frozenset() and len(calls) == 1     # cached
    assert served.get(refresh=True) == BOTH and len(calls) == 2  # a reconcile asks again
    clock.now += 60
    assert served.get() == {apis.SERVICE_MONITOR} and len(calls) == 3


def test_a_failed_discovery_is_not_cached():
    state = {"fail": True}

    def discover():
        if state["fail"]:
            raise RuntimeError("API server unavailable")
        return BOTH

    served = apis.ServedKinds(discover, clock=Clock())
    with pytest.raises(RuntimeError):
        served.get()
    state["fail"] = False
    assert served.get() == BOTH


def exporter_objects(served):
    rendered = render.helm_template(HELM, str(CHART), render.chart_values(EXPORTER), names.OPERATOR_NAMESPACE,
                                    api_versions=apis.helm_api_versions(served))
    return render.desired_objects(rendered, EXPORTER, OWNER)["metax-gpu-exporter"]


@helm_required(HELM)
def test_the_chart_renders_the_monitoring_objects_only_with_their_api_versions():
    def kinds(objs):
        return sorted(o["kind"] for o in objs)

    base = ["ConfigMap", "DaemonSet", "Service", "ServiceAccount"]
    assert kinds(exporter_objects(frozenset())) == base
    assert kinds(exporter_objects({apis.SERVICE_MONITOR})) == sorted(base + ["ServiceMonitor"])
    objs = exporter_objects(BOTH)
    assert kinds(objs) == sorted(base + ["PrometheusRule", "ServiceMonitor"])
    service = next(o for o in objs if o["kind"] == "Service")
    for obj in objs:
        if obj["kind"] not in ("ServiceMonitor", "PrometheusRule"):
            continue
        assert (obj["apiVersion"], obj["kind"]) in apis.OPTIONAL_KINDS
        meta = obj["metadata"]
        assert meta["namespace"] == names.OPERATOR_NAMESPACE
        assert meta["labels"][names.LABEL_OPERATOR_OWNER] == "u-1"
        assert meta["ownerReferences"][0]["uid"] == "u-1"
        if obj["kind"] == "ServiceMonitor":     # still selects the Service the operator applies
            selector = obj["spec"]["selector"]["matchLabels"]
            assert selector.items() <= service["metadata"]["labels"].items()
        else:
            alerts = {r["alert"] for g in obj["spec"]["groups"] for r in g["rules"] if "alert" in r}
            assert "MetaxGpuUnhealthy" in alerts
    # not deployed: nothing, whatever the cluster serves
    rendered = render.helm_template(HELM, str(CHART), render.chart_values({}), names.OPERATOR_NAMESPACE,
                                    api_versions=apis.helm_api_versions(BOTH))
    assert render.desired_objects(rendered, {}, OWNER)["metax-gpu-exporter"] == []


@helm_required(HELM)
def test_the_operator_chart_grants_every_verb_on_every_owned_kind():
    # minimal: the chart's defaults deploy the driver and MACA, which need payload values (not the point here)
    proc = subprocess.run([HELM, "template", "x", str(CHARTS / "metax-operator"), "-n", "metax-operator",
                           "--set", "minimal=true", "--show-only", "templates/rbac.yaml"], capture_output=True,
                          text=True, check=True, timeout=60)
    granted = set()
    for doc in yaml.safe_load_all(proc.stdout):
        if doc and doc["kind"] in ("Role", "ClusterRole"):
            for rule in doc["rules"]:
                # a named rule grants only those objects: enough for the agents' ClusterRoles and
                # bindings, whose names tests/unit/charts/test_operator_rbac_names.py pins to the render
                if rule.get("resourceNames") and rule["apiGroups"] != ["rbac.authorization.k8s.io"]:
                    continue
                for group in rule["apiGroups"]:
                    for res in rule["resources"]:
                        granted |= {(doc["kind"], group, res, verb) for verb in rule["verbs"]}
                        assert res != "secrets" and "*" not in rule["verbs"] + [res, group]
    watched = {(group, plural) for group, _version, plural in DRIFT_WATCHED}
    for api_version, kind in OWNED_KINDS:
        group = api_version.rpartition("/")[0]
        plural = kind.lower() + ("es" if kind.endswith("s") else "s")   # runtimeclasses
        role = "ClusterRole" if kind in CLUSTER_KINDS else "Role"
        # server-side apply creates or patches; prune lists and deletes; drift watches
        needed = {"list", "create", "patch", "delete"} | ({"watch"} if (group, plural) in watched else set())
        assert {v for r, g, p, v in granted if (r, g, p) == (role, group, plural)} >= needed, kind
    # kopf's scanning (CRDs come and go) reads, never writes
    assert {v for r, g, p, v in granted if p == "customresourcedefinitions"} == {"list", "watch"}
