# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The node-agent ValidatingAdmissionPolicy on the real apiserver (issue 30), for both schemes.

Each scheme's policy, service accounts and RBAC are applied for a test
namespace:

- ``extensions``: the GPU Extensions chart's policy and its ``rbac.yaml``;
- ``operator``: the GPU Operator chart's policy, and the agents' service
  accounts and RBAC as the operator-controller creates them (its own
  rendering code, module_utils/clusteroperator/render.py, from the CR the
  operator chart creates), so the binding is tested against the service
  accounts the operator's agents really run as.

For each agent a pod is put on two nodes, and the agent's own
service-account token is issued bound to one of them (`kubectl create token
--bound-object-kind Pod`), so the apiserver sees the node's name in
``authentication.kubernetes.io/node-name`` as it does for the agent's pod.
With those tokens: the agent's own keys on its own node are written; another
node, a label outside metax-tech.com/, another agent's key, a key no agent
owns (a day-two label, the readiness labels the operator-controller sets),
spec.unschedulable, a taint and a token naming no node are each refused
with a message naming the policy and the reason, and leave the node as it was.
"""

from __future__ import annotations

import json
import os
import sys
import uuid

import pytest

pytestmark = pytest.mark.cluster

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from node_policy import CHART, OPERATOR_CHART, apply, apply_policy, policy_name, render  # noqa: E402
from polling import wait_until  # noqa: E402

# scheme -> (test namespace, chart whose policy is applied)
SCHEMES = {"extensions": ("metax-gpu-policy-it", CHART), "operator": ("metax-operator-policy-it", OPERATOR_CHART)}
AGENTS = ("gpu-device", "gpu-label")
P = "metax-tech.com/"
OWN = {"gpu-label": ("labels", P + "gpu.product"), "gpu-device": ("annotations", P + "gpu.devices")}
# keys the denial tests try to write; removed again (as admin) whatever happens
PROBE_KEYS = {"labels": ["topology.kubernetes.io/zone", "node-role.kubernetes.io/gpu", P + "gpu.product",
                         P + "driver.upgrade-state", P + "runtime.ready", P + "maca.ready"],
              "annotations": [P + "gpu.devices", "example.com/note"]}


def _operator_agents(cluster, namespace):
    """The agents' ServiceAccounts and RBAC as the operator-controller applies them for the operator chart's CR."""
    from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator import render as operator_render

    cr = render(cluster, namespace, show_only="templates/clusteroperator.yaml", chart=OPERATOR_CHART)[0]
    owner = {"metadata": dict(cr["metadata"], uid="policy-it")}
    rendered = operator_render.helm_template(cluster.helm or "helm", CHART, operator_render.chart_values(cr["spec"]),
                                             namespace)
    out = []
    for objects in operator_render.desired_objects(rendered, cr["spec"], owner).values():
        for obj in objects:
            if obj["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding"):
                # no CR owns them here: without this the garbage collector would delete them
                obj["metadata"].pop("ownerReferences", None)
                out.append(obj)
    assert sorted(o["metadata"]["name"] for o in out if o["kind"] == "ServiceAccount") == list(AGENTS), out
    return out


def _rbac_for(cluster, scheme, namespace):
    """The scheme's agent service accounts and node RBAC, cluster-scoped names prefixed so no release is touched."""
    if scheme == "operator":
        objects = _operator_agents(cluster, namespace)
    else:
        objects = render(cluster, namespace, show_only="templates/rbac.yaml")
    out = []
    for obj in objects:
        if obj["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            obj["metadata"]["name"] = "%s-%s" % (namespace, obj["metadata"]["name"])
            if obj["kind"] == "ClusterRoleBinding":
                obj["roleRef"]["name"] = "%s-%s" % (namespace, obj["roleRef"]["name"])
        out.append(obj)
    return out


class Tokens:
    """API clients authenticated as an agent's service account, bound to its pod on a given node."""

    def __init__(self, cluster, namespace):
        from kubernetes import client

        self.cluster = cluster
        self.namespace = namespace
        self.policy = policy_name(namespace)
        self.admin = client.CoreV1Api(cluster.api_client())
        self.nodes = [n["name"] for n in cluster.nodes] or [cluster.node_name]
        assert len(self.nodes) >= 2, "the policy tests need two nodes (the test session brings up three)"
        self.nodes = self.nodes[:2]
        self.pods = {}
        self._clients = {}

    def place_pods(self):
        """One pause pod per agent and node, put on the node directly (no scheduling needed to bind a token)."""
        image = self.cluster.info["METAX_PAUSE_IMAGE"]
        for agent in AGENTS:
            for node in self.nodes:
                name = "%s-%s-%s" % (agent, node, uuid.uuid4().hex[:5])
                self.admin.create_namespaced_pod(self.namespace, {
                    "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                    "spec": {"nodeName": node, "serviceAccountName": agent,
                             "tolerations": [{"operator": "Exists"}], "terminationGracePeriodSeconds": 0,
                             "containers": [{"name": "pause", "image": image, "imagePullPolicy": "IfNotPresent"}]}})
                self.pods[(agent, node)] = name

    def token(self, agent, node=None):
        args = ["-n", self.namespace, "create", "token", agent, "--duration", "10m"]
        if node is not None:
            args += ["--bound-object-kind", "Pod", "--bound-object-name", self.pods[(agent, node)]]
        res = self.cluster.kubectl(*args)
        assert res.returncode == 0, res.stderr
        return res.stdout.strip()

    def client(self, agent, node=None):
        """CoreV1Api with only the token: the admin kubeconfig's server and CA, not its client certificate."""
        from kubernetes import client, config

        if (agent, node) not in self._clients:
            cfg = client.Configuration()
            config.load_kube_config(config_file=self.cluster.kubeconfig, client_configuration=cfg)
            cfg.cert_file = cfg.key_file = None
            cfg.api_key = {"authorization": "Bearer " + self.token(agent, node)}
            self._clients[(agent, node)] = client.ApiClient(cfg)
        return self._clients[(agent, node)]

    def patch(self, agent, node, target, body):
        """(HTTP status, message) of a merge patch of Node ``target`` as ``agent`` bound to ``node``."""
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        try:
            client.CoreV1Api(self.client(agent, node)).patch_node(
                target, body, _content_type="application/merge-patch+json")
        except ApiException as exc:
            try:
                return exc.status, json.loads(exc.body)["message"]
            except (TypeError, ValueError, KeyError):
                return exc.status, str(exc.body)
        return 200, ""

    def metadata(self, node):
        meta = self.admin.read_node(node).metadata
        return {"labels": dict(meta.labels or {}), "annotations": dict(meta.annotations or {})}

    def node_spec(self, node):
        return self.admin.read_node(node).spec.to_dict()


