# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Which of the manual's two schemes is installed on a cluster, and whether another may be.

GPU Extensions (manual section 2) and GPU Operator (section 3) both run a
device plugin that registers metax-tech.com/gpu on every GPU node; two of them
on one node fight over the resource, so installing one scheme where the other
is found is refused. Pure functions over what the playbooks read from the
cluster: `helm list -A -o json`, the ClusterOperator objects and the
DaemonSets (module metax.gpu.installed_scheme reads the last two in one run);
the roles also call them as filters (plugins/filter/scheme.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional

from ansible_collections.metax.gpu.plugins.module_utils import names as N

EXTENSIONS = "extensions"
OPERATOR = "operator"
SCHEMES = (EXTENSIONS, OPERATOR)

# The chart of each scheme: the same names as MetaX's own package (the manual's oci:// references).
CHARTS = {
    EXTENSIONS: (N.EXTENSIONS_CHART,),
    OPERATOR: (N.OPERATOR_CHART,),
}
DEVICE_PLUGIN_NAMES = N.DEVICE_PLUGIN_DAEMONSETS

# What the administrator runs to remove each scheme (named in the refusal).
UNINSTALL_STEP = {
    EXTENSIONS: "ansible-playbook metax.gpu.uninstall (or: helm uninstall RELEASE -n NAMESPACE --wait)",
    OPERATOR: ("ansible-playbook metax.gpu.uninstall (or the manual's section 3.2.5: "
               "helm uninstall $(helm list -q -f metax -n {0}) -n {0} --wait)".format(N.OPERATOR_NAMESPACE)),
}
TITLE = {EXTENSIONS: "GPU Extensions", OPERATOR: "GPU Operator"}


@dataclass(frozen=True)
class Release:
    """One row of `helm list -A -o json`."""

    name: str
    namespace: str
    chart: str      # the chart's name, version stripped
    status: str


def chart_name(chart: str) -> str:
    """`metax-operator-0.1.0` -> `metax-operator` (helm list prints the chart as NAME-VERSION)."""
    parts = chart.split("-")
    for i in range(len(parts) - 1, 0, -1):
        if parts[i][:1].isdigit():
            return "-".join(parts[:i])
    return chart


def parse_releases(rows: Iterable[Mapping[str, Any]]) -> List[Release]:
    return [Release(name=str(r.get("name", "")), namespace=str(r.get("namespace", "")),
                    chart=chart_name(str(r.get("chart", ""))), status=str(r.get("status", "")))
            for r in rows or []]


def scheme_of_chart(chart: str) -> Optional[str]:
    for scheme, charts in CHARTS.items():
        if chart in charts:
            return scheme
    return None


def releases_of(rows: Iterable[Mapping[str, Any]], scheme: str, namespace: Optional[str] = None) -> List[str]:
    """Names of the helm releases of SCHEME (in NAMESPACE when given), sorted."""
    return sorted(r.name for r in parse_releases(rows)
                  if scheme_of_chart(r.chart) == scheme and (namespace is None or r.namespace == namespace))


def _owned_by_operator(meta: Mapping[str, Any]) -> bool:
    labels = meta.get("labels") or {}
    if labels.get("app.kubernetes.io/managed-by") == N.OPERATOR_FIELD_MANAGER:
        return True
    if N.LABEL_OPERATOR_OWNER in labels:
        return True
    return any(ref.get("kind") == N.OPERATOR_KIND for ref in meta.get("ownerReferences") or [])


def installed_schemes(releases: Iterable[Mapping[str, Any]], cluster_operators: Iterable[Mapping[str, Any]],
                      daemonsets: Iterable[Mapping[str, Any]]) -> Dict[str, List[str]]:
    """Scheme -> what on the cluster shows it is installed (empty lists when not)."""
    found: Dict[str, List[str]] = {scheme: [] for scheme in SCHEMES}
    for release in parse_releases(releases):
        scheme = scheme_of_chart(release.chart)
        if scheme:
            found[scheme].append("helm release %s/%s (chart %s, %s)"
                                 % (release.namespace, release.name, release.chart, release.status))
    for obj in cluster_operators or []:
        meta = obj.get("metadata") or {}
        found[OPERATOR].append("%s %s/%s" % (N.OPERATOR_KIND, meta.get("namespace", ""), meta.get("name", "")))
    for obj in daemonsets or []:
        meta = obj.get("metadata") or {}
        labels = meta.get("labels") or {}
        name = meta.get("name", "")
        if name not in DEVICE_PLUGIN_NAMES and labels.get("app.kubernetes.io/name") not in DEVICE_PLUGIN_NAMES:
            continue
        scheme = OPERATOR if _owned_by_operator(meta) else EXTENSIONS
        found[scheme].append("DaemonSet %s/%s" % (meta.get("namespace", ""), name))
    return found


def scheme_refusal(found: Mapping[str, List[str]], wanted: str) -> str:
    """Why WANTED may not be installed ("" when it may): another scheme is found."""
    if wanted not in SCHEMES:
        return "unknown scheme %r: choose one of %s" % (wanted, ", ".join(SCHEMES))
    others = [s for s in SCHEMES if s != wanted and found.get(s)]
    if not others:
        return ""
    other = others[0]
    return ("Refusing to install the %s scheme: the %s scheme is installed (%s). Two device plugins must never "
            "register %s on one node: remove it first with %s, then run this again."
            % (TITLE[wanted], TITLE[other], "; ".join(found[other]), N.RESOURCE_NAME, UNINSTALL_STEP[other]))
