# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""driver-manager's evictions and pod reads are confined to its own node, on the real apiserver with its own tokens
(issue 39, deliverable 7).

- Its RBAC as the GPU Extensions chart renders it (templates/metax-driver.yaml,
  ``driverManager.enabled``): pods/eviction create, no pods list or watch
  outside its namespace (it learns its node's GPU pods from the kubelet).
- The eviction guard: the chart's own ValidatingWebhookConfiguration
  (templates/eviction-guard.yaml: rules, matchConditions, failurePolicy) with
  its clientConfig pointed at the guard served by this test process
  (plugins/module_utils/eviction_webhook.py, the server the chart's Deployment
  and the operator-controller run), with the certificate made here; the guard
  reads pods with its own service account's token (the chart's ClusterRole:
  pods get).

A token bound to driver-manager's pod on node A evicts a pod on A and is
refused a pod on node B; a token naming no node is refused; an administrator's
eviction is not the guard's business. driver-manager's own eviction code
(``Kube.evict_gpu_pods``) goes through the guard the same way.

Cluster-scoped names are prefixed with (or named after) the test namespace, so no release is touched.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from urllib.parse import urlparse

import pytest

pytestmark = pytest.mark.cluster

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from node_policy import render  # noqa: E402
from polling import wait_until  # noqa: E402
from test_agent_rights_cluster import DRIVER_MANAGER, Rights, _prefixed, _status  # noqa: E402

NAMESPACE = "metax-evict-it"
GUARD = "metax-eviction-guard"
GUARD_SETS = DRIVER_MANAGER + ["nodeAgentPolicy.enabled=true"]
WEBHOOK = "eviction-guard.gpu.metax-tech.com"


def _eviction(name, namespace, dry_run=False):
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}
    if dry_run:
        body["deleteOptions"] = {"dryRun": ["All"]}
    return body


class Guarded(Rights):
    def evict(self, account, node, pod, dry_run=False):
        """(status, message) of ``account``'s eviction of ``pod`` with its token bound to its pod on ``node``."""
        from kubernetes import client

        api = client.CoreV1Api(self.client(account, node) if account else self.admin.api_client)
        kwargs = {"dry_run": "All"} if dry_run else {}
        return _status(api.create_namespaced_pod_eviction, pod, self.namespace,
                       _eviction(pod, self.namespace, dry_run), **kwargs)

    def victim(self, node):
        """A fresh pod on ``node`` to be evicted (each eviction that is admitted takes one)."""
        name = self.place("victim-%s" % uuid.uuid4().hex[:4], node)
        wait_until(lambda: self.admin.read_namespaced_pod(name, self.namespace).spec.node_name == node, 30,
                   "pod %s on %s" % (name, node))
        return name


@pytest.fixture(scope="module")
def guarded(cluster):
    from ansible_collections.metax.gpu.plugins.module_utils import eviction_webhook as ew
    from kubernetes import client

    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    namespace = NAMESPACE
    r = Guarded(cluster, namespace)
    rbac = _prefixed(render(cluster, namespace, show_only="templates/metax-driver.yaml", sets=DRIVER_MANAGER),
                     namespace)
    guard_objects = render(cluster, namespace, show_only="templates/eviction-guard.yaml", sets=GUARD_SETS)
    guard_rbac = _prefixed(guard_objects, namespace)
    config, = [o for o in guard_objects if o["kind"] == "ValidatingWebhookConfiguration"]
    assert config["metadata"]["name"] == "%s-eviction-guard" % namespace     # named after the namespace

    # the guard, served here: the apiserver reaches this host at the address it is reached at
    host = urlparse(cluster.apiserver).hostname
    certs = tempfile.mkdtemp(prefix="metax-guard-")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=metax-eviction-guard", "-addext", "subjectAltName=IP:%s" % host,
                    "-keyout", os.path.join(certs, "tls.key"), "-out", os.path.join(certs, "tls.crt")],
                   check=True, capture_output=True)
    hook, = config["webhooks"]
    with open(os.path.join(certs, "tls.crt"), "rb") as handle:
        ca_bundle = base64.b64encode(handle.read()).decode()

    cluster.kubectl("create", "namespace", namespace)
    server = None
    try:
        apply_objects(cluster, rbac + guard_rbac)
        wait_until(lambda: cluster.kubectl("-n", namespace, "get", "serviceaccount", "default").returncode == 0, 60,
                   "the namespace's default service account")
        # the guard reads pods with its own account's token (pods get, nothing else)
        lookup = ew.kube_pod_node(client.CoreV1Api(r.client(GUARD)))
        server = ew.WebhookServer(("0.0.0.0", 0), ew.EvictionWebhook(
            lookup, ew.service_account_users(namespace, ["driver-manager"])),
            ew.tls_context(os.path.join(certs, "tls.crt"), os.path.join(certs, "tls.key")))
        server.start()
        hook["clientConfig"] = {"url": "https://%s:%d%s" % (host, server.port, ew.PATH), "caBundle": ca_bundle}
        apply_objects(cluster, [config])
        for node in r.nodes:
            r.place("driver-manager", node, "driver-manager")     # the agent's pods: their tokens name the node
        r.victims = {node: r.victim(node) for node in r.nodes}    # pods on each node, for dry-run evictions

        def active():
            status, message = r.evict("driver-manager", r.nodes[0], r.victims[r.nodes[1]], dry_run=True)
            return status == 403 and WEBHOOK in message
        wait_until(active, 60, "the eviction guard %s to be in force" % config["metadata"]["name"])
        yield r
    finally:
        cluster.kubectl("delete", "validatingwebhookconfiguration", config["metadata"]["name"], "--ignore-not-found")
        if server is not None:
            server.stop()
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", "--ignore-not-found")
        for obj in rbac + guard_rbac:
            if obj["kind"] in ("ClusterRole", "ClusterRoleBinding"):
                cluster.kubectl("delete", obj["kind"].lower(), obj["metadata"]["name"], "--ignore-not-found")
        shutil.rmtree(certs, ignore_errors=True)


