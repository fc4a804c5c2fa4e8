# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The node-agent ValidatingAdmissionPolicy (issue 30): generated from names.py, rendered on a capability check.

What the policy admits is tested against the real apiserver in
tests/integration/test_node_agent_policy_cluster.py. Here, for both charts
(GPU Extensions and GPU Operator): the key sets in the charts are exactly
names.NODE_AGENT_KEYS (and the generator catches a change to names.py that
was not regenerated), every service account that may write Nodes is confined
(for the operator: those the controller itself renders, not the controller),
and the policy renders only where the API server supports it, with the values
switch as the documented fallback.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any, Dict, List

import pytest

from ansible_collections.metax.gpu.plugins.module_utils import names

from .helm import CHART, CHARTS, ROOT, find_helm, helm_required, render

OPERATOR_CHART = CHARTS / "metax-operator"
# every chart shipping the policy (issue 30: both schemes)
POLICY_CHARTS = pytest.mark.parametrize("chart", [CHART, OPERATOR_CHART], ids=["extensions", "operator"])
# what the operator chart's defaults need: its driver and MACA components are on (issue 38)
OPERATOR_PAYLOADS = {"driver": {"payload": {"version": "2.29.0.13"}},
                     "maca": {"payload": {"images": ["mxc500-maca:2.29.0.7-ubuntu22.04-amd64"]}}}


def chart_values(chart, values):
    """``values`` for ``chart``, with the payloads the operator chart requires."""
    return dict(OPERATOR_PAYLOADS, **values) if chart == OPERATOR_CHART else values


HELM = find_helm()

_spec = importlib.util.spec_from_file_location("gen_node_agent_policy", ROOT / "scripts" / "gen_node_agent_policy.py")
gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen)

VAP_API = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"
SUPPORTED = ["--api-versions", VAP_API, "--kube-version", "1.30.0"]
EXTENSIONS_AGENTS = {"gpu-device", "gpu-label"}


def policy_objects(objects: List[Dict[str, Any]], pods: bool = False):
    """The node policy and its binding, or (``pods``) the policy on the pods the agents delete."""
    found = {o["kind"]: o for o in objects if o["kind"].startswith("ValidatingAdmissionPolicy")
             and o["metadata"]["name"].endswith("-pods") == pods
             and not o["metadata"]["name"].endswith("-resourceslices")}
    return found.get("ValidatingAdmissionPolicy"), found.get("ValidatingAdmissionPolicyBinding")


def variables(policy: Dict[str, Any]) -> Dict[str, str]:
    return {v["name"]: v["expression"] for v in policy["spec"]["variables"]}


def node_writers(objects: List[Dict[str, Any]]) -> set:
    """Users of the service accounts that the objects' ClusterRoleBindings let write Nodes."""
    roles = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ClusterRole"}
    writers = set()
    for crb in (o for o in objects if o["kind"] == "ClusterRoleBinding"):
        rules = roles[crb["roleRef"]["name"]]["rules"]
        if any(set(r["resources"]) & {"nodes", "nodes/status", "*"} and set(r["verbs"]) & {"patch", "update", "*"}
               for r in rules):
            writers |= {"system:serviceaccount:%s:%s" % (s["namespace"], s["name"]) for s in crb["subjects"]}
    return writers


def agent_map(policy: Dict[str, Any]) -> Dict[str, str]:
    """The policy's service-account user -> agent table (its ``agent`` variable)."""
    return json.loads(variables(policy)["agent"].split("[request.userInfo.username]")[0])


# -- generation from names.py (no helm needed) -------------------------------

def test_the_charts_are_generated_from_names_py():
    """Fails when names.py changed and scripts/gen_node_agent_policy.py was not rerun (or a copy was edited)."""
    assert gen.out_of_date() == [], "run scripts/gen_node_agent_policy.py"


def test_both_charts_use_the_library_chart():
    assert gen.users_of_library() == ["metax-gpu-extensions", "metax-operator"]


