# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The one mapping between the chart's values (the manual's names) and ClusterOperator.spec (the real product's).

:data:`MAPPING` is the table. The metax-operator chart renders its
ClusterOperator from the same table (``files/charts/metax-operator/files/mapping.json``
is this table as JSON; ``python -m ...clusteroperator.mapping`` prints it and a unit
test fails when the two differ), and :func:`values_to_spec` is that template's
meaning in Python (a unit test compares both on several value sets).
:func:`spec_to_extension_values` goes the other way for the controller: the
values with which it renders the GPU Extensions chart's agents.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Dict, List, Mapping, Optional, Tuple

from .. import names
from .components import DRIVER as DRIVER_COMPONENT
from .components import REGISTRY
from .contract import Component, deployed

# gpu-exporter's defaults: the Extensions chart's gpuExporter.port and .interval (the CRD's defaults too)
EXPORTER_PORT = 9401
EXPORTER_INTERVAL = 15
LOG_KEYS = ("dir", "level", "format", "rotationTime", "maxAge")
DEFAULT_LOG = {"dir": "/var/log/metax", "level": "info", "format": "json", "rotationTime": "1w", "maxAge": "26w"}

# spec key <- values key, copied as they are
GLOBALS = {
    "minimal": "minimal",
    "podTemplateSpec": "podTemplateSpec",
    "hostRoot": "hostRoot",
    "tolerations": "tolerations",
    "imagePullSecrets": "imagePullSecrets",
    "priorityClassName": "priorityClassName",
}

# One entry per CR section: its values key (Tables 3.1-3.6 and 2.1-2.4), the
# default image name, the values key holding ``deploy`` when it is not the
# section's own, the members copied as they are, and the members whose
# ``registry`` defaults to the global ``registry`` (Tables 3.5, 3.6).
SECTIONS: Tuple[Dict[str, Any], ...] = (
    {"spec": "labelgen", "values": "gpuLabel", "image": "gpu-label", "deployValue": None,
     "fields": ["deploy", "resources", "podTemplateSpec"], "registryDefaults": []},
    {"spec": "devicePlugin", "values": "gpuDevice", "image": "gpu-device", "deployValue": None,
     "fields": ["deploy", "healthyInterval", "cdiMode", "healthPolicy", "resources", "podTemplateSpec"],
     "registryDefaults": []},
    {"spec": "gpuAware", "values": "gpuAware", "image": "gpu-aware", "deployValue": "deployExtenderGPUAware",
     "fields": ["scoreWeight", "lossWeight", "resources", "podTemplateSpec"], "registryDefaults": []},
    # extra (the real product's CR has it, the manual not): gpu-exporter, default off
    {"spec": "dataExporter", "values": "dataExporter", "image": "gpu-exporter", "deployValue": None,
     "fields": ["deploy", "interval", "service", "resources", "podTemplateSpec"], "registryDefaults": []},
    # fw* are the real product's firmware options: carried into the CR as it has them, not acted
    # on (status.ignored_fields names them); vfnumsConfig is read in both shapes (vfnums_entries)
    {"spec": "driver", "values": "driver", "image": "driver-manager", "deployValue": None,
     "fields": ["deploy", "deployPolicy", "payload", "upgradePolicy", "vfnumPolicy", "vfnumsConfig", "moduleParams",
                "nodeModuleParams", "fwEffectPolicy", "fwEnableVirt", "fwUpgradePolicy", "resources", "podTemplateSpec"],
     "registryDefaults": ["payload"]},
    {"spec": "maca", "values": "maca", "image": "driver-manager", "deployValue": None,
     "fields": ["deploy", "payload", "resources", "podTemplateSpec"], "registryDefaults": ["payload"]},
    {"spec": "runtime", "values": "runtime", "image": "container-runtime", "deployValue": None,
     "fields": ["deploy", "resources", "podTemplateSpec"], "registryDefaults": []},
    # extra (issue 41): gpu-dra, the DRA driver (docs/dra.md), default off
    {"spec": "draDriver", "values": "draDriver", "image": "gpu-dra", "deployValue": None,
     "fields": ["deploy", "healthyInterval", "extendedResourceClass", "resources", "podTemplateSpec"],
     "registryDefaults": []},
    # the real product's vfio-manager (issue 43): GPUs for VMs from driver-config's vfio entry
    {"spec": "vfioManager", "values": "vfioManager", "image": "vfio-manager", "deployValue": None,
     "fields": ["deploy", "resources", "podTemplateSpec"], "registryDefaults": []},
)

# Values of a real 0.9.2 install that have no place in our CR and that we do not act on: the
# schema accepts them, and the chart names the ones set in the CR's annotation
# IGNORED_VALUES_ANNOTATION, from which the status condition IgnoredFields reports them
# (status.ignored_fields). "any": reported when set at all; "map": only when a map (a string
# there is ours: controller.image). Nothing of a real values file is refused or dropped unsaid.
_COMPONENT_VALUES = ("gpuLabel", "gpuDevice", "gpuAware", "dataExporter", "driver", "maca", "runtime", "vfioManager")
IGNORED_VALUES: Dict[str, str] = dict(
    [("serviceAccount", "any"), ("cmInit", "any"), ("topoDiscovery", "any"), ("gpuScheduler", "any"),
     ("podTemplateSpecFile", "any"), ("controller.image", "map")]
    + [("%s.%s" % (section, member), "any") for section in _COMPONENT_VALUES
       for member in ("image", "podTemplateSpecFile", "cmInit")])
