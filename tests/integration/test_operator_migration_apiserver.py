# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The migration of an older install's namespaced ClusterOperator, against a real kube-apiserver (issue 38).

A private control plane (controlplane.py: etcd, kube-apiserver, garbage
collector) gets what an install before issue 38 left: the namespaced CRD,
kopf's peering CRD and object, the CR `metax-operator/cluster-operator` with
its finalizer, and the objects its controller applied (the Extensions chart
rendered by the controller's own code, owned by the CR's uid). The
pre-upgrade step (`--migrate --migrate-phase pre-upgrade`) gives the namespaced
CRD this release's schema (a field the older one refused is then accepted);
then `operator-controller --migrate` (the post-upgrade Job)
runs, and:

- the CRD is cluster-scoped, the CR exists without a namespace with the same
  spec, labels and Helm annotations, and the old uid as its owner id;
- no owned object was deleted or changed (same uid, same generation: no pod
  would be recreated), none still points at the deleted CR;
- kopf's peering CRD is gone; the kept copy of the CR is gone;
- a controller started afterwards adopts every object (ownerReference to the
  new CR) without changing a DaemonSet's pod template (generation unchanged);
- a second run is a no-op.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml
from controlplane import ControlPlane, free_port, lib_dir
from polling import wait_until

from ansible_collections.metax.gpu.plugins.module_utils import names as N
from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator import render

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CHART = os.path.join(ROOT, "files", "charts", "metax-operator")
CRD = os.path.join(CHART, "crds", "clusteroperator.yaml")
EXTENSIONS = os.path.join(ROOT, "files", "charts", "metax-gpu-extensions")
NS = N.OPERATOR_NAMESPACE
MODULE = "ansible_collections.metax.gpu.plugins.module_utils.agents.operator_controller"
# gpu-label and gpu-device only (the chain components, on by default, need payloads)
IMAGE = {"registry": "127.0.0.1:5000/metax-gpu", "version": "test"}
SPEC = {"devicePlugin": {"healthyInterval": 3, "image": IMAGE}, "labelgen": {"image": IMAGE},
        "driver": {"deploy": False}, "maca": {"deploy": False}, "runtime": {"deploy": False}}