def test_key_data_is_the_table():
    data = gen.key_data(names.PREFIX, names.NODE_AGENT_KEYS, names.SHARED_NODE_KEYS,
                        cordon_record=(names.ANNOTATION_MAINTENANCE_CORDON, names.MAINTENANCE_CORDON_OURS))
    assert data["prefix"] == "metax-tech.com/"
    assert data["cordonRecord"] == {"key": names.ANNOTATION_MAINTENANCE_CORDON, "ours": "ours"}
    assert set(data["agents"]) == set(names.NODE_AGENT_KEYS)
    for agent, fields in names.NODE_AGENT_KEYS.items():
        for field in ("labels", "annotations"):
            assert data["agents"][agent][field] == sorted(fields[field])
    # what the agents really write: gpu-label its Table 2.7 labels, gpu-device its annotations
    from ansible_collections.metax.gpu.plugins.module_utils.deviceplugin import constants
    from ansible_collections.metax.gpu.plugins.module_utils.gpu.labels import OWNED_LABEL_KEYS
    assert data["agents"]["gpu-label"] == {"labels": sorted(OWNED_LABEL_KEYS), "annotations": [], "conditions": [],
                                           "taints": [], "spec": []}
    # gpu-device also its health condition and quarantine taint (issue 42), nobody else any
    assert data["agents"]["gpu-device"] == {"labels": [], "annotations": sorted(constants.ANNOTATION_KEYS),
                                            "conditions": [names.CONDITION_GPU_HEALTHY],
                                            "taints": [names.TAINT_GPU_HEALTH], "spec": []}
    assert [a for a, f in data["agents"].items() if f["taints"]] == ["gpu-device"]
    # driver-manager's remediation ladder (issue 42): its condition, and the cordon, admitted only with the
    # maintenance protocol's record "ours" beside it (the policy's cordonRecorded)
    assert [a for a, f in data["agents"].items() if f["conditions"] and a != "gpu-device"] == ["driver-manager"]
    assert data["agents"]["driver-manager"]["conditions"] == [names.CONDITION_GPU_REMEDIATION]
    assert [a for a, f in data["agents"].items() if f["spec"]] == ["driver-manager"]
    assert data["agents"]["driver-manager"]["spec"] == ["unschedulable"]
    # driver-manager: whose driver it is (shared with gpu-label, one writer per deployment), the vfnum
    # state, and its node's part of the rolling upgrade (state and failure message; the target is the controller's)
    assert data["agents"]["driver-manager"]["labels"] == sorted([names.LABEL_DRIVER_MODE, names.LABEL_VFNUM_STATE,
                                                                 names.LABEL_DRIVER_UPGRADE_STATE])
    assert names.ANNOTATION_DRIVER_UPGRADE_MESSAGE in data["agents"]["driver-manager"]["annotations"]
    assert names.ANNOTATION_DRIVER_UPGRADE_TARGET not in data["agents"]["driver-manager"]["annotations"]
    assert names.SHARED_NODE_KEYS == (names.LABEL_DRIVER_MODE,)


def test_a_shared_key_has_every_owner_and_nothing_else_is_shared():
    table = {"a": {"labels": ("metax-tech.com/x", "metax-tech.com/y")}, "b": {"labels": ("metax-tech.com/x",)}}
    data = gen.key_data("metax-tech.com/", table, shared=("metax-tech.com/x",))
    assert data["agents"]["a"]["labels"] == ["metax-tech.com/x", "metax-tech.com/y"]
    assert data["agents"]["b"]["labels"] == ["metax-tech.com/x"]
    with pytest.raises(gen.TableError, match="owned by both a and b"):
        gen.key_data("metax-tech.com/", dict(table, b={"labels": ("metax-tech.com/y",)}), shared=("metax-tech.com/x",))


@pytest.mark.parametrize("table, words", [
    ({"a": {"labels": ("example.com/x",)}}, "'example.com/x' is not under metax-tech.com/"),
    ({"a": {"labels": ("metax-tech.com/",)}}, "is not under"),
    ({"a": {"labels": ("metax-tech.com/x",)}, "b": {"labels": ("metax-tech.com/x",)}},
     "label 'metax-tech.com/x' is owned by both a and b"),
    ({"a": {"finalizers": ()}}, "unknown field(s) ['finalizers']"),
    ({"a": {"conditions": ("metax-tech.com/healthy",)}}, "is not a condition type"),
    ({"a": {"taints": ("example.com/t",)}}, "'example.com/t' is not under metax-tech.com/"),
    ({"a": {"taints": ("metax-tech.com/t",)}, "b": {"taints": ("metax-tech.com/t",)}}, "taint 'metax-tech.com/t' is owned by both"),
])
def test_a_table_the_policy_cannot_express_is_refused(table, words):
    with pytest.raises(gen.TableError) as err:
        gen.key_data("metax-tech.com/", table)
    assert words in str(err.value)