@pytest.fixture(scope="module", params=sorted(SCHEMES))
def tokens(request, cluster):
    scheme = request.param
    namespace, chart = SCHEMES[scheme]
    t = Tokens(cluster, namespace)
    before = {n: t.metadata(n) for n in t.nodes}
    specs = {n: t.node_spec(n) for n in t.nodes}
    rbac = _rbac_for(cluster, scheme, namespace)
    cluster.kubectl("create", "namespace", namespace)
    apply(cluster, rbac)
    apply_policy(cluster, namespace, chart=chart)
    try:
        t.place_pods()

        # the admission plugin picks the policy up from its informer: wait until it denies
        # (a new value each time: a patch that changes nothing is no change to refuse)
        def active():
            status, message = t.patch("gpu-label", t.nodes[0], t.nodes[0],
                                      {"metadata": {"labels": {"example.com/policy-probe": uuid.uuid4().hex}}})
            return status == 403 and t.policy in message
        wait_until(active, 60, "the policy %s to be in force" % t.policy)
        yield t
    finally:
        for node in t.nodes:
            restore = {field: {k: before[node][field].get(k) for k in keys + ["example.com/policy-probe"]}
                       for field, keys in PROBE_KEYS.items()}
            t.admin.patch_node(node, {"metadata": restore}, _content_type="application/merge-patch+json")
            if t.node_spec(node).get("unschedulable") != specs[node].get("unschedulable"):
                t.admin.patch_node(node, {"spec": {"unschedulable": specs[node].get("unschedulable")}})
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", "--ignore-not-found")
        cluster.kubectl("delete", "validatingadmissionpolicybinding,validatingadmissionpolicy", t.policy,
                        t.policy + "-pods", "--ignore-not-found")
        for obj in rbac:
            if obj["kind"] in ("ClusterRole", "ClusterRoleBinding"):
                cluster.kubectl("delete", obj["kind"].lower(), obj["metadata"]["name"], "--ignore-not-found")


def assert_denied(tokens, result, *reasons):
    status, message = result
    assert status == 403, "expected a denial, got HTTP %s %s" % (status, message)
    # the apiserver names the policy and binding; the policy's message says why
    policy = tokens.policy
    assert "ValidatingAdmissionPolicy '%s' with binding '%s' denied request" % (policy, policy) in message, message
    for reason in reasons:
        assert reason in message, message


def test_policy_type_checks(cluster, tokens):
    """The apiserver type-checked every CEL expression of the policy without a warning."""
    def checked():
        res = cluster.kubectl("get", "validatingadmissionpolicy", tokens.policy, "-o", "json")
        obj = json.loads(res.stdout)
        status = obj.get("status") or {}
        return obj if status.get("observedGeneration") == obj["metadata"]["generation"] else None
    wait_until(checked, 30, "the policy's type check")
    status = checked()["status"]
    assert not (status.get("typeChecking") or {}).get("expressionWarnings"), status


