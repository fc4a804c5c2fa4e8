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

import functools
import subprocess
from pathlib import Path
from typing import Any, Dict

import jsonschema
import pytest
import yaml

from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator import mapping

from charts.helm import CHARTS, find_helm, helm_required, load_all, template as helm_template

HELM = find_helm()
pytestmark = helm_required(HELM)
CHART = CHARTS / "metax-operator"
FIXTURES = Path(__file__).parent / "fixtures"

# what the chart's defaults need (the driver and MACA components are on, issue 38)
PAYLOADS = {"driver": {"payload": {"version": "2.29.0.13"}},
            "maca": {"payload": {"images": ["mxc500-maca:2.29.0.7-ubuntu22.04-amd64"]}}}


def real_cr():
    text = (FIXTURES / "clusteroperator-0.9.2.txt").read_text()
    return yaml.safe_load(text[text.index("apiVersion: gpu.metax-tech.com/v1alpha1"):])


# ClusterOperator.spec key -> the chart values key (the manual's names)
SPEC_TO_VALUES = {"labelgen": "gpuLabel", "devicePlugin": "gpuDevice", "dataExporter": "dataExporter",
                  "driver": "driver", "maca": "maca", "runtime": "runtime", "vfioManager": "vfioManager"}


def real_values():
    """A values file of a real 0.9.2 install: clusteroperator-0.9.2.txt's spec under the values' names,
    the real chart's vfnumsConfig nesting, and the real chart's keys with no place in our CR."""
    values: Dict[str, Any] = {"registry": "harbor.example.cn/mximages",
                              "serviceAccount": {"create": True, "name": ""},
                              "controller": {"image": {"name": "operator-controller", "version": "0.9.2",
                                                       "pullPolicy": "IfNotPresent"}},
                              "cmInit": {"config": {"version": "v1"}},
                              "topoDiscovery": {"deploy": False},
                              "gpuScheduler": {"deploy": False},
                              "podTemplateSpecFile": ""}
    for spec_key, section in real_cr()["spec"].items():
        values[SPEC_TO_VALUES[spec_key]] = section
    values["driver"]["vfnumsConfig"] = {"nodes": {"node-a": {"vfnum": 4}}}
    values["gpuDevice"]["podTemplateSpecFile"] = "spec: {}\n"
    return values