def test_resource_slice_writers_are_node_agents_with_a_driver():
    """names.NODE_AGENT_RESOURCE_SLICES (gpu-dra) goes into the data; a writer that is no node agent is refused."""
    data = gen.key_data(names.PREFIX, names.NODE_AGENT_KEYS, names.SHARED_NODE_KEYS, names.NODE_AGENT_RESOURCE_SLICES)
    assert data["resourceSlices"] == {"gpu-dra": names.DRA_DRIVER}
    assert gen.key_data("metax-tech.com/", {"a": {}})["resourceSlices"] == {}
    with pytest.raises(gen.TableError, match="'b' is not a node agent"):
        gen.key_data("metax-tech.com/", {"a": {}}, slices={"b": "x.example.com"})
    with pytest.raises(gen.TableError, match="no driver"):
        gen.key_data("metax-tech.com/", {"a": {}}, slices={"a": ""})


def _tree_copy(tmp_path: Path) -> Path:
    """names.py and files/charts in a scratch root, to change one without touching the checkout."""
    root = tmp_path / "repo"
    (root / "plugins" / "module_utils").mkdir(parents=True)
    shutil.copy(ROOT / gen.NAMES_PY, root / gen.NAMES_PY)
    shutil.copytree(CHARTS, root / gen.CHARTS)
    return root


def test_a_new_key_in_names_py_is_caught_then_generated(tmp_path):
    root = _tree_copy(tmp_path)
    with open(root / gen.NAMES_PY, "a", encoding="utf-8") as handle:
        handle.write('\nNODE_AGENT_KEYS["gpu-label"] = {"labels": GPU_LABEL_KEYS + (PREFIX + "gpu.new",), '
                     '"annotations": ()}\n')
    stale = gen.out_of_date(str(root))
    assert stale == sorted([
        "files/charts/metax-gpu-extensions/charts/metax-node-agent-policy/templates/_keys.tpl",
        "files/charts/metax-node-agent-policy/templates/_keys.tpl",
        "files/charts/metax-operator/charts/metax-node-agent-policy/templates/_keys.tpl"])
    assert gen.write(str(root)) == stale
    assert gen.out_of_date(str(root)) == []
    assert '"metax-tech.com/gpu.new"' in (root / stale[0]).read_text(encoding="utf-8")


def test_an_edited_or_stray_file_in_a_copy_is_caught(tmp_path):
    root = _tree_copy(tmp_path)
    copy = root / gen.CHARTS / "metax-gpu-extensions" / "charts" / gen.LIBRARY
    policy = copy / "templates" / "_policy.tpl"
    policy.write_text(policy.read_text(encoding="utf-8") + "\n", encoding="utf-8")
    (copy / "templates" / "_stray.tpl").write_text("", encoding="utf-8")
    base = "files/charts/metax-gpu-extensions/charts/metax-node-agent-policy/templates/"
    assert gen.out_of_date(str(root)) == [base + "_policy.tpl", base + "_stray.tpl"]
    gen.write(str(root))
    assert gen.out_of_date(str(root)) == [] and not (copy / "templates" / "_stray.tpl").exists()


def test_main_checks_then_writes(tmp_path, capsys):
    root = _tree_copy(tmp_path)
    (root / gen.CHARTS / gen.LIBRARY / gen.KEYS_TPL).write_text("edited by hand\n", encoding="utf-8")
    assert gen.main(["--check", "--root", str(root)]) == 1
    assert "out of date: files/charts/metax-node-agent-policy/templates/_keys.tpl" in capsys.readouterr().out
    assert gen.main(["--root", str(root)]) == 0
    assert "wrote files/charts/metax-node-agent-policy/templates/_keys.tpl" in capsys.readouterr().out
    assert gen.main(["--check", "--root", str(root)]) == 0


# -- the rendered chart (helm) -------------------------------------------------

needs_helm = helm_required(HELM)


@needs_helm
@POLICY_CHARTS
def test_rendered_key_sets_are_names_py(chart):
    rc, objects, err = render(HELM, chart_values(chart, {}), extra=SUPPORTED, chart=chart)
    assert rc == 0, err
    policy, _binding = policy_objects(objects)
    assert policy is not None
    got = variables(policy)
    label_owners = {k: sorted(a for a, f in names.NODE_AGENT_KEYS.items() if k in f["labels"])
                    for f in names.NODE_AGENT_KEYS.values() for k in f["labels"]}
    annotation_owners = {k: sorted(a for a, f in names.NODE_AGENT_KEYS.items() if k in f["annotations"])
                         for f in names.NODE_AGENT_KEYS.values() for k in f["annotations"]}
    assert json.loads(got["labelOwners"]) == label_owners
    assert json.loads(got["annotationOwners"]) == annotation_owners
    assert label_owners and annotation_owners
    prefix_rules = [v for v in policy["spec"]["validations"] if "startsWith" in v["expression"]]
    assert len(prefix_rules) == 2 and all('startsWith("metax-tech.com/")' in v["expression"] for v in prefix_rules)


