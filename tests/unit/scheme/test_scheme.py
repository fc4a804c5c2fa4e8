# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Which scheme is installed, and the refusal of the other one (module_utils/scheme.py)."""

from __future__ import annotations

import pytest

from ansible_collections.metax.gpu.plugins.filter.scheme import FilterModule
from ansible_collections.metax.gpu.plugins.module_utils import names as N
from ansible_collections.metax.gpu.plugins.module_utils.scheme import (
    EXTENSIONS, OPERATOR, chart_name, installed_schemes, releases_of, scheme_refusal)

# rows as `helm list -A -a -o json` prints them
EXT_RELEASE = {"name": "metax-gpu-extensions", "namespace": "metax-gpu", "revision": "1",
               "status": "deployed", "chart": "metax-gpu-extensions-0.1.0", "app_version": "0.1.0"}
OP_RELEASE = {"name": "metax-operator-1764068400", "namespace": "metax-operator", "revision": "1",
              "status": "deployed", "chart": "metax-operator-0.1.0", "app_version": "0.1.0"}
OTHER_RELEASE = {"name": "prometheus", "namespace": "monitoring", "status": "deployed",
                 "chart": "kube-prometheus-stack-65.1.1"}


def daemonset(name, namespace, labels=None, owner=None):
    meta = {"name": name, "namespace": namespace, "labels": labels or {}}
    if owner:
        meta["ownerReferences"] = [{"kind": owner, "name": "cluster-operator"}]
    return {"metadata": meta}


@pytest.mark.parametrize("chart,name", [("metax-operator-0.1.0", "metax-operator"),
                                        ("metax-gpu-extensions-1.2.3-rc.1", "metax-gpu-extensions"),
                                        ("kube-prometheus-stack-65.1.1", "kube-prometheus-stack"),
                                        ("noversion", "noversion")])
def test_chart_name_strips_the_version(chart, name):
    assert chart_name(chart) == name


def test_nothing_installed():
    found = installed_schemes([OTHER_RELEASE], [], [daemonset("node-exporter", "monitoring")])
    assert found == {EXTENSIONS: [], OPERATOR: []}
    assert scheme_refusal(found, EXTENSIONS) == "" and scheme_refusal(found, OPERATOR) == ""


def test_extensions_release_and_its_daemonset():
    ds = daemonset("gpu-device", "metax-gpu", {"app.kubernetes.io/name": "gpu-device",
                                               "app.kubernetes.io/managed-by": "Helm"})
    found = installed_schemes([EXT_RELEASE, OTHER_RELEASE], [], [ds])
    assert found[OPERATOR] == []
    assert found[EXTENSIONS] == ["helm release metax-gpu/metax-gpu-extensions (chart metax-gpu-extensions, deployed)",
                                 "DaemonSet metax-gpu/gpu-device"]
    assert scheme_refusal(found, EXTENSIONS) == ""
    refusal = scheme_refusal(found, OPERATOR)
    assert refusal.startswith("Refusing to install the GPU Operator scheme: the GPU Extensions scheme is installed")
    assert "metax.gpu.uninstall" in refusal and N.RESOURCE_NAME in refusal


def test_operator_found_by_its_cr_or_its_daemonsets_without_a_release():
    cr = {"metadata": {"name": N.OPERATOR_CR_NAME, "namespace": N.OPERATOR_NAMESPACE}}
    owned = daemonset("gpu-device", N.OPERATOR_NAMESPACE,
                      {"app.kubernetes.io/managed-by": N.OPERATOR_FIELD_MANAGER}, owner=N.OPERATOR_KIND)
    real_092 = daemonset("metax-gpu-device", "metax-operator", owner=N.OPERATOR_KIND)
    found = installed_schemes([], [cr], [owned, real_092])
    assert found[EXTENSIONS] == []
    assert found[OPERATOR] == ["ClusterOperator metax-operator/cluster-operator",
                               "DaemonSet metax-operator/gpu-device", "DaemonSet metax-operator/metax-gpu-device"]
    refusal = scheme_refusal(found, EXTENSIONS)
    assert "the GPU Operator scheme is installed" in refusal
    assert "helm list -q -f metax -n metax-operator" in refusal   # the manual's 3.2.5 step


def test_operator_owner_label_alone_marks_a_daemonset_as_the_operators():
    ds = daemonset("gpu-device", "x", {N.LABEL_OPERATOR_OWNER: "uid"})
    assert installed_schemes([], [], [ds])[OPERATOR] == ["DaemonSet x/gpu-device"]


def test_both_installed_refuses_both():
    found = installed_schemes([EXT_RELEASE, OP_RELEASE], [], [])
    assert "GPU Operator scheme is installed" in scheme_refusal(found, EXTENSIONS)
    assert "GPU Extensions scheme is installed" in scheme_refusal(found, OPERATOR)


def test_unknown_scheme_is_refused():
    assert "unknown scheme" in scheme_refusal({EXTENSIONS: [], OPERATOR: []}, "both")


def test_releases_of_a_scheme_in_a_namespace():
    rows = [EXT_RELEASE, OP_RELEASE, OTHER_RELEASE, dict(OP_RELEASE, name="metax-operator-1", namespace="other")]
    assert releases_of(rows, OPERATOR, N.OPERATOR_NAMESPACE) == ["metax-operator-1764068400"]
    assert releases_of(rows, OPERATOR) == ["metax-operator-1", "metax-operator-1764068400"]
    assert releases_of(rows, EXTENSIONS) == ["metax-gpu-extensions"]
    assert releases_of(None, EXTENSIONS) == []


def test_filters_are_exposed():
    assert set(FilterModule().filters()) == {"installed_schemes", "scheme_refusal", "scheme_releases"}


def test_release_rows_of_any_shape_are_read_as_text_and_only_our_charts_count():
    """metax.gpu.installed_scheme takes the rows in its ``releases`` option: whatever a caller passes (keys
    missing, numbers, nulls, a path-looking chart, an oversized name) is text in a message, never a traceback."""
    rows = [{}, {"name": None, "chart": 7}, {"chart": "../../etc/passwd-1.0"}, {"chart": "--set=x-1.0"},
            {"name": "x" * 5000, "namespace": "a\nb", "chart": "metax-operator-0.1.0", "status": None},
            dict(OTHER_RELEASE, chart="metax-gpu-extensions-evil-1.0")]
    found = installed_schemes(rows, [], [])
    assert found[EXTENSIONS] == []
    assert found[OPERATOR] == ["helm release a\nb/%s (chart metax-operator, None)" % ("x" * 5000)]
    assert scheme_refusal(found, EXTENSIONS).startswith("Refusing to install the GPU Extensions scheme")
