# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""operator-controller's rights on ClusterRoles and ClusterRoleBindings are the objects it renders (issue 39).

The controller applies the agents' cluster-scoped RBAC from the Extensions
chart (module_utils/clusteroperator/render.py). Its own ClusterRole may get,
patch (server-side apply) and delete only those names: this renders them the
way the controller does, with every optional component on, and compares. A
rename in the Extensions chart fails here until the operator chart's
resourceNames follow (keep the old name too while an upgrade may find it).
"""
from __future__ import annotations

from ansible_collections.metax.gpu.plugins.module_utils import names

from .helm import CHART, CHARTS, find_helm, helm_required, render

HELM = find_helm()
OPERATOR_CHART = CHARTS / "metax-operator"
needs_helm = helm_required(HELM)
RBAC_GROUP = "rbac.authorization.k8s.io"
EVERYTHING = {"deployExtenderGPUAware": True, "driver": {"deploy": True, "payload": {"version": "2.14.3"}},
              "maca": {"deploy": True, "payload": {"images": ["mxc500-maca:2.29.0.7-ubuntu22.04-amd64"]}},
              "runtime": {"deploy": True}, "draDriver": {"deploy": True}, "vfioManager": {"deploy": True},
              "dataExporter": {"deploy": True}}


def _controller_role(objects):
    return next(o for o in objects if o["kind"] == "ClusterRole" and o["metadata"]["name"] == "metax-operator-controller")


def _rendered_by_the_controller(objects, namespace):
    from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator import render as operator_render

    cr = next(o for o in objects if o["kind"] == names.OPERATOR_KIND)
    owner = {"metadata": dict(cr["metadata"], uid="u-1")}
    rendered = operator_render.helm_template(HELM, str(CHART), operator_render.chart_values(cr["spec"]), namespace)
    desired = operator_render.desired_objects(rendered, cr["spec"], owner)
    return [o for objs in desired.values() for o in objs]


def test_everything_turns_every_component_on():
    # a component added off by default and left out here would hide its ClusterRole from the check below
    # (vfio-manager's was: the controller could not apply it on the cluster)
    from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator.components import REGISTRY

    switched = {key for key, value in EVERYTHING.items() if isinstance(value, dict) and value.get("deploy")}
    assert {c.values_key for c in REGISTRY if not c.default_deploy and c.values_key != "gpuAware"} <= switched
    assert EVERYTHING["deployExtenderGPUAware"]


@needs_helm
def test_cluster_rbac_rights_name_exactly_what_the_controller_renders():
    namespace = "metax-operator"
    rc, objects, err = render(HELM, EVERYTHING, namespace=namespace, chart=OPERATOR_CHART)
    assert rc == 0, err
    deployed = _rendered_by_the_controller(objects, namespace)
    rendered_names = {o["metadata"]["name"] for o in deployed if o["kind"] in ("ClusterRole", "ClusterRoleBinding")}
    assert {"metax-gpu-driver-manager", "metax-gpu-gpu-aware", "metax-gpu-container-runtime"} <= rendered_names
    rules = [r for r in _controller_role(objects)["rules"] if RBAC_GROUP in r["apiGroups"]]
    assert rules and all(set(r["resources"]) <= {"clusterroles", "clusterrolebindings"} for r in rules)
    named = [r for r in rules if r.get("resourceNames")]
    assert len(named) == 1
    assert set(named[0]["resourceNames"]) == rendered_names
    assert set(named[0]["verbs"]) == {"get", "patch", "delete"}
    # unnamed: only what RBAC cannot limit by name (create) and the prune's list by label
    for rule in rules:
        if not rule.get("resourceNames"):
            assert set(rule["verbs"]) <= {"create", "list"}, rule
    # nothing else in the controller's role is a wildcard
    assert not any("*" in r["verbs"] or "*" in r["resources"] for r in _controller_role(objects)["rules"])
