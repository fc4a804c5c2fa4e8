# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The charts' node-agent ValidatingAdmissionPolicy, rendered for a test namespace and applied to the local cluster.

Both charts ship it (issue 30): the GPU Extensions chart (``CHART``, the
default) and the GPU Operator chart (``OPERATOR_CHART``).

Rendered by the real chart with the capabilities this cluster's discovery
reports (what `helm install` gives the chart's "auto" check), so the agents
under test run under exactly the policy an installation gets. Not `helm
template --validate`: it refuses objects that exist outside a release (the
installed release's ClusterRoles, the policy applied by an earlier module). The policy is
named after the namespace and matches only that namespace's agent service
accounts, so it never touches an installed release.
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any, Dict, List, Sequence

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHART = os.path.join(REPO, "files", "charts", "metax-gpu-extensions")
OPERATOR_CHART = os.path.join(REPO, "files", "charts", "metax-operator")
POLICY_TEMPLATE = "templates/node-agent-policy.yaml"
KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")


def policy_name(namespace: str) -> str:
    return "%s-node-agents" % namespace


def pods_policy_name(namespace: str) -> str:
    """The policy on the pods the node agents delete (their own node's only)."""
    return policy_name(namespace) + "-pods"


def capabilities(cluster) -> List[str]:
    """helm flags for the server's version and, when served, the v1 ValidatingAdmissionPolicy kind."""
    res = cluster.kubectl("version", "-o", "json")
    assert res.returncode == 0, res.stderr
    flags = ["--kube-version", json.loads(res.stdout)["serverVersion"]["gitVersion"]]
    res = cluster.kubectl("get", "--raw", "/apis/admissionregistration.k8s.io/v1")
    assert res.returncode == 0, res.stderr
    if any(r["kind"] == "ValidatingAdmissionPolicy" for r in json.loads(res.stdout)["resources"]):
        flags += ["--api-versions", "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"]
    return flags


def render(cluster, namespace: str, show_only: str = POLICY_TEMPLATE, chart: str = CHART,
           sets: Sequence[str] = ()) -> List[Dict[str, Any]]:
    """The chart's objects of one template for ``namespace``, with the cluster's capabilities (and ``--set`` pairs)."""
    helm = cluster.helm or "helm"
    if chart == OPERATOR_CHART and not any(pair.startswith(("minimal=", "driver.", "maca.")) for pair in sets):
        sets = tuple(sets) + ("minimal=true",)   # the chain's payloads are not the point of a policy render
    proc = subprocess.run([helm, "template", "policy-it", chart, "--namespace", namespace,
                           "--show-only", show_only] + [a for pair in sets for a in ("--set", pair)]
                          + capabilities(cluster),
                          env=cluster.env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, "helm template failed:\n%s" % proc.stderr
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def apply(cluster, objects: List[Dict[str, Any]]) -> None:
    res = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objects))
    assert res.returncode == 0, res.stderr


def apply_policy(cluster, namespace: str, chart: str = CHART, sets: Sequence[str] = ()) -> List[Dict[str, Any]]:
    """Render and apply the policies and bindings for ``namespace`` (the node policy, and the one on the pods the
    agents delete); returns them (the capability check must pass)."""
    objects = render(cluster, namespace, chart=chart, sets=sets)
    kinds = sorted(o["kind"] for o in objects)
    # the node policy, the pods-delete policy, and (where gpu-dra may run) the ResourceSlice policy
    assert kinds in (sorted(KINDS * 2), sorted(KINDS * 3)), (
        "the chart did not render the policy on this cluster (its auto capability check failed): %s" % kinds)
    apply(cluster, objects)
    return objects
