# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The metax-operator chart: its ClusterOperator is the one mapping's, and the CRD accepts real CRs.

- files/mapping.json is mapping.py's table (regenerate with
  ``python -m ansible_collections.metax.gpu.plugins.module_utils.clusteroperator.mapping``);
- the CR rendered by helm equals ``values_to_spec`` for several value sets;
- the CRD's schema (checked with jsonschema, the API server's own check is the
  integration test's) accepts the chart's CR and the real product's 0.9.2 CR
  and refuses an unknown deployPolicy and a negative interval.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any, Dict

import jsonschema
import pytest
import yaml

from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator import mapping

from charts.helm import CHARTS, find_helm, helm_required

HELM = find_helm()
pytestmark = helm_required(HELM)
CHART = CHARTS / "metax-operator"
FIXTURES = Path(__file__).parent / "fixtures"

VALUE_SETS: Dict[str, Dict[str, Any]] = {
    "defaults": {},
    "manual-install": {
        "registry": "harbor.example.cn/mximages",
        "driver": {"deploy": True, "payload": {"version": "2.29.0.13"}},
        "maca": {"payload": {"registry": "harbor.example.cn/mximages",
                             "images": ["mxc500-maca:2.29.0.7-ubuntu22.04-amd64"]}},
    },
    "overrides": {"minimal": True, "deployExtenderGPUAware": True, "imageTag": "dev", "pullPolicy": "Always",
                  "log": {"level": "debug", "dir": ""},
                  "gpuDevice": {"healthyInterval": 0, "log": {"format": "text"},
                                "podTemplateSpec": {"spec": {"tolerations": [{"key": "a", "operator": "Exists"}]}}},
                  "gpuAware": {"scoreWeight": "2.5"},
                  "podTemplateSpec": {"metadata": {"annotations": {"team": "gpu"}}},
                  "hostRoot": {"path": "/var/lib/metax-sim", "subPathExpr": "$(NODE_NAME)"}},
    "data-exporter": {"dataExporter": {"deploy": True, "interval": 5, "service": {"port": 30445},
                                       "log": {"level": "debug"}, "resources": {"limits": {"memory": "96Mi"}}}},
}


def coalesce(base, overrides):
    """Helm's merge of user values over values.yaml: maps merge, everything else replaces."""
    out = dict(base)
    for key, value in overrides.items():
        out[key] = coalesce(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) \
            else value
    return out


def chart_values(overrides):
    return coalesce(yaml.safe_load((CHART / "values.yaml").read_text()), overrides)


def rendered_cr(overrides):
    proc = subprocess.run([HELM, "template", "x", str(CHART), "-n", "metax-operator", "--values", "-",
                           "--show-only", "templates/clusteroperator.yaml"],
                          input=yaml.safe_dump(overrides), capture_output=True, text=True, check=True, timeout=60)
    return yaml.safe_load(proc.stdout)


def crd_schema():
    crd = yaml.safe_load((CHART / "crds" / "clusteroperator.yaml").read_text())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_mapping_json_is_the_tables_json():
    assert (CHART / "files" / "mapping.json").read_text() == mapping.mapping_json()


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_chart_renders_what_values_to_spec_says(name):
    cr = rendered_cr(VALUE_SETS[name])
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert cr["spec"] == mapping.values_to_spec(chart_values(VALUE_SETS[name]), app_version)
    jsonschema.validate(cr, crd_schema())


def test_real_product_cr_is_accepted():
    text = (FIXTURES / "clusteroperator-0.9.2.txt").read_text()
    cr = yaml.safe_load(text[text.index("apiVersion: gpu.metax-tech.com/v1alpha1"):])
    assert cr["kind"] == "ClusterOperator" and cr["spec"]["driver"]["deployPolicy"] == "PreferCloud"
    assert cr["spec"]["dataExporter"]["service"] == {"port": 30445, "type": "ClusterIP"}
    jsonschema.validate(cr, crd_schema())