VALUE_SETS: Dict[str, Dict[str, Any]] = {
    "minimal": {"minimal": True},
    "manual-install": {
        "registry": "harbor.example.cn/mximages",
        "driver": {"payload": {"version": "2.29.0.13"}},
        "maca": {"payload": {"registry": "harbor.example.cn/mximages",
                             "images": ["mxc500-maca:2.29.0.7-ubuntu22.04-amd64"]}},
    },
    "real-0.9.2-values": real_values(),
    "flat-vfnums": dict(PAYLOADS, driver={"payload": {"version": "2.12.13"},
                                          "vfnumsConfig": {"node-a": {"vfnum": 2}, "nodes": {"vfnum": 8}}}),
    "overrides": {"minimal": True, "deployExtenderGPUAware": True, "imageTag": "dev", "pullPolicy": "Always",
                  "log": {"level": "debug", "dir": ""},
                  "gpuDevice": {"healthyInterval": 0, "log": {"format": "text"},
                                "podTemplateSpec": {"spec": {"tolerations": [{"key": "a", "operator": "Exists"}]}}},
                  "gpuAware": {"scoreWeight": "2.5"},
                  "podTemplateSpec": {"metadata": {"annotations": {"team": "gpu"}}},
                  "hostRoot": {"path": "/var/lib/metax-sim", "subPathExpr": "$(NODE_NAME)"}},
    "data-exporter": {**PAYLOADS, "dataExporter": {"deploy": True, "interval": 5, "service": {"port": 30445},
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


def template(values=None, sets=()):
    """(rc, {(kind, name): object}, stderr) of helm template of the chart with a values file and --set flags."""
    args = [HELM, "template", "x", str(CHART), "-n", "metax-operator", "--values", "-"]
    for pair in sets:
        args += ["--set", pair]
    rc, stdout, stderr = helm_template(tuple(args), yaml.safe_dump(values or {}))
    docs = load_all(stdout) if rc == 0 else []
    return rc, {(d["kind"], d["metadata"]["name"]): d for d in docs}, stderr


def rendered_cr(overrides):
    rc, stdout, stderr = helm_template((HELM, "template", "x", str(CHART), "-n", "metax-operator", "--values", "-",
                                        "--show-only", "templates/clusteroperator.yaml"), yaml.safe_dump(overrides))
    assert rc == 0, stderr
    return yaml.safe_load(stdout)


@functools.lru_cache(maxsize=None)
def _crd_text():
    return (CHART / "crds" / "clusteroperator.yaml").read_text()


def crd_schema():
    crd = yaml.safe_load(_crd_text())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


@functools.lru_cache(maxsize=None)
def _crd_validator():
    """jsonschema.validate's validator for the CRD's schema, the schema checked once (validate checks
    it against the metaschema on every call: most of this file's time)."""
    schema = crd_schema()
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def validate_against_crd(instance):
    """jsonschema.validate(instance, crd_schema()): raises the best-matching ValidationError."""
    error = jsonschema.exceptions.best_match(_crd_validator().iter_errors(instance))
    if error is not None:
        raise error


def test_mapping_json_is_the_tables_json():
    assert (CHART / "files" / "mapping.json").read_text() == mapping.mapping_json()


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_chart_renders_what_values_to_spec_says(name):
    cr = rendered_cr(VALUE_SETS[name])
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert cr["spec"] == mapping.values_to_spec(chart_values(VALUE_SETS[name]), app_version)
    # and the values it does not act on, named in the annotation, are mapping.ignored_values'
    text = (cr["metadata"].get("annotations") or {}).get(mapping.IGNORED_VALUES_ANNOTATION, "")
    assert [p for p in text.split(", ") if p] == mapping.ignored_values(chart_values(VALUE_SETS[name]))
    validate_against_crd(cr)


def test_real_product_cr_is_accepted():
    cr = real_cr()
    assert cr["kind"] == "ClusterOperator" and cr["spec"]["driver"]["deployPolicy"] == "PreferCloud"
    assert cr["spec"]["dataExporter"]["service"] == {"port": 30445, "type": "ClusterIP"}
    validate_against_crd(cr)


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
        validate_against_crd({"spec": spec})


def test_every_read_only_container_has_a_writable_tmp_and_a_leader_identity():
    """The controller and the cleanup hook run with a read-only root as a uid
    without a passwd entry: Python's tempfile and helm need a writable /tmp,
    and the Lease's holderIdentity is the pod's name (POD_NAME)."""
    proc = subprocess.run([HELM, "template", "x", str(CHART), "-n", "metax-operator", "--set", "minimal=true",
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
    cr = rendered_cr({"minimal": True})
    assert "namespace" not in cr["metadata"]


def test_the_crd_knows_the_samples_patch_and_refuses_a_typo():
    """The sample's `kubectl patch ... vfioManager.deploy` validates; an unknown field is refused, not
    kept silently (every key of a real 0.9.2 CR is known to the schema, acted on or not)."""
    schema = _closed(crd_schema())
    jsonschema.validate({"spec": {"vfioManager": {"deploy": False}}}, schema)
    jsonschema.validate(real_cr(), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"spec": {"devicePlugin": {"healthyIntervall": 3}}}, schema)


def _closed(schema: Any) -> Any:
    """``schema`` with additionalProperties false wherever it lists properties and says nothing else
    (what the API server's pruning and strict field validation do with a structural schema)."""
    if isinstance(schema, dict):
        out = {k: _closed(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out and \
                not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_closed(v) for v in schema]
    return schema


# -- issue 38: the manual's install is the whole product; real values install ---------------------------

MANUAL_FLAGS = ["registry=harbor.example.cn/mximages", "driver.payload.version=2.29.0.13",
                "maca.payload.registry=harbor.example.cn/mximages",
                "maca.payload.images={mxc500-maca:2.29.0.7-ubuntu22.04-amd64}"]


def test_the_manuals_flags_deploy_the_five_components():
    """helm install ... --set registry=... --set driver.payload.version=V --set maca.payload.registry=...
    --set maca.payload.images={IMAGE} (manual 3.2.1, helm-install-operator-0.9.2.txt): the CR deploys
    gpu-label, container-runtime, driver, maca and gpu-device, and the flags reach them."""
    from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator import components, render
    from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator.contract import deployed

    rc, objs, err = template(sets=MANUAL_FLAGS)
    assert rc == 0, err
    spec = objs[("ClusterOperator", "cluster-operator")]["spec"]
    on = {c.name for c in components.REGISTRY if deployed(c, spec)}
    assert on == {c.name for c in (components.GPU_LABEL, components.CONTAINER_RUNTIME, components.DRIVER,
                                   components.MACA, components.GPU_DEVICE)}
    assert spec["driver"]["payload"] == {"name": "driver-image", "version": "2.29.0.13",
                                         "registry": "harbor.example.cn/mximages"}
    assert spec["maca"]["payload"] == {"registry": "harbor.example.cn/mximages",
                                       "images": ["mxc500-maca:2.29.0.7-ubuntu22.04-amd64"]}
    # what the controller renders from that CR: the five DaemonSets, with the payloads
    owner = {"metadata": {"name": "cluster-operator", "namespace": "metax-operator", "uid": "u-1"}}
    rendered = render.helm_template(HELM, str(CHARTS / "metax-gpu-extensions"), render.chart_values(spec),
                                    "metax-operator")
    desired = render.desired_objects(rendered, spec, owner)
    daemonsets = {name: next(o for o in objs_ if o["kind"] == "DaemonSet")
                  for name, objs_ in desired.items() if any(o["kind"] == "DaemonSet" for o in objs_)}
    assert set(daemonsets) == on
    driver_pod = daemonsets[components.DRIVER.name]["spec"]["template"]["spec"]
    assert driver_pod["initContainers"][0]["image"] == "harbor.example.cn/mximages/driver-image:2.29.0.13"
    maca_volumes = [v["image"]["reference"] for v in
                    daemonsets[components.MACA.name]["spec"]["template"]["spec"]["volumes"] if "image" in v]
    assert maca_volumes == ["harbor.example.cn/mximages/mxc500-maca:2.29.0.7-ubuntu22.04-amd64"]
    assert spec["driver"]["upgradePolicy"] == real_cr()["spec"]["driver"]["upgradePolicy"]


@pytest.mark.parametrize("sets, named", [
    ([f for f in MANUAL_FLAGS if not f.startswith("driver.")], "driver.payload.version"),
    ([f for f in MANUAL_FLAGS if not f.startswith("maca.payload.images")], "maca.payload.images"),
    (["registry=harbor.example.cn/mximages"], "driver.payload.version"),
    (MANUAL_FLAGS[:1] + ["driver.payload.version="] + MANUAL_FLAGS[2:], "driver.payload.version"),
])
def test_a_component_on_without_its_payload_fails_the_install_naming_the_value(sets, named):
    rc, _objs, err = template(sets=sets)
    assert rc != 0 and named + " is required" in err, err
    assert mapping.missing_requirements(chart_values(_sets_as_values(sets)))[0] == named


def _sets_as_values(sets):
    values: Dict[str, Any] = {}
    for pair in sets:
        key, _sep, value = pair.partition("=")
        node = values
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value[1:-1].split(",") if value.startswith("{") else \
            {"true": True, "false": False}.get(value, value)       # --set's reading
    return values


@pytest.mark.parametrize("sets", [
    ["minimal=true"],                                                # driver and MACA installed by hand
    ["driver.deploy=false", "maca.deploy=false"],
    ["driver.deploy=false"] + [f for f in MANUAL_FLAGS if f.startswith("maca.")],
])
def test_minimal_mode_or_switched_off_components_need_no_payload(sets):
    rc, objs, err = template(sets=sets)
    assert rc == 0, err
    assert mapping.missing_requirements(chart_values(_sets_as_values(sets))) == []
    # no driver component, no driver-config of the chart's
    assert ("ConfigMap", "driver-config") not in objs


@pytest.mark.parametrize("version, ok", [
    ("2.29.0.13", True), ("2.12.13", True), ("2.12.13-rc.1_b", True), ("3", True),
    ("../x", False), ("a b", False), ("$(x)", False), ("2.12.13;rm", False), ("2.12.13-", False),
    ("v2.12", False), ("2..1", False), ("2.12/../../x", False),
])
def test_the_payload_version_is_a_version_and_nothing_else(version, ok):
    args = [f for f in MANUAL_FLAGS if not f.startswith("driver.")]
    rc, _objs, err = template({"driver": {"payload": {"version": version}}}, sets=args)
    assert (rc == 0) == ok, err
    if not ok:
        assert "/driver/payload/version" in err and "pattern" in err, err


def test_a_real_092_values_file_installs_and_what_we_do_not_act_on_is_named():
    from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator import status

    rc, objs, err = template(real_values())
    assert rc == 0, err
    cr = objs[("ClusterOperator", "cluster-operator")]
    spec = cr["spec"]
    real = real_cr()["spec"]
    # the real CR's members we act on arrive as they are
    assert spec["driver"]["deployPolicy"] == "PreferCloud" and spec["driver"]["upgradePolicy"] == \
        real["driver"]["upgradePolicy"]
    assert spec["driver"]["payload"] == real["driver"]["payload"]
    assert spec["maca"]["payload"] == real["maca"]["payload"] and spec["maca"]["resources"] == real["maca"]["resources"]
    assert spec["dataExporter"]["service"] == {"port": 30445, "type": "ClusterIP"}
    assert spec["vfioManager"]["deploy"] is False
    # the real chart's nesting, flattened into the CR's {<node>: {vfnum}}
    assert spec["driver"]["vfnumsConfig"] == {"node-a": {"vfnum": 4}}
    validate_against_crd(cr)
    # what the operator does not act on: named once, in one condition; nothing refused, nothing dropped unsaid
    ignored = status.ignored_fields(cr)
    assert ignored == [
        "spec.driver.fwEffectPolicy", "spec.driver.fwEnableVirt", "spec.driver.fwUpgradePolicy",
        "values cmInit", "values controller.image", "values dataExporter.image", "values driver.image",
        "values gpuDevice.image", "values gpuDevice.podTemplateSpecFile", "values gpuLabel.image",
        "values gpuScheduler", "values maca.image", "values podTemplateSpecFile", "values runtime.image",
        "values serviceAccount", "values topoDiscovery", "values vfioManager.image"]
    conditions = status.overall([], ignored)
    extra = [c for c in conditions if c["type"] == "IgnoredFields"]
    assert len(extra) == 1 and extra[0]["status"] == "True"
    assert all(path in extra[0]["message"] for path in ignored)
    # and the controller keeps its own image (the real chart's controller.image map is not ours)
    controller = objs[("Deployment", "operator-controller")]["spec"]["template"]["spec"]["containers"][0]
    assert controller["image"].startswith("harbor.example.cn/mximages/operator-controller:")
    # driver-config from the install on, holding the real nesting's entry
    config = objs[("ConfigMap", "driver-config")]
    assert yaml.safe_load(config["data"]["node-vfnums"]) == {"nodes": {"node-a": {"vfnum": 4}}}


def test_driver_config_exists_from_the_install_as_driver_manager_would_create_it():
    """The chart's driver-config (so that manual 3.2.3's kubectl edit works at once) holds exactly what the
    controller's create-only one would (the Extensions chart's metax-driver.yaml): one content, two creators."""
    from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator import render

    values = {"driver": {"payload": {"version": "2.12.13"}, "moduleParams": "pf_vf_enable=1 debug=0",
                         "nodeModuleParams": {"node-b": "debug=1"},
                         "vfnumsConfig": {"nodes": {"node-a": {"vfnum": 4}, "node-b": {"vfnum": 0}}}},
              "maca": PAYLOADS["maca"]}
    rc, objs, err = template(values)
    assert rc == 0, err
    ours = objs[("ConfigMap", "driver-config")]
    # the administrator's once created (the controller never puts it back)
    assert ours["metadata"]["annotations"]["gpu.metax-tech.com/apply"] == "create-only"
    spec = objs[("ClusterOperator", "cluster-operator")]["spec"]
    rendered = render.helm_template(HELM, str(CHARTS / "metax-gpu-extensions"), render.chart_values(spec),
                                    "metax-operator")
    theirs = next(o for o in rendered if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "driver-config")
    assert ours["data"] == theirs["data"]
    assert yaml.safe_load(ours["data"]["node-vfnums"]) == {"nodes": {"node-a": {"vfnum": 4}, "node-b": {"vfnum": 0}}}
    assert ours["data"]["module-params"] == "pf_vf_enable=1 debug=0"


def test_the_upgrade_policy_defaults_are_the_real_crs():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["driver"]["upgradePolicy"] == real_cr()["spec"]["driver"]["upgradePolicy"]
    assert values["driver"]["deploy"] and values["maca"]["deploy"] and values["runtime"]["deploy"]
    assert values["minimal"] is False and values["vfioManager"]["deploy"] is False