IGNORED_VALUES_ANNOTATION = names.OPERATOR_GROUP + "/ignored-values"

MAPPING: Dict[str, Any] = {"globals": GLOBALS, "sections": list(SECTIONS), "ignoredValues": IGNORED_VALUES,
                           "ignoredValuesAnnotation": IGNORED_VALUES_ANNOTATION}


def mapping_json() -> str:
    """The table as the chart's ``files/mapping.json`` holds it."""
    return json.dumps(MAPPING, indent=2, sort_keys=True) + "\n"


def merged_log(global_log: Optional[Mapping[str, Any]], own: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """A component's log options: its own members (even "") over the global ones (Table 2.5)."""
    log = dict(DEFAULT_LOG)
    log.update(global_log or {})
    log.update(own or {})
    return log


def vfnums_entries(config: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """``driver.vfnumsConfig`` as ``{<node>: {vfnum: N}}``, from the real chart's ``{nodes: {<node>: ...}}`` or that.

    A ``nodes`` member holding ``vfnum`` is a node called ``nodes`` (the flat shape).
    """
    config = config or {}
    nested = config.get("nodes")
    if not isinstance(nested, Mapping) or "vfnum" in nested:
        return copy.deepcopy(dict(config))
    out = {k: copy.deepcopy(v) for k, v in config.items() if k != "nodes"}
    out.update(copy.deepcopy(dict(nested)))
    return out


def _value_at(values: Mapping[str, Any], path: str) -> Tuple[bool, Any]:
    node: Any = values
    for key in path.split("."):
        if not isinstance(node, Mapping) or key not in node:
            return False, None
        node = node[key]
    return True, node


def ignored_values(values: Mapping[str, Any]) -> List[str]:
    """The IGNORED_VALUES set in ``values`` (null counts as unset, as helm drops it), sorted."""
    out = []
    for path, kind in IGNORED_VALUES.items():
        found, value = _value_at(values, path)
        if found and value is not None and (kind == "any" or isinstance(value, Mapping)):
            out.append(path)
    return sorted(out)


def values_to_spec(values: Mapping[str, Any], app_version: str) -> Dict[str, Any]:
    """The ClusterOperator spec the chart renders from its values (what templates/clusteroperator.yaml does)."""
    spec: Dict[str, Any] = {}
    for spec_key, values_key in GLOBALS.items():
        if values_key in values:
            spec[spec_key] = copy.deepcopy(values[values_key])
    registry = values.get("registry", "")
    for section in SECTIONS:
        src = values.get(section["values"]) or {}
        out: Dict[str, Any] = {
            "image": {"registry": registry, "name": section["image"],
                      "version": values.get("imageTag") or app_version,
                      "pullPolicy": values.get("pullPolicy", "IfNotPresent")},
            "log": merged_log(values.get("log"), src.get("log")),
        }
        for field in section["fields"]:
            if field in src:
                out[field] = copy.deepcopy(src[field])
        if section["deployValue"] and section["deployValue"] in values:
            out["deploy"] = values[section["deployValue"]]
        for member in section["registryDefaults"]:
            if isinstance(out.get(member), dict) and not out[member].get("registry"):
                out[member]["registry"] = registry
        if "vfnumsConfig" in out:
            out["vfnumsConfig"] = vfnums_entries(out["vfnumsConfig"])
        spec[section["spec"]] = out
    return spec


def missing_requirements(values: Mapping[str, Any]) -> List[str]:
    """Why the chart refuses ``values``: a component on that lacks what it needs (templates/_helpers.tpl)."""
    if values.get("minimal"):
        return []
    out = []
    driver, maca = values.get("driver") or {}, values.get("maca") or {}
    if driver.get("deploy", True) and not str((driver.get("payload") or {}).get("version") or ""):
        out.append("driver.payload.version")
    if maca.get("deploy", True) and not (maca.get("payload") or {}).get("images"):
        out.append("maca.payload.images")
    return out


def _image(section: Mapping[str, Any], default_name: str) -> Dict[str, Any]:
    image = dict(section.get("image") or {})
    image.setdefault("name", default_name)
    image.setdefault("pullPolicy", "IfNotPresent")
    return image


def image_reference(spec: Mapping[str, Any], component: Component) -> str:
    """registry/name:version of a component's image from the spec."""
    image = _image(spec.get(component.spec_key) or {}, component.image)
    ref = image["name"]
    if image.get("registry"):
        ref = image["registry"].rstrip("/") + "/" + ref
    return ref + ":" + str(image.get("version") or "latest")


def spec_to_extension_values(spec: Mapping[str, Any], gpu_node_selector: Mapping[str, str]) -> Dict[str, Any]:
    """Values of the GPU Extensions chart rendering the agents the spec asks for.

    Images, pull policies, resources and ``podTemplateSpec`` are per component in
    the CR and applied to the rendered objects afterwards (``render.py``); what
    the chart turns into arguments (health interval, weights, log options) goes
    through its values, so the agents' command lines have one definition.
    """
    device = spec.get("devicePlugin") or {}
    label = spec.get("labelgen") or {}
    aware = spec.get("gpuAware") or {}
    exporter = spec.get("dataExporter") or {}
    driver = spec.get("driver") or {}
    vfnum_policy = driver.get("vfnumPolicy") or {}
    payload = driver.get("payload") or {}
    maca = spec.get("maca") or {}
    maca_payload = maca.get("payload") or {}
    dra = spec.get("draDriver") or {}
    values: Dict[str, Any] = {
        "registry": "operator.invalid/rendered",  # replaced per component by the CR's image
        "pullPolicy": _image(device, "gpu-device")["pullPolicy"],
        "log": dict(DEFAULT_LOG),
        "gpuDevice": {"healthyInterval": device.get("healthyInterval", 5), "cdiMode": device.get("cdiMode", "auto"),
                      "log": merged_log(None, device.get("log")),
                      # the health policy section (docs/health.md): rendered into gpu-device's ConfigMap
                      "healthPolicy": copy.deepcopy(device.get("healthPolicy") or {})},
        # with the driver component, driver.ready is the controller's and gpu.driver.mode
        # driver-manager's: gpu-label writes neither (one writer per key)
        "gpuLabel": {"log": merged_log(None, label.get("log")),
                     "driverLabels": not deployed(DRIVER_COMPONENT, spec)},
        "gpuAware": {"scoreWeight": str(aware.get("scoreWeight", "1")), "lossWeight": str(aware.get("lossWeight", "1")),
                     "log": merged_log(None, aware.get("log"))},
        # always rendered: desired_objects keeps its objects only when dataExporter deploys it
        # (ServiceMonitor and PrometheusRule need their CRDs, which helm template does not see)
        "gpuExporter": {"enabled": True, "port": (exporter.get("service") or {}).get("port", EXPORTER_PORT),
                        "serviceType": (exporter.get("service") or {}).get("type", "ClusterIP"),
                        "interval": exporter.get("interval", EXPORTER_INTERVAL),
                        "log": merged_log(None, exporter.get("log"))},
        # always rendered too: desired_objects keeps them only when driver.deploy is true
        "driverManager": {"enabled": True, "deployPolicy": driver.get("deployPolicy", "IfNotPresent"),
                          "payload": {"registry": payload.get("registry") or "operator.invalid/rendered",
                                      "name": payload.get("name", "driver-image"),
                                      "version": str(payload.get("version", "")),
                                      "pullPolicy": payload.get("pullPolicy", "")},
                          "moduleParams": driver.get("moduleParams", ""),
                          "nodeModuleParams": copy.deepcopy(driver.get("nodeModuleParams") or {}),
                          "vfnumsConfig": vfnums_entries(driver.get("vfnumsConfig")),
                          "vfnumPolicy": {"evictInUse": bool(vfnum_policy.get("evictInUse", False)),
                                          "maxParallel": int(vfnum_policy.get("maxParallel", 1))},
                          # the operator-controller serves the eviction guard itself (metax-operator chart)
                          "evictionGuard": {"enabled": False},
                          "log": merged_log(None, driver.get("log"))},
        # the same for the MACA component (maca.deploy): one image volume per payload image
        "macaManager": {"enabled": True,
                        "payload": {"registry": maca_payload.get("registry") or "operator.invalid/rendered",
                                    "images": [str(i) for i in maca_payload.get("images") or []],
                                    "pullPolicy": maca_payload.get("pullPolicy", "")},
                        "log": merged_log(None, maca.get("log"))},
        "gpuNodeSelector": dict(gpu_node_selector),
        "deployExtenderGPUAware": False,
        # always rendered too: desired_objects keeps gpu-dra's objects only when draDriver.deploy is true
        "dra": {"enabled": True, "healthyInterval": dra.get("healthyInterval", 5),
                "extendedResourceClass": dra.get("extendedResourceClass", "gpu"),
                "log": merged_log(None, dra.get("log"))},
        # always rendered too, kept when vfioManager.deploy is true; a GPU in use is handed over
        # as a vfnum change is made (the vfnum rules: spec.driver.vfnumPolicy.evictInUse)
        "vfioAgent": {"enabled": True, "evictInUse": bool(vfnum_policy.get("evictInUse", False)),
                      "log": merged_log(None, (spec.get("vfioManager") or {}).get("log"))},
    }
    for key in ("hostRoot", "tolerations", "imagePullSecrets", "priorityClassName"):
        if key in spec:
            values[key] = copy.deepcopy(spec[key])
    for component in REGISTRY:
        if deployed(component, spec):
            values.update(component.enable_values)
    return values


def main() -> None:
    import sys
    sys.stdout.write(mapping_json())


if __name__ == "__main__":
    main()
