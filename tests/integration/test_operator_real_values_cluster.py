# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""A values file of a real MetaX operator 0.9.2 install, on the local cluster (issue 38, item 3).

The values are clusteroperator-0.9.2.txt's spec under the values' names, the
real chart's ``driver.vfnumsConfig.nodes.<node>.vfnum`` nesting and the real
chart's keys this chart does not act on (``serviceAccount``, ``controller.image``
as a map, ``cmInit`` ...); only ``registry`` is the local registry, so that
the controller runs. ``helm install`` takes it; the ClusterOperator's
``IgnoredFields`` condition names what is not acted on, once; driver-config
exists from the install on with the nested entry; the sample's
``kubectl patch ... vfioManager`` works. The nodes' real root (the default
hostRoot, as on a real install) has no MetaX GPU, so no payload is pulled and
no node is changed: what is tested is the chart, the CR and the controller's
status.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import yaml
from polling import wait_until
from test_operator_cluster import (  # noqa: F401  # pylint: disable=unused-import  # fixtures shared with the operator's module
    CHART, NS, UNINSTALL_SCRIPT, cr, get_json, helm, no_extensions, patch_cr, strip_ours)

from ansible_collections.metax.gpu.plugins.module_utils import names as N

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SAMPLE = os.path.join(ROOT, "tests", "unit", "clusteroperator", "fixtures", "clusteroperator-0.9.2.txt")
SPEC_TO_VALUES = {"labelgen": "gpuLabel", "devicePlugin": "gpuDevice", "dataExporter": "dataExporter",
                  "driver": "driver", "maca": "maca", "runtime": "runtime", "vfioManager": "vfioManager"}
pytestmark = pytest.mark.cluster


def real_values(registry):
    with open(SAMPLE, encoding="utf-8") as handle:
        text = handle.read()
    spec = yaml.safe_load(text[text.index("apiVersion: gpu.metax-tech.com/v1alpha1"):])["spec"]
    values = {SPEC_TO_VALUES[key]: section for key, section in spec.items()}
    values.update({"registry": registry, "serviceAccount": {"create": True, "name": ""},
                   "controller": {"image": {"name": "operator-controller", "version": "0.9.2"}},
                   "cmInit": {"config": {"version": "v1"}}})
    values["driver"]["vfnumsConfig"] = {"nodes": {"node-a": {"vfnum": 4}}}
    return values


def ignored_condition(cluster):
    body = cr(cluster) or {}
    return next((c for c in (body.get("status") or {}).get("conditions") or [] if c["type"] == "IgnoredFields"),
                None)


def test_a_real_092_values_file_installs_and_names_what_is_not_acted_on(cluster, images, no_extensions):
    strip_ours(cluster)     # no gpu.installed left by an earlier module: nothing of the chain may start here
    res = helm(cluster, "install", CHART, "--create-namespace", "-n", NS, "--generate-name", "--wait",
               "--values", "-", "--set-string", "imageTag=" + images["tag"],
               input=yaml.safe_dump(real_values(images["registry"])))
    try:
        assert res.returncode == 0, "helm install failed:\n%s\n%s" % (res.stdout, res.stderr)
        body = cr(cluster)
        assert body["spec"]["driver"]["payload"]["version"] == "2.29.0.13"
        assert body["spec"]["driver"]["upgradePolicy"]["enableRollout"] is False
        assert body["spec"]["driver"]["vfnumsConfig"] == {"node-a": {"vfnum": 4}}
        # driver-config from the install on (manual 3.2.3), with the real nesting's entry
        config = get_json(cluster, "configmap", N.DRIVER_CONFIGMAP, "-n", NS)
        assert config is not None and yaml.safe_load(config["data"]["node-vfnums"]) == {
            "nodes": {"node-a": {"vfnum": 4}}}
        # the controller names what it does not act on, in one condition
        found = wait_until(lambda: ignored_condition(cluster), 60, "the IgnoredFields condition",
                           diagnose=[lambda: json.dumps((cr(cluster) or {}).get("status"), indent=1)])
        assert found["status"] == "True" and found["reason"] == "AcceptedNotActedOn"
        for path in ("spec.driver.fwUpgradePolicy", "values serviceAccount", "values controller.image",
                     "values cmInit", "values driver.image"):
            assert path in found["message"], found["message"]
        assert "vfioManager.deploy" not in found["message"]
        # the sample's own command (clusteroperator-0.9.2.txt); vfio-manager is acted on since issue 43
        # (tests/integration/test_vfio_cluster.py), so asking for it is never named in IgnoredFields
        sample = cluster.kubectl("patch", "clusteroperator", "cluster-operator", "-n", "metax-operator",
                                 "--type=merge", "-p", '{"spec":{"vfioManager":{"deploy":false}}}')
        assert sample.returncode == 0, sample.stderr
    finally:
        subprocess.run(["bash", "-c", UNINSTALL_SCRIPT], env=cluster.env, capture_output=True, text=True,
                       timeout=600, check=False)
    # the chart's driver-config goes with the release
    assert get_json(cluster, "configmap", N.DRIVER_CONFIGMAP, "-n", NS) is None