@needs_helm
@pytest.mark.parametrize("namespace", ["metax-gpu", "gpu-system"])
def test_every_node_writer_of_the_chart_is_confined(namespace):
    """Each service account the chart lets write Nodes is named in the policy, with its agent."""
    rc, objects, err = render(HELM, {"deployExtenderGPUAware": True}, namespace=namespace, extra=SUPPORTED)
    assert rc == 0, err
    policy, binding = policy_objects(objects)
    writers = node_writers(objects)
    agent_of = agent_map(policy)
    assert set(agent_of) == writers
    assert set(agent_of.values()) == EXTENSIONS_AGENTS
    assert all(user == "system:serviceaccount:%s:%s" % (namespace, agent) for user, agent in agent_of.items())
    condition = policy["spec"]["matchConditions"][0]["expression"]
    assert json.loads(condition.split(" in ", 1)[1]) == sorted(writers)
    # the DaemonSets run as those service accounts
    daemonsets = {o["spec"]["template"]["spec"]["serviceAccountName"] for o in objects if o["kind"] == "DaemonSet"}
    assert daemonsets == EXTENSIONS_AGENTS
    assert policy["metadata"]["name"] == binding["metadata"]["name"] == "%s-node-agents" % namespace
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}


@needs_helm
def test_driver_manager_of_the_extensions_chart_is_confined():
    """With driverManager.enabled the Extensions chart runs driver-manager, which patches its node: it is in
    the chart's policy (issue 39: it was left out), and every node writer of the chart is still named."""
    namespace = "metax-gpu"
    rc, objects, err = render(HELM, {"driverManager": {"enabled": True, "payload": {"version": "2.14.3"}}},
                              namespace=namespace, extra=SUPPORTED)
    assert rc == 0, err
    policy, _binding = policy_objects(objects)
    writers = node_writers(objects)
    assert "system:serviceaccount:%s:driver-manager" % namespace in writers
    agent_of = agent_map(policy)
    assert set(agent_of) == writers
    assert set(agent_of.values()) == EXTENSIONS_AGENTS | {"driver-manager"}
    pods, _pods_binding = policy_objects(objects, pods=True)
    assert agent_map(pods) == agent_of
    # and without it the policy names the two agents only
    rc, objects, err = render(HELM, {}, namespace=namespace, extra=SUPPORTED)
    assert rc == 0, err
    assert set(agent_map(policy_objects(objects)[0]).values()) == EXTENSIONS_AGENTS


def test_vfio_manager_of_the_extensions_chart_is_confined():
    """With vfioAgent.enabled (issue 43) the chart runs vfio-manager, which annotates its node: it is in the policy."""
    namespace = "metax-gpu"
    rc, objects, err = render(HELM, {"vfioAgent": {"enabled": True}}, namespace=namespace, extra=SUPPORTED)
    assert rc == 0, err
    policy, _binding = policy_objects(objects)
    writers = node_writers(objects)
    assert "system:serviceaccount:%s:vfio-manager" % namespace in writers
    agent_of = agent_map(policy)
    assert set(agent_of) == writers
    assert set(agent_of.values()) == EXTENSIONS_AGENTS | {"vfio-manager"}


def pod_deleters(objects: List[Dict[str, Any]]) -> set:
    """Users of the service accounts that the objects' bindings let delete pods (anywhere they bind)."""
    roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o for o in objects
             if o["kind"] in ("ClusterRole", "Role")}
    users = set()
    for binding in (o for o in objects if o["kind"] in ("ClusterRoleBinding", "RoleBinding")):
        ref = binding["roleRef"]
        namespace = binding["metadata"].get("namespace") if ref["kind"] == "Role" else None
        role = roles.get((ref["kind"], namespace, ref["name"]))
        if role and any(set(r["resources"]) & {"pods", "*"} and set(r["verbs"]) & {"delete", "deletecollection", "*"}
                        for r in role["rules"]):
            users |= {"system:serviceaccount:%s:%s" % (s["namespace"], s["name"]) for s in binding["subjects"]}
    return users