PEERING_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "kopfpeerings.kopf.dev"},
    "spec": {"scope": "Namespaced", "group": "kopf.dev",
             "names": {"kind": "KopfPeering", "plural": "kopfpeerings", "singular": "kopfpeering"},
             "versions": [{"name": "v1", "served": True, "storage": True,
                           "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}}


def namespaced_crd():
    """The CRD of an older install: namespaced, and (to see the pre-upgrade step's schema) without a
    field this release knows (vfioManager)."""
    with open(CRD) as fh:
        crd = yaml.safe_load(fh)
    crd["spec"]["scope"] = "Namespaced"
    del crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["vfioManager"]
    return crd


@pytest.fixture(scope="module")
def env():
    cp = ControlPlane().start()
    helm = os.path.join(lib_dir("helm_bin_dir"), "helm")
    try:
        yield cp, helm
    finally:
        cp.stop()


def ok(cp, *args, **kwargs):
    res = cp.kubectl(*args, **kwargs)
    assert res.returncode == 0, res.stderr
    return res


def get(cp, *args):
    res = cp.kubectl("get", "-o", "json", *args)
    return json.loads(res.stdout) if res.returncode == 0 else None


def run(cp, *args):
    return subprocess.run([sys.executable, "-m", MODULE, "--kubeconfig", cp.kubeconfig, "--namespace", NS,
                           "--crd", CRD, "--log-dir=", "--log-format=text"] + list(args),
                          capture_output=True, text=True, timeout=300, check=False,
                          env=dict(os.environ, PYTHONWARNINGS="ignore"))


def daemonsets(cp):
    return {d["metadata"]["name"]: d for d in (get(cp, "daemonsets", "-n", NS) or {"items": []})["items"]}


def test_a_namespaced_cr_is_carried_over_without_touching_its_objects(env):
    cp, helm = env
    ok(cp, "apply", "--server-side", "-f", "-", input=json.dumps(namespaced_crd()))
    ok(cp, "apply", "--server-side", "-f", "-", input=json.dumps(PEERING_CRD))
    ok(cp, "create", "namespace", NS)
    wait_until(lambda: cp.kubectl("get", "clusteroperators", "-n", NS).returncode == 0 and
               cp.kubectl("get", "kopfpeerings", "-n", NS).returncode == 0, 30, "the older CRDs served")
    ok(cp, "apply", "-f", "-", input=json.dumps({"apiVersion": "kopf.dev/v1", "kind": "KopfPeering",
                                                 "metadata": {"name": "metax-operator", "namespace": NS}}))
    old = {"apiVersion": "gpu.metax-tech.com/v1alpha1", "kind": "ClusterOperator",
           "metadata": {"name": N.OPERATOR_CR_NAME, "namespace": NS, "finalizers": [N.OPERATOR_FINALIZER],
                        "labels": {"app.kubernetes.io/managed-by": "Helm"},
                        "annotations": {"meta.helm.sh/release-name": "metax-operator-1",
                                        "meta.helm.sh/release-namespace": NS}},
           "spec": SPEC}
    ok(cp, "create", "-f", "-", input=json.dumps(old))
    old = get(cp, "clusteroperator", N.OPERATOR_CR_NAME, "-n", NS)
    old_uid = old["metadata"]["uid"]
    # what the older controller applied: the controller's own render, owned by the namespaced CR
    desired = render.desired_objects(render.helm_template(helm, EXTENSIONS, render.chart_values(old["spec"]), NS),
                                     old["spec"], old, namespace=NS)
    objects = [o for objs in desired.values() for o in objs]
    assert any(o["kind"] == "DaemonSet" for o in objects)
    for obj in objects:
        ok(cp, "apply", "--server-side", "--field-manager", N.OPERATOR_FIELD_MANAGER, "-f", "-", input=json.dumps(obj))
    before = {n: (d["metadata"]["uid"], d["metadata"]["generation"]) for n, d in daemonsets(cp).items()}
    assert all(d["metadata"]["ownerReferences"][0]["uid"] == old_uid for d in daemonsets(cp).values())

    # before the upgrade: the older schema prunes a field this release knows (as Helm's update of the
    # CR would have it); the pre-upgrade step gives the namespaced CRD this release's schema, scope kept
    patch = ["patch", "clusteroperator", N.OPERATOR_CR_NAME, "-n", NS, "--type=merge",
             "-p", json.dumps({"spec": {"vfioManager": {"deploy": False}}})]
    pruned = cp.kubectl(*patch)
    assert 'unknown field "spec.vfioManager"' in pruned.stderr, pruned.stderr
    assert "vfioManager" not in get(cp, "clusteroperator", N.OPERATOR_CR_NAME, "-n", NS)["spec"]
    res = run(cp, "--migrate", "--migrate-phase", "pre-upgrade")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert get(cp, "crd", "clusteroperators.gpu.metax-tech.com")["spec"]["scope"] == "Namespaced"
    assert get(cp, "clusteroperator", N.OPERATOR_CR_NAME, "-n", NS)["metadata"]["uid"] == old_uid

    def kept():
        cp.kubectl(*patch)
        return "vfioManager" in get(cp, "clusteroperator", N.OPERATOR_CR_NAME, "-n", NS)["spec"]
    wait_until(kept, 30, "the new schema served")

    res = run(cp, "--migrate", "--migrate-timeout", "120")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]

    crd = get(cp, "crd", "clusteroperators.gpu.metax-tech.com")
    assert crd["spec"]["scope"] == "Cluster"
    # kubectl (and helm) cache discovery on disk for hours: this kubectl saw the CRD namespaced, so
    # until it asks again `get` addresses the CR in a namespace (docs/operator.md: `kubectl api-resources`)
    stale = cp.kubectl("get", "clusteroperator", N.OPERATOR_CR_NAME)
    ok(cp, "api-resources", "--api-group=gpu.metax-tech.com")
    new = get(cp, "clusteroperator", N.OPERATOR_CR_NAME)
    assert new, (stale.stderr, res.stdout[-3000:] + res.stderr[-3000:],
                 cp.kubectl("get", "--raw", "/apis/gpu.metax-tech.com/v1alpha1/clusteroperators").stdout[:300])
    assert "namespace" not in new["metadata"] and new["metadata"]["uid"] != old_uid
    assert new["spec"]["devicePlugin"]["healthyInterval"] == 3
    assert new["spec"]["vfioManager"]["deploy"] is False
    assert new["spec"]["driver"]["upgradePolicy"]["enableRollout"] is False   # the new CRD's defaults
    assert new["metadata"]["annotations"][N.ANNOTATION_OPERATOR_OWNER_ID] == old_uid
    assert new["metadata"]["annotations"]["meta.helm.sh/release-name"] == "metax-operator-1"
    assert new["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "Helm"}
    after = daemonsets(cp)
    assert {n: (d["metadata"]["uid"], d["metadata"]["generation"]) for n, d in after.items()} == before
    assert all(not d["metadata"].get("ownerReferences") for d in after.values())
    assert cp.kubectl("get", "crd", "kopfpeerings.kopf.dev").returncode != 0
    assert not get(cp, "configmap", "clusteroperator-migration", "-n", NS)

    # the new controller adopts them: its ownerReference, the same pod templates
    health, metrics = free_port(), free_port()
    log = open(os.path.join(cp.dir, "controller.log"), "w")
    proc = subprocess.Popen([sys.executable, "-m", MODULE, "--kubeconfig", cp.kubeconfig, "--namespace", NS,
                             "--chart-dir", EXTENSIONS, "--helm", helm, "--crd", CRD, "--health-port", str(health),
                             "--metrics-port", str(metrics), "--log-dir=", "--log-format=text"],
                            stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    try:
        new_uid = new["metadata"]["uid"]
        wait_until(lambda: all((d["metadata"].get("ownerReferences") or [{}])[0].get("uid") == new_uid
                               for d in daemonsets(cp).values()), 60, "the objects adopted by the new CR",
                   diagnose=[lambda: open(os.path.join(cp.dir, "controller.log")).read()[-3000:]])
        adopted = daemonsets(cp)
        assert {n: (d["metadata"]["uid"], d["metadata"]["generation"]) for n, d in adopted.items()} == before
        for d in adopted.values():
            assert d["spec"]["template"]["metadata"]["labels"][N.LABEL_OPERATOR_OWNER] == old_uid
    finally:
        proc.terminate()
        proc.wait(timeout=30)

    res = run(cp, "--migrate", "--migrate-timeout", "30")   # again: nothing to do
    assert res.returncode == 0, res.stderr[-3000:]
    assert get(cp, "clusteroperator", N.OPERATOR_CR_NAME)["metadata"]["uid"] == new["metadata"]["uid"]