def test_the_bound_token_names_the_pods_node(tokens):
    from kubernetes import client

    node = tokens.nodes[1]
    review = client.AuthenticationV1Api(tokens.client("gpu-label", node)).create_self_subject_review(
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    info = review.status.user_info
    assert info.username == "system:serviceaccount:%s:gpu-label" % tokens.namespace
    assert info.extra["authentication.kubernetes.io/node-name"] == [node]


@pytest.mark.parametrize("agent", AGENTS)
def test_own_keys_on_own_node_are_allowed(tokens, agent):
    node = tokens.nodes[1]
    field, key = OWN[agent]
    original = tokens.metadata(node)[field].get(key)
    assert tokens.patch(agent, node, node, {"metadata": {field: {key: "policy-test"}}}) == (200, "")
    assert tokens.metadata(node)[field][key] == "policy-test"
    # removing and putting back: both changes of its own key
    assert tokens.patch(agent, node, node, {"metadata": {field: {key: None}}}) == (200, "")
    assert key not in tokens.metadata(node)[field]
    if original is not None:
        assert tokens.patch(agent, node, node, {"metadata": {field: {key: original}}}) == (200, "")


@pytest.mark.parametrize("agent", AGENTS)
def test_another_node_is_denied(tokens, agent):
    mine, other = tokens.nodes
    field, key = OWN[agent]
    before = tokens.metadata(other)[field].get(key)
    result = tokens.patch(agent, mine, other, {"metadata": {field: {key: "policy-test"}}})
    assert_denied(tokens, result, "%s may change only its own node %s, not node %s" % (agent, mine, other))
    assert tokens.metadata(other)[field].get(key) == before


@pytest.mark.parametrize("agent, field, key", [
    ("gpu-label", "labels", "topology.kubernetes.io/zone"),
    ("gpu-label", "labels", "node-role.kubernetes.io/gpu"),
    ("gpu-device", "labels", "topology.kubernetes.io/zone"),
    ("gpu-device", "annotations", "example.com/note"),
])
def test_a_key_outside_our_domain_is_denied(tokens, agent, field, key):
    node = tokens.nodes[0]
    result = tokens.patch(agent, node, node, {"metadata": {field: {key: "policy-test"}}})
    assert_denied(tokens, result, "%s may change only metax-tech.com/ %s, not %s" % (agent, field, key))
    assert key not in tokens.metadata(node)[field]


@pytest.mark.parametrize("agent, field, key, owner", [
    ("gpu-label", "annotations", P + "gpu.devices", "is owned by gpu-device"),
    ("gpu-device", "labels", P + "gpu.product", "is owned by gpu-label"),
    # driver-manager reports its node's rolling upgrade (issue 25); the other agents may not
    ("gpu-label", "labels", P + "driver.upgrade-state", "is owned by driver-manager"),
    # the operator-controller's readiness chain: an agent faking it would start gpu-device too early
    ("gpu-label", "labels", P + "runtime.ready", "is owned by no node agent"),
    ("gpu-device", "labels", P + "maca.ready", "is owned by no node agent"),
])
def test_a_key_the_agent_does_not_own_is_denied(tokens, agent, field, key, owner):
    node = tokens.nodes[0]
    before = tokens.metadata(node)[field].get(key)
    result = tokens.patch(agent, node, node, {"metadata": {field: {key: "policy-test"}}})
    assert_denied(tokens, result, "%s may change only the %s it owns: %s %s" % (agent, field, key, owner))
    assert tokens.metadata(node)[field].get(key) == before


@pytest.mark.parametrize("agent", AGENTS)
@pytest.mark.parametrize("spec", [{"unschedulable": True},
                                  {"taints": [{"key": P + "policy-test", "effect": "NoSchedule"}]}],
                         ids=["unschedulable", "taint"])
def test_the_node_spec_is_denied(tokens, agent, spec):
    node = tokens.nodes[0]
    before = tokens.node_spec(node)
    result = tokens.patch(agent, node, node, {"spec": spec})
    assert_denied(tokens, result, "%s may not change the spec of node %s (taints, unschedulable" % (agent, node))
    assert tokens.node_spec(node) == before


def test_own_key_with_a_foreign_one_is_denied_as_a_whole(tokens):
    node = tokens.nodes[0]
    before = tokens.metadata(node)["labels"]
    result = tokens.patch("gpu-label", node, node, {"metadata": {"labels": {
        P + "gpu.product": "policy-test", "topology.kubernetes.io/zone": "policy-test"}}})
    assert_denied(tokens, result, "not topology.kubernetes.io/zone")
    assert tokens.metadata(node)["labels"].get(P + "gpu.product") == before.get(P + "gpu.product")


@pytest.mark.parametrize("agent", AGENTS)
def test_a_token_naming_no_node_is_denied(tokens, agent):
    node = tokens.nodes[0]
    field, key = OWN[agent]
    result = tokens.patch(agent, None, node, {"metadata": {field: {key: "policy-test"}}})
    assert_denied(tokens, result, "%s may change only the node its pod runs on, and this token names no node" % agent)


def test_others_are_not_affected(tokens):
    """The administrator (and so the kubelet, controllers, day-two playbooks) is outside the policy."""
    node = tokens.nodes[0]
    tokens.admin.patch_node(node, {"metadata": {"labels": {"example.com/policy-probe": "admin"}}},
                            _content_type="application/merge-patch+json")
    assert tokens.metadata(node)["labels"]["example.com/policy-probe"] == "admin"
    tokens.admin.patch_node(node, {"metadata": {"labels": {"example.com/policy-probe": None}}},
                            _content_type="application/merge-patch+json")
    assert "example.com/policy-probe" not in tokens.metadata(node)["labels"]