def apply_objects(cluster, objects):
    import yaml

    res = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objects))
    assert res.returncode == 0, res.stderr


def _gone_or_going(r, pod):
    from kubernetes.client.rest import ApiException

    try:
        return r.admin.read_namespaced_pod(pod, r.namespace).metadata.deletion_timestamp is not None
    except ApiException as exc:
        return exc.status == 404


def test_driver_manager_evicts_a_pod_of_its_own_node(guarded):
    mine = guarded.nodes[0]
    pod = guarded.victim(mine)
    assert guarded.evict("driver-manager", mine, pod) == (200, "")
    wait_until(lambda: _gone_or_going(guarded, pod), 30, "pod %s evicted" % pod)


def test_driver_manager_may_not_evict_a_pod_of_another_node(guarded):
    mine, other = guarded.nodes
    pod = guarded.victim(other)
    status, message = guarded.evict("driver-manager", mine, pod)
    assert status == 403, message
    assert 'admission webhook "%s" denied the request' % WEBHOOK in message
    assert "may evict only the pods of its own node %s, not pod %s/%s on node %s" % (
        mine, guarded.namespace, pod, other) in message
    assert guarded.admin.read_namespaced_pod(pod, guarded.namespace).metadata.deletion_timestamp is None


def test_a_driver_manager_token_naming_no_node_evicts_nothing(guarded):
    pod = guarded.victims[guarded.nodes[0]]
    status, message = guarded.evict("driver-manager", None, pod, dry_run=True)
    assert status == 403 and "this token names no node" in message, message


def test_a_missing_pod_is_not_found(guarded):
    status, _message = guarded.evict("driver-manager", guarded.nodes[0], "no-such-pod", dry_run=True)
    assert status == 404


def test_an_administrators_eviction_is_not_the_guards(guarded):
    """matchConditions: only driver-manager's requests reach the guard (kubectl drain, the disruption controller
    and administrators are not held to one node)."""
    status, message = guarded.evict(None, None, guarded.victims[guarded.nodes[1]], dry_run=True)
    assert status == 200, message


def test_driver_manager_lists_no_pods_outside_its_namespace(guarded):
    from kubernetes import client

    api = client.CoreV1Api(guarded.client("driver-manager", guarded.nodes[0]))
    status, message = _status(api.list_pod_for_all_namespaces, limit=1)
    assert status == 403 and "forbidden" in message.lower(), message
    status, message = _status(api.list_namespaced_pod, "kube-system", limit=1)
    assert status == 403, message
    status, message = _status(api.read_namespaced_pod, guarded.victims[guarded.nodes[0]], guarded.namespace)
    assert status == 403, message
    # its own namespace's pods (its node's gpu-device pod, recreated after a vfnum change): listed
    status, message = _status(api.list_namespaced_pod, guarded.namespace, limit=1)
    assert status == 200, message


def test_the_guards_account_reads_pods_by_name_only(guarded):
    from kubernetes import client

    api = client.CoreV1Api(guarded.client(GUARD))
    assert _status(api.read_namespaced_pod, guarded.victims[guarded.nodes[0]], guarded.namespace) == (200, "")
    status, message = _status(api.list_pod_for_all_namespaces, limit=1)
    assert status == 403, message
    status, message = _status(api.delete_namespaced_pod, guarded.victims[guarded.nodes[0]], guarded.namespace,
                              dry_run="All")
    assert status == 403, message


def test_driver_managers_eviction_code_goes_through_the_guard(guarded):
    """Kube.evict_gpu_pods with driver-manager's token: its own node's GPU pod goes, another node's is refused."""
    from ansible_collections.metax.gpu.plugins.module_utils.agents import driver_manager as dm
    from ansible_collections.metax.gpu.plugins.module_utils.kube.evict import EvictionError

    mine, other = guarded.nodes
    own, foreign = guarded.victim(mine), guarded.victim(other)
    api = guarded.client("driver-manager", mine)

    def holders_of(pod):
        return lambda: [] if _gone_or_going(guarded, pod) else ["%s/%s" % (guarded.namespace, pod)]

    kube = dm.Kube(api, mine, guarded.namespace, "driver-config", holders=holders_of(own))
    assert kube.evict_gpu_pods(timeout=60) == ["%s/%s" % (guarded.namespace, own)]
    kube = dm.Kube(api, mine, guarded.namespace, "driver-config", holders=holders_of(foreign))
    with pytest.raises(EvictionError, match="403"):
        kube.evict_gpu_pods(timeout=5)
    assert guarded.admin.read_namespaced_pod(foreign, guarded.namespace).metadata.deletion_timestamp is None