@pytest.mark.parametrize("path,value", [(("driver", "deployPolicy"), "Sometimes"),
                                        (("devicePlugin", "healthyInterval"), -1),
                                        (("labelgen", "log", "level"), "loud"),
                                        (("maca", "payload", "images"), ["no-tag"]),
                                        (("dataExporter", "interval"), 0),
                                        (("dataExporter", "service", "port"), 70000)])
def test_crd_refuses_bad_values(path, value):
    spec: Dict[str, Any] = {}
    node = spec
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"spec": spec}, crd_schema())


def test_every_read_only_container_has_a_writable_tmp_and_a_leader_identity():
    """The controller and the cleanup hook run with a read-only root as a uid
    without a passwd entry: Python's tempfile and helm need a writable /tmp,
    and the Lease's holderIdentity is the pod's name (POD_NAME)."""
    proc = subprocess.run([HELM, "template", "x", str(CHART), "-n", "metax-operator",
                           "--show-only", "templates/controller.yaml"],
                          capture_output=True, text=True, check=True, timeout=60)
    pods = {doc["kind"]: doc["spec"]["template"]["spec"] for doc in yaml.safe_load_all(proc.stdout)
            if doc and doc["kind"] in ("Deployment", "Job")}
    assert set(pods) == {"Deployment", "Job"}
    for kind, pod in pods.items():
        tmp_volumes = {v["name"] for v in pod.get("volumes", []) if "emptyDir" in v}
        for container in pod["containers"]:
            assert container["securityContext"]["readOnlyRootFilesystem"] is True
            mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
            assert mounts.get("/tmp") in tmp_volumes, (kind, container["name"])
    controller_env = {e["name"] for e in pods["Deployment"]["containers"][0]["env"]}
    assert "POD_NAME" in controller_env
    # it reconciles every agent: among the last pods evicted under node pressure
    assert pods["Deployment"]["priorityClassName"] == "system-cluster-critical"


def test_leader_identity_is_the_pod_name():
    from ansible_collections.metax.gpu.plugins.module_utils.agents.operator_controller import leader_identity

    assert leader_identity("operator-controller-abc", "host", 7) == "operator-controller-abc"
    assert leader_identity(None, "host", 7) == "host_7"


def test_the_crd_is_cluster_scoped_and_no_foreign_crd_ships():
    """As the real product (clusteroperator-0.9.2.txt: no namespace); kopf's peering CRD is gone
    (leader election through a Lease, docs/design-decisions.md)."""
    crd = yaml.safe_load((CHART / "crds" / "clusteroperator.yaml").read_text())
    assert crd["spec"]["scope"] == "Cluster"
    assert sorted(p.name for p in (CHART / "crds").iterdir()) == ["clusteroperator.yaml"]
    cr = rendered_cr({})
    assert "namespace" not in cr["metadata"]


def test_the_crd_keeps_keys_it_does_not_know_and_defaults_upgrade_policy_as_the_real_cr():
    schema = crd_schema()
    spec = schema["properties"]["spec"]
    assert spec["x-kubernetes-preserve-unknown-fields"] is True
    for section in ("labelgen", "devicePlugin", "driver", "maca", "runtime", "vfioManager", "dataExporter"):
        assert spec["properties"][section]["x-kubernetes-preserve-unknown-fields"] is True, section
    policy = spec["properties"]["driver"]["properties"]["upgradePolicy"]
    defaults = {k: v.get("default") for k, v in policy["properties"].items()}
    assert policy["default"] == {} and defaults == {
        "enableRollout": False, "fallback": "pause", "maxFailureThreshold": 5, "maxParallel": "100%",
        "maxUnavailable": "0%", "pause": False,
        "upgradeSteps": [{"replicas": 1, "pauseDuration": 30000}, {"replicas": "100%", "pauseDuration": 0}]}
    # the kubectl patch of the sample, and a real values file's vfnumsConfig.nodes level
    jsonschema.validate({"spec": {"vfioManager": {"deploy": False}}}, schema)
    jsonschema.validate({"spec": {"driver": {"vfnumsConfig": {"nodes": {"gpu-a": {"vfnum": 2}}}}}}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"spec": {"driver": {"vfnumsConfig": {"nodes": {"gpu-a": {"vfnum": 3}}}}}}, schema)
