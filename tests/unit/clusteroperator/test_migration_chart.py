# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The chart's migration Job (templates/migration.yaml): rendered only where `lookup` finds an older
install's namespaced CRD or kopf's peering CRD, so `helm template` (no cluster) never shows it; here the
template is rendered from a copy of the chart whose condition is forced, to check what it would create.
The migration itself against a real API server: tests/integration/test_operator_migration_apiserver.py."""

from __future__ import annotations

import shutil
import subprocess

import yaml

from charts.helm import CHARTS, find_helm, helm_required

HELM = find_helm()
pytestmark = helm_required(HELM)
CHART = CHARTS / "metax-operator"
CONDITION = '{{- if or (and $crd (eq (($crd.spec).scope) "Namespaced")) $peering }}'


def render(chart) -> list:
    proc = subprocess.run([HELM, "template", "x", str(chart), "-n", "metax-operator", "--set", "minimal=true",
                           "--show-only", "templates/migration.yaml"], capture_output=True, text=True, timeout=60,
                          check=False)
    if proc.returncode != 0:
        assert "could not find template" in proc.stderr, proc.stderr   # rendered empty
        return []
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def test_helm_template_without_a_cluster_renders_no_migration():
    assert render(CHART) == []


def test_the_forced_migration_is_a_post_upgrade_job_with_rights_of_its_own(tmp_path):
    copy = tmp_path / "metax-operator"
    shutil.copytree(CHART, copy)
    template = copy / "templates" / "migration.yaml"
    text = template.read_text()
    assert CONDITION in text
    template.write_text(text.replace(CONDITION, "{{- if true }}"))
    docs = {(d["kind"], d["metadata"]["name"]): d for d in render(copy)}
    assert set(docs) == {("ServiceAccount", "operator-migration"), ("ClusterRole", "metax-operator-migration"),
                         ("ClusterRoleBinding", "metax-operator-migration"), ("Role", "operator-migration"),
                         ("RoleBinding", "operator-migration"), ("Job", "operator-migration"),
                         ("Job", "operator-migration-schema")}
    hooks = {key: doc["metadata"]["annotations"]["helm.sh/hook"] for key, doc in docs.items()}
    assert hooks.pop(("Job", "operator-migration-schema")) == "pre-upgrade"      # the schema, scope kept
    assert hooks.pop(("Job", "operator-migration")) == "post-install,post-upgrade"  # the scope change
    assert set(hooks.values()) == {"pre-upgrade,post-install,post-upgrade"}         # the rights, for both
    for doc in docs.values():
        annotations = doc["metadata"]["annotations"]
        assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
        # the rights exist before a Job runs
        assert int(annotations.get("helm.sh/hook-weight", "0")) < 0 or doc["kind"] == "Job"
    pod = docs[("Job", "operator-migration")]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "operator-migration"
    assert pod["containers"][0]["args"][:2] == ["--migrate", "--namespace=metax-operator"]
    schema = docs[("Job", "operator-migration-schema")]["spec"]["template"]["spec"]
    assert schema["serviceAccountName"] == "operator-migration"
    assert "--migrate-phase=pre-upgrade" in schema["containers"][0]["args"]
    rules = docs[("ClusterRole", "metax-operator-migration")]["rules"]
    deletes = [r for r in rules if "delete" in r["verbs"] and r["resources"] == ["customresourcedefinitions"]]
    assert deletes and all(r.get("resourceNames") == ["clusteroperators.gpu.metax-tech.com", "kopfpeerings.kopf.dev"]
                           for r in deletes)
    assert not any("*" in r["verbs"] or "*" in r["resources"] for d in docs.values() for r in d.get("rules", []))
    assert not any("secrets" in r["resources"] for d in docs.values() for r in d.get("rules", []))
