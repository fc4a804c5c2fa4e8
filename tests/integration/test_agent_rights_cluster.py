# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Rights that fit the job, on the real apiserver with the agents' own tokens (issue 39, finding 11).

- driver-manager, as the GPU Extensions chart runs it (``driverManager.enabled``:
  its ServiceAccount and RBAC from templates/metax-driver.yaml, the chart's
  admission policies): the pods it deletes are its own node's. A token bound
  to its pod on one node deletes a pod on that node (dry run) and is refused a
  pod on the other node, and a token naming no node is refused; its node patch
  is under the chart's node policy.
- operator-controller, with the operator chart's ClusterRole: get, patch and
  delete of ClusterRoles and ClusterRoleBindings reach only the agents' names
  (dry-run patches and deletes of another role are refused by RBAC).

Cluster-scoped names are prefixed with the test namespace, so no release is touched.
"""

from __future__ import annotations

import json
import os
import sys
import uuid

import pytest

pytestmark = pytest.mark.cluster

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from node_policy import OPERATOR_CHART, apply, apply_policy, policy_name, pods_policy_name, render  # noqa: E402
from polling import wait_until  # noqa: E402

NAMESPACE = "metax-rights-it"
DRIVER_MANAGER = ["driverManager.enabled=true", "driverManager.payload.version=2.14.3"]
RBAC_KINDS = ("ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")


def _prefixed(objects, namespace):
    """Cluster-scoped RBAC renamed ``<namespace>-<name>`` (and the bindings' roleRefs to ClusterRoles)."""
    out = []
    for obj in objects:
        if obj["kind"] not in RBAC_KINDS:
            continue
        if obj["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            obj["metadata"]["name"] = "%s-%s" % (namespace, obj["metadata"]["name"])
        if obj["kind"] in ("ClusterRoleBinding", "RoleBinding") and obj["roleRef"]["kind"] == "ClusterRole":
            obj["roleRef"]["name"] = "%s-%s" % (namespace, obj["roleRef"]["name"])
        out.append(obj)
    return out


def _status(call, *args, **kwargs):
    """(HTTP status, message) of an API call."""
    from kubernetes.client.rest import ApiException

    try:
        call(*args, **kwargs)
    except ApiException as exc:
        try:
            return exc.status, json.loads(exc.body)["message"]
        except (TypeError, ValueError, KeyError):
            return exc.status, str(exc.body)
    return 200, ""


class Rights:
    def __init__(self, cluster, namespace):
        from kubernetes import client

        self.cluster = cluster
        self.namespace = namespace
        self.admin = client.CoreV1Api(cluster.api_client())
        nodes = [n["name"] for n in cluster.nodes] or [cluster.node_name]
        assert len(nodes) >= 2, "these tests need two nodes (the test session brings up three)"
        self.nodes = nodes[:2]
        self.pods = {}
        self._clients = {}

    def place(self, name, node, service_account="default"):
        image = self.cluster.info["METAX_PAUSE_IMAGE"]
        pod = "%s-%s" % (name, uuid.uuid4().hex[:5])
        self.admin.create_namespaced_pod(self.namespace, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod, "labels": {"app": name}},
            "spec": {"nodeName": node, "serviceAccountName": service_account,
                     "tolerations": [{"operator": "Exists"}], "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "pause", "image": image, "imagePullPolicy": "IfNotPresent"}]}})
        self.pods[(name, node)] = pod
        return pod

    def client(self, account, node=None):
        """An ApiClient with only ``account``'s token, bound to its pod on ``node`` (None: bound to nothing)."""
        from kubernetes import client, config

        if (account, node) not in self._clients:
            args = ["-n", self.namespace, "create", "token", account, "--duration", "10m"]
            if node is not None:
                args += ["--bound-object-kind", "Pod", "--bound-object-name", self.pods[(account, node)]]
            res = self.cluster.kubectl(*args)
            assert res.returncode == 0, res.stderr
            cfg = client.Configuration()
            config.load_kube_config(config_file=self.cluster.kubeconfig, client_configuration=cfg)
            cfg.cert_file = cfg.key_file = None
            cfg.api_key = {"authorization": "Bearer " + res.stdout.strip()}
            self._clients[(account, node)] = client.ApiClient(cfg)
        return self._clients[(account, node)]

    def delete_pod(self, account, node, pod, dry_run=True):
        from kubernetes import client

        kwargs = {"dry_run": "All"} if dry_run else {}
        return _status(client.CoreV1Api(self.client(account, node)).delete_namespaced_pod, pod, self.namespace,
                       **kwargs)


@pytest.fixture(scope="module")
def rights(cluster):
    namespace = NAMESPACE
    r = Rights(cluster, namespace)
    rbac = _prefixed(render(cluster, namespace, show_only="templates/metax-driver.yaml", sets=DRIVER_MANAGER),
                     namespace)
    assert {(o["kind"], o["metadata"]["name"]) for o in rbac if o["kind"] == "ServiceAccount"} == {
        ("ServiceAccount", "driver-manager")}
    controller = [o for o in render(cluster, namespace, show_only="templates/rbac.yaml", chart=OPERATOR_CHART,
                                    # the RBAC alone: the chain's payloads are not the point
                                    sets=("minimal=true",))
                  if o["kind"] in ("ClusterRole", "ClusterRoleBinding")
                  and o["metadata"]["name"] == "metax-operator-controller"]
    assert len(controller) == 2
    controller = _prefixed(controller, namespace)
    cluster.kubectl("create", "namespace", namespace)
    cluster.kubectl("-n", namespace, "create", "serviceaccount", "operator-controller")
    apply(cluster, rbac + controller)
    apply_policy(cluster, namespace, sets=DRIVER_MANAGER)
    try:
        wait_until(lambda: cluster.kubectl("-n", namespace, "get", "serviceaccount", "default").returncode == 0, 60,
                   "the namespace's default service account")
        for node in r.nodes:
            r.place("driver-manager", node, "driver-manager")     # the agent's pods: their tokens name the node
            r.place("victim", node)                               # a pod on each node for it to delete

        def active():
            status, message = r.delete_pod("driver-manager", r.nodes[0], r.pods[("victim", r.nodes[1])])
            return status == 403 and pods_policy_name(namespace) in message
        wait_until(active, 60, "the policy %s to be in force" % pods_policy_name(namespace))
        yield r
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", "--ignore-not-found")
        cluster.kubectl("delete", "validatingadmissionpolicybinding,validatingadmissionpolicy",
                        policy_name(namespace), pods_policy_name(namespace), "--ignore-not-found")
        for obj in rbac + controller:
            if obj["kind"] in ("ClusterRole", "ClusterRoleBinding"):
                cluster.kubectl("delete", obj["kind"].lower(), obj["metadata"]["name"], "--ignore-not-found")


def test_driver_manager_deletes_a_pod_of_its_own_node(rights):
    mine = rights.nodes[0]
    assert rights.delete_pod("driver-manager", mine, rights.pods[("victim", mine)]) == (200, "")


def test_driver_manager_may_not_delete_a_pod_of_another_node(rights):
    mine, other = rights.nodes
    status, message = rights.delete_pod("driver-manager", mine, rights.pods[("victim", other)], dry_run=False)
    assert status == 403, message
    policy = pods_policy_name(rights.namespace)
    assert "ValidatingAdmissionPolicy '%s' with binding '%s' denied request" % (policy, policy) in message
    assert "driver-manager may delete only pods of its own node %s, not a pod of node %s" % (mine, other) in message
    assert rights.admin.read_namespaced_pod(rights.pods[("victim", other)], rights.namespace).metadata.deletion_timestamp \
        is None


def test_a_driver_manager_token_naming_no_node_deletes_nothing(rights):
    status, message = rights.delete_pod("driver-manager", None, rights.pods[("victim", rights.nodes[0])])
    assert status == 403 and "this token names no node" in message, message


def test_driver_manager_node_patch_is_under_the_charts_policy(rights):
    """The Extensions chart with driverManager.enabled: its node patch is confined like the other agents'."""
    from kubernetes import client

    mine, other = rights.nodes
    api = client.CoreV1Api(rights.client("driver-manager", mine))
    status, message = _status(api.patch_node, other, {"metadata": {"labels": {
        "metax-tech.com/driver.upgrade-state": "policy-test"}}}, _content_type="application/merge-patch+json")
    assert status == 403 and policy_name(rights.namespace) in message, message
    assert "driver-manager may change only its own node %s, not node %s" % (mine, other) in message


@pytest.mark.parametrize("kind", ["cluster_role", "cluster_role_binding"])
def test_operator_controller_reaches_only_the_agents_cluster_rbac(rights, kind):
    from kubernetes import client

    rbac = client.RbacAuthorizationV1Api(rights.client("operator-controller"))
    patch, delete, read = (getattr(rbac, "%s_%s" % (verb, kind)) for verb in ("patch", "delete", "read"))
    foreign = "cluster-admin"          # a ClusterRole and a ClusterRoleBinding of every cluster
    body = {"metadata": {"labels": {"example.com/rights-probe": "x"}}}
    for call, args in ((patch, (foreign, body)), (delete, (foreign,)), (read, (foreign,))):
        kwargs = {} if call is read else {"dry_run": "All"}
        status, message = _status(call, *args, **kwargs)
        assert status == 403 and "forbidden" in message.lower(), (call, message)
    # an agent's own name is within the rule: not refused by RBAC (404: not installed in this test)
    status, message = _status(read, "metax-gpu-gpu-device")
    assert status in (200, 404), message
