"""The remediation ladder's settings in both schemes' schemas, and driver-manager's rights for it (issue 42)."""
from __future__ import annotations

import json

import jsonschema
import pytest
import yaml

from ansible_collections.metax.gpu.plugins.module_utils import names
from ansible_collections.metax.gpu.plugins.module_utils.health.policy import Remediation, parse_policy

from .helm import CHARTS, find_helm, helm_required, render

HELM = find_helm()
POLICY = {"remediation": {"maxNodes": 2, "evictTimeoutSeconds": 120, "settleSeconds": 60,
                          "rebootSentinel": "var/run/reboot-required"},
          "rules": [{"signal": "ecc-dram-uncorrectable", "threshold": 1, "severity": "critical",
                     "action": "device-unhealthy", "remediate": True}]}
DRIVER = {"driverManager": {"enabled": True, "payload": {"name": "metax-driver-payload", "version": "2.15.0"}}}


@helm_required(HELM)
def test_the_extensions_chart_takes_the_remediation_settings_and_gives_driver_manager_its_rights():
    rc, objects, err = render(HELM, dict(DRIVER, gpuDevice={"healthPolicy": POLICY}))
    assert rc == 0, err
    objs = {(o["kind"], o["metadata"]["name"]): o for o in objects}
    config = objs[("ConfigMap", names.HEALTH_POLICY_CONFIGMAP)]
    assert parse_policy(json.loads(config["data"]["policy.json"])).remediation == \
        Remediation(2, 120, 60, "var/run/reboot-required")
    rules = objs[("ClusterRole", "metax-gpu-driver-manager")]["rules"]
    assert {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]} in rules
    role = objs[("Role", "driver-manager")]["rules"]
    assert any("leases" in r["resources"] and "create" in r["verbs"] for r in role)
    assert any("configmaps" in r["resources"] and "get" in r["verbs"] for r in role)
    rc, _objects, err = render(HELM, dict(DRIVER, gpuDevice={"healthPolicy": {"remediation": {"maxNodes": 0}}}))
    assert rc != 0 and "maxNodes" in err
    rc, _objects, err = render(HELM, dict(DRIVER, gpuDevice={"healthPolicy": {"remediation": {"speed": 1}}}))
    assert rc != 0
    observed = {"rules": [{"signal": "pci-aer-ce", "rate": 1, "severity": "info", "action": "observe", "remediate": True}]}
    rc, _objects, err = render(HELM, dict(DRIVER, gpuDevice={"healthPolicy": observed}))
    assert rc != 0 and "healthPolicy" in err


def _crd_schema():
    crd = yaml.safe_load((CHARTS / "metax-operator" / "crds" / "clusteroperator.yaml").read_text())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


@pytest.mark.parametrize("remediation, ok", [
    ({"maxNodes": 1, "evictTimeoutSeconds": 300, "settleSeconds": 0, "rebootSentinel": ""}, True),
    ({"maxNodes": 0}, False),
    ({"settleSeconds": -1}, False),
])
def test_the_cluster_operator_takes_the_remediation_settings(remediation, ok):
    """The schema's part (the API server also runs the rows' CEL rules: remediate only on a failing row)."""
    cr = {"apiVersion": "gpu.metax-tech.com/v1alpha1", "kind": "ClusterOperator", "metadata": {"name": "cluster-operator"},
          "spec": {"devicePlugin": {"healthPolicy": dict(POLICY, remediation=remediation)}}}
    errors = list(jsonschema.validators.validator_for(_crd_schema())(_crd_schema()).iter_errors(cr))
    assert (errors == []) == ok, errors


def _generator():
    import importlib.util
    from .helm import ROOT
    spec = importlib.util.spec_from_file_location("gen_node_agent_policy_ladder", ROOT / "scripts" / "gen_node_agent_policy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_only_the_cordon_is_a_spec_field_an_agent_may_own_and_it_carries_its_record():
    gen = _generator()
    with pytest.raises(gen.TableError, match="'taints' is not one of"):
        gen.key_data("metax-tech.com/", {"a": {"spec": ("taints",)}})
    data = gen.key_data("metax-tech.com/", {"a": {"spec": ("unschedulable",)}, "b": {"spec": ("unschedulable",)}},
                        cordon_record=("metax-tech.com/maintenance.cordon", "ours"))
    assert data["agents"]["a"]["spec"] == data["agents"]["b"]["spec"] == ["unschedulable"]
    assert data["cordonRecord"] == {"key": "metax-tech.com/maintenance.cordon", "ours": "ours"}
    # no record given: an empty key, which no annotation has: the policy admits no cordon change (fails closed)
    assert gen.key_data("metax-tech.com/", {"a": {"spec": ("unschedulable",)}})["cordonRecord"]["key"] == ""
    assert "cordonRecord" not in gen.key_data("metax-tech.com/", {"a": {"labels": ("metax-tech.com/x",)}})


@helm_required(HELM)
@pytest.mark.parametrize("chart, values", [
    (CHARTS / "metax-gpu-extensions", {"nodeAgentPolicy": {"enabled": True}}),
    (CHARTS / "metax-operator", {"nodeAgentPolicy": {"enabled": True}, "driver": {"payload": {"version": "2.29.0.13"}},
                                 "maca": {"payload": {"images": ["mxc500-maca:2.29.0.7-ubuntu22.04-amd64"]}}}),
], ids=["extensions", "operator"])
def test_the_policy_admits_driver_managers_cordon_only_beside_the_record_ours(chart, values):
    rc, objects, err = render(HELM, values, chart=chart)
    assert rc == 0, err
    policy = next(o for o in objects if o["kind"] == "ValidatingAdmissionPolicy"
                  and not o["metadata"]["name"].endswith(("-pods", "-resourceslices")))
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    owned = json.loads(variables["ownedSpec"].split("[variables.agent]")[0])
    assert owned["driver-manager"] == ["unschedulable"] and not any(v for a, v in owned.items() if a != "driver-manager")
    record = '"%s" in variables.newAnnotations && variables.newAnnotations["%s"] == "%s"' % (
        names.ANNOTATION_MAINTENANCE_CORDON, names.ANNOTATION_MAINTENANCE_CORDON, names.MAINTENANCE_CORDON_OURS)
    assert record in variables["cordonRecorded"]
    assert record.replace("newAnnotations", "oldAnnotations") in variables["cordonRecorded"]
    spec_rule = next(r["expression"] for r in policy["spec"]["validations"] if "otherSpecUnchanged" in r["expression"])
    assert "variables.cordonRecorded" in spec_rule and "size(variables.ownedSpec) == 0" in spec_rule
    conditions = json.loads(variables["ownedConditions"].split("[variables.agent]")[0])
    assert conditions["driver-manager"] == [names.CONDITION_GPU_REMEDIATION]