@needs_helm
@POLICY_CHARTS
def test_pods_policy_shape(chart):
    """The pods an agent deletes are its own node's: DELETE of pods by the node agents, checked on the old object."""
    values = {"driverManager": {"enabled": True, "payload": {"version": "2.14.3"}}} if chart == CHART else {}
    rc, objects, err = render(HELM, chart_values(chart, values), extra=SUPPORTED, chart=chart)
    assert rc == 0, err
    node_policy, _binding = policy_objects(objects)
    policy, binding = policy_objects(objects, pods=True)
    spec = policy["spec"]
    assert policy["metadata"]["name"] == node_policy["metadata"]["name"] + "-pods"
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["resourceRules"] == [{
        "apiGroups": [""], "apiVersions": ["*"], "operations": ["DELETE"], "resources": ["pods"]}]
    assert spec["matchConditions"] == node_policy["spec"]["matchConditions"]
    got = variables(policy)
    assert got["nodeName"] == variables(node_policy)["nodeName"]
    assert "oldObject.spec.?nodeName" in got["podNode"] and "oldObject != null" in got["podNode"]
    checks = [r["expression"] for r in spec["validations"]]
    assert checks == ['variables.nodeName != ""', "variables.podNode == variables.nodeName"]
    assert all(r["reason"] == "Forbidden" and r["messageExpression"].startswith("variables.agent + ")
               for r in spec["validations"])
    if chart == CHART:
        # the chart's own pod deleter (driver-manager: its node's gpu-device pod) is one of the agents matched
        deleters = pod_deleters(objects)
        assert deleters and deleters <= set(agent_map(policy))


@needs_helm
@pytest.mark.parametrize("namespace", ["metax-operator", "gpu-operator"])
def test_every_node_agent_the_operator_deploys_is_confined(namespace):
    """The operator chart's policy names exactly the node-writing service accounts the CONTROLLER creates.

    The controller renders the agents' ServiceAccounts and RBAC itself (the
    Extensions chart through module_utils/clusteroperator/render.py, into the
    CR's namespace = the release's), so they are not in the operator chart's
    own output: this renders them the way the controller does, from the CR
    the chart creates, with every optional component on. The controller's own
    service account may patch nodes too (readiness labels, cleanup) and is
    deliberately not a node agent: RBAC only (docs/security.md).
    """
    from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator import render as operator_render

    rc, objects, err = render(HELM, {"deployExtenderGPUAware": True,
                                     "driver": {"deploy": True, "payload": {"version": "2.14.3"}},
                                     # the node writers among the agents (MACA and container-runtime write
                                     # no Node: off here, as before they were on by default)
                                     "maca": {"deploy": False}, "runtime": {"deploy": False},
                                     "vfioManager": {"deploy": True}},
                              namespace=namespace, extra=SUPPORTED, chart=OPERATOR_CHART)
    assert rc == 0, err
    policy, binding = policy_objects(objects)
    cr = next(o for o in objects if o["kind"] == names.OPERATOR_KIND)
    assert "namespace" not in cr["metadata"]    # cluster-scoped, as the real one
    owner = {"metadata": dict(cr["metadata"], uid="u-1")}
    rendered = operator_render.helm_template(HELM, str(CHART), operator_render.chart_values(cr["spec"]), namespace)
    deployed = [o for objs in operator_render.desired_objects(rendered, cr["spec"], owner).values() for o in objs]
    assert {c for c, objs in operator_render.desired_objects(rendered, cr["spec"], owner).items() if objs} == {
        "metax-gpu-device", "metax-gpu-label", "gpu-aware", "metax-driver", names.DAEMONSET_VFIO_MANAGER}
    writers = node_writers(deployed)
    agent_of = agent_map(policy)
    # gpu-dra (spec.draDriver, off here) is in the policy too: it writes no Node key and only its
    # node's ResourceSlices (test_dra_chart.py); it only reads Nodes, so it is no node writer
    dra_user = "system:serviceaccount:%s:gpu-dra" % namespace
    assert set(agent_of) == writers | {dra_user}
    assert set(agent_of.values()) == EXTENSIONS_AGENTS | {"driver-manager", "gpu-dra", "vfio-manager"}
    # the DaemonSets the controller applies run as those service accounts, in the release namespace
    daemonsets = {(o["metadata"]["namespace"], o["spec"]["template"]["spec"]["serviceAccountName"])
                  for o in deployed if o["kind"] == "DaemonSet"}
    assert {"system:serviceaccount:%s:%s" % pair for pair in daemonsets} == writers
    # the controller writes nodes (readiness labels, cleanup) but is not a node agent: outside the policy
    controller_writers = node_writers(objects)
    assert controller_writers == {"system:serviceaccount:%s:operator-controller" % namespace}
    assert not controller_writers & set(agent_of)
    condition = policy["spec"]["matchConditions"][0]["expression"]
    assert json.loads(condition.split(" in ", 1)[1]) == sorted(writers | {dra_user})
    assert policy["metadata"]["name"] == binding["metadata"]["name"] == "%s-node-agents" % namespace


