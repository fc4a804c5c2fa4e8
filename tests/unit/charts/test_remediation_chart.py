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