def test_readiness_labels_are_no_node_agents():
    """The controller sets the readiness chain (contract.py), so no node agent may fake it on its node.

    A compromised gpu-label pod setting runtime.ready or maca.ready would let
    gpu-device start before the runtime and MACA are there.
    """
    owned = {k for fields in names.NODE_AGENT_KEYS.values() for k in fields["labels"]}
    assert not owned & {names.LABEL_MACA_READY, names.LABEL_RUNTIME_READY}


@needs_helm
@POLICY_CHARTS
def test_policy_shape(chart):
    rc, objects, err = render(HELM, chart_values(chart, {}), extra=SUPPORTED, chart=chart)
    assert rc == 0, err
    policy, _binding = policy_objects(objects)
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["resourceRules"] == [{
        "apiGroups": [""], "apiVersions": ["*"], "operations": ["UPDATE"], "resources": ["nodes", "nodes/status"]}]
    assert "authentication.kubernetes.io/node-name" in variables(policy)["nodeName"]
    for rule in spec["validations"]:
        # the apiserver prefixes the policy's name; the message says why
        assert rule["reason"] == "Forbidden" and rule["message"] and rule["messageExpression"].startswith("variables.agent + ")
    checks = " ".join(r["expression"] for r in spec["validations"])
    for what in ("object.metadata.name == variables.nodeName", "object.spec == oldObject.spec",
                 "object.status == oldObject.status", "variables.changedLabels", "variables.changedAnnotations",
                 "finalizers", "ownerReferences"):
        assert what in checks


@needs_helm
@pytest.mark.parametrize("enabled, extra, rendered", [
    ("auto", [], False),                                                    # offline helm template: no VAP API
    ("auto", SUPPORTED, True),                                              # 1.30+: v1 served
    ("auto", ["--api-versions", VAP_API, "--kube-version", "1.29.9"], False),   # node-name extra not on by default
    ("auto", ["--kube-version", "1.36.3"], False),                          # API not served (disabled)
    (False, SUPPORTED, False),                                              # the fallback: RBAC only
    (True, [], True),                                                       # forced (e.g. GitOps rendering)
])
@POLICY_CHARTS
def test_rendered_on_the_capability_check(chart, enabled, extra, rendered):
    rc, objects, err = render(HELM, chart_values(chart, {"nodeAgentPolicy": {"enabled": enabled}}), extra=extra, chart=chart)
    assert rc == 0, err
    policy, binding = policy_objects(objects)
    assert (policy is not None, binding is not None) == (rendered, rendered)
    # the chart's own workloads render either way (the Extensions agents; the operator's controller)
    assert any(o["kind"] in ("DaemonSet", "Deployment") for o in objects)


@needs_helm
@pytest.mark.parametrize("pair", ["nodeAgentPolicy.enabled=maybe", "nodeAgentPolicy.other=1"])
@POLICY_CHARTS
def test_schema_refuses_a_bad_switch(chart, pair):
    rc, objects, err = render(HELM, chart_values(chart, {}), sets=[pair], chart=chart)
    assert rc != 0 and not objects
    assert "nodeAgentPolicy" in err, err


@needs_helm
@POLICY_CHARTS
def test_an_agent_missing_from_names_py_is_refused(tmp_path, chart):
    """A chart naming an agent that names.py does not know fails at render time, naming it."""
    copy = tmp_path / chart.name
    shutil.copytree(chart, copy)
    chart = copy
    tpl = chart / "templates" / "node-agent-policy.yaml"
    tpl.write_text(tpl.read_text(encoding="utf-8").replace('"gpu-label" "gpu-label"', '"gpu-label" "gpu-label" '
                                                           '"gpu-mystery" "gpu-mystery"'), encoding="utf-8")
    rc, objects, err = render(HELM, chart_values(chart, {}), extra=SUPPORTED, chart=chart)
    assert rc != 0 and not objects
    assert "gpu-mystery is not a node agent of names.py NODE_AGENT_KEYS (known: driver-manager, gpu-device, gpu-dra, gpu-label, vfio-manager)" in err
