# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The modules with kubernetes.core's connection options against the local cluster: a bearer token, no kubeconfig.

What an administrator on a bastion has: the API server's URL, its CA and a ServiceAccount token (TokenRequest, ten
minutes). A ServiceAccount with a ClusterRole that fits the modules' reads (nodes get/list/patch, pods list); the
modules run as Ansible runs them (``ansible localhost -m``) with ``host`` + ``api_key`` + ``ca_cert``, in an
environment without KUBECONFIG, K8S_AUTH_* or a ~/.kube/config, and must give what the admin's client reads:

- ``kube_list``: the cluster's nodes; the test's pod by field selector;
- ``node_metadata``: a key of the test's own prefix on one node, found in check mode and removed for real;
- ``evict_gpu_pods`` (check mode, drain): the test's pod on its node, as ``kube/evict.select`` finds it;
- ``driver`` (check mode, ``node_name``): its node's pods read with the token;
- the same connection from K8S_AUTH_HOST / K8S_AUTH_API_KEY / K8S_AUTH_SSL_CA_CERT alone;
- the admin's kubeconfig with ``impersonate_user`` set to the ServiceAccount reads what the token reads, and to a
  ServiceAccount without rights is refused in one line;
- without ``ca_cert`` the server is not trusted (one line naming it), with ``validate_certs: false`` it is;
- a token of a ServiceAccount without the ClusterRole is refused (403) in one line; the token appears in no output,
  ``-vvv`` included.

Cluster-scoped names carry the test namespace; everything is deleted afterwards.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import uuid

import pytest
import yaml
from polling import wait_until

pytestmark = pytest.mark.cluster

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.path.dirname(sys.executable)
NAMESPACE = "metax-auth-it"
ACCOUNT = "metax-auth-reader"
NO_RIGHTS = "metax-auth-nobody"
PREFIX = "auth-it.metax.example/"


class Bastion:
    """The API server's URL and CA from the admin kubeconfig, tokens by TokenRequest, and module runs."""

    def __init__(self, cluster, home):
        from kubernetes import client

        self.cluster = cluster
        self.home = home
        self.admin = client.CoreV1Api(cluster.api_client())
        with open(cluster.kubeconfig) as handle:
            config = yaml.safe_load(handle)
        context = next(c["context"] for c in config["contexts"] if c["name"] == config["current-context"])
        server = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
        self.host = server["server"]
        self.ca_cert = os.path.join(home, "cluster-ca.crt")
        if server.get("certificate-authority-data"):
            with open(self.ca_cert, "wb") as handle:
                handle.write(base64.b64decode(server["certificate-authority-data"]))
        else:
            path = server["certificate-authority"]
            if not os.path.isabs(path):
                path = os.path.join(os.path.dirname(cluster.kubeconfig), path)
            with open(path, "rb") as src, open(self.ca_cert, "wb") as dst:
                dst.write(src.read())
        self.outputs = []

    def token(self, account):
        answer = self.admin.create_namespaced_service_account_token(
            account, NAMESPACE, {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                 "spec": {"expirationSeconds": 600}})
        return answer.status.token

    def allowed(self, account, verb, resource):
        """The authorizer's answer for the ServiceAccount (RBAC changes reach it within moments, not at once)."""
        from kubernetes import client

        review = client.AuthorizationV1Api(self.cluster.api_client()).create_subject_access_review({
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": "system:serviceaccount:%s:%s" % (NAMESPACE, account),
                     "groups": ["system:serviceaccounts", "system:serviceaccounts:" + NAMESPACE, "system:authenticated"],
                     "resourceAttributes": {"verb": verb, "resource": resource}}})
        return bool(review.status.allowed)

    def env(self, **extra):
        """No kubeconfig anywhere: not KUBECONFIG, not K8S_AUTH_*, not ~/.kube/config (HOME is the test's)."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("K8S_AUTH_") and k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
        env.update(HOME=self.home, ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".build", "collections"),
                   ANSIBLE_PYTHON_INTERPRETER=sys.executable, PYTHONWARNINGS="ignore",
                   PATH=BIN + os.pathsep + os.environ.get("PATH", ""), **extra)
        return env

    def run(self, name, args, *flags, ok=True, env=None):
        """``ansible localhost -m metax.gpu.<name>``: its result (failed or not, as ``ok`` says)."""
        proc = subprocess.run([os.path.join(BIN, "ansible"), "localhost", "-m", "metax.gpu." + name,
                               "-a", json.dumps(args), "-o", *flags],
                              capture_output=True, text=True, env=env or self.env(), timeout=300, check=False)
        self.outputs.append(proc.stdout + proc.stderr)
        assert (proc.returncode == 0) == ok, proc.stdout[-3000:] + proc.stderr[-3000:]
        # -o: one line "localhost | SUCCESS => {...}" (or FAILED!), after -vvv's own lines
        line = next(l for l in reversed(proc.stdout.splitlines()) if l.startswith("localhost | "))
        return json.loads(line.split(" => ", 1)[1])

    def with_token(self, token, **args):
        return dict(args, host=self.host, api_key=token, ca_cert=self.ca_cert)


def _rbac():
    role = "%s-%s" % (NAMESPACE, ACCOUNT)
    return [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": role}, "rules": [
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": role},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
         "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": NAMESPACE}]},
    ]


@pytest.fixture(scope="module")
def bastion(cluster, tmp_path_factory):
    home = str(tmp_path_factory.mktemp("bastion-home"))
    b = Bastion(cluster, home)
    rbac = _rbac()
    assert cluster.kubectl("create", "namespace", NAMESPACE).returncode == 0
    try:
        for account in (ACCOUNT, NO_RIGHTS):
            res = cluster.kubectl("-n", NAMESPACE, "create", "serviceaccount", account)
            assert res.returncode == 0, res.stderr
        res = cluster.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": rbac}))
        assert res.returncode == 0, res.stderr
        wait_until(lambda: b.allowed(ACCOUNT, "list", "nodes") and b.allowed(ACCOUNT, "list", "pods"), 60,
                   "the ClusterRole in force for " + ACCOUNT)
        wait_until(lambda: cluster.kubectl("-n", NAMESPACE, "get", "serviceaccount", "default").returncode == 0, 60,
                   "the namespace's default service account")
        node = cluster.nodes[0]["name"] if cluster.nodes else cluster.node_name
        b.node = node
        b.pod = "auth-it-%s" % uuid.uuid4().hex[:5]
        # bound to the node by name, never scheduled: its phase is what evict's selection reads, not its running
        b.admin.create_namespaced_pod(NAMESPACE, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": b.pod},
            "spec": {"nodeName": node, "tolerations": [{"operator": "Exists"}], "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "pause", "image": cluster.info["METAX_PAUSE_IMAGE"],
                                     "imagePullPolicy": "IfNotPresent"}]}})
        b.reader = b.token(ACCOUNT)
        b.nobody = b.token(NO_RIGHTS)
        yield b
    finally:
        cluster.kubectl("delete", "--ignore-not-found", "--wait=false", "-f", "-",
                        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": rbac}))
        cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false")
        for node in b.admin.list_node().items:     # the test's prefix off every node, whatever failed
            keys = [k for k in (node.metadata.labels or {}) if k.startswith(PREFIX)]
            if keys:
                b.admin.patch_node(node.metadata.name, {"metadata": {"labels": {k: None for k in keys}}})
    for text in b.outputs:
        assert b.reader not in text and b.nobody not in text, "a token in the output"


def test_kube_list_with_a_token_and_no_kubeconfig(bastion):
    nodes = bastion.run("kube_list", bastion.with_token(bastion.reader, kind="Node", page_size=1))
    assert sorted(n["metadata"]["name"] for n in nodes["resources"]) == sorted(
        n.metadata.name for n in bastion.admin.list_node().items)
    assert nodes["pages"] >= len(nodes["resources"])        # one node a page
    pods = bastion.run("kube_list", bastion.with_token(bastion.reader, kind="Pod", namespace=NAMESPACE,
                                                       field_selectors=["spec.nodeName=" + bastion.node]))
    assert [p["metadata"]["name"] for p in pods["resources"]] == [bastion.pod]


def test_node_metadata_with_a_token_finds_in_check_mode_then_removes(bastion):
    key = PREFIX + "marker"
    bastion.admin.patch_node(bastion.node, {"metadata": {"labels": {key: "x"}}})
    args = bastion.with_token(bastion.reader, prefix=PREFIX)
    check = bastion.run("node_metadata", args, "--check", "--diff")
    assert check["changed"] is True and check["nodes"] == [{"name": bastion.node, "labels": [key], "annotations": []}]
    assert key in bastion.admin.read_node(bastion.node).metadata.labels      # check mode wrote nothing
    done = bastion.run("node_metadata", args)
    assert done["changed"] is True and [n["name"] for n in done["nodes"]] == [bastion.node]
    assert key not in (bastion.admin.read_node(bastion.node).metadata.labels or {})
    again = bastion.run("node_metadata", args)
    assert again["changed"] is False and again["nodes"] == []


def test_evict_gpu_pods_check_mode_with_a_token(bastion):
    from ansible_collections.metax.gpu.plugins.module_utils.kube.evict import select

    out = bastion.run("evict_gpu_pods", bastion.with_token(bastion.reader, node_name=bastion.node, drain=True),
                      "--check")
    listing = bastion.admin.list_pod_for_all_namespaces(field_selector="spec.nodeName=" + bastion.node).items
    expected = select([bastion.admin.api_client.sanitize_for_serialization(p) for p in listing], drain=True)
    assert "%s/%s" % (NAMESPACE, bastion.pod) in out["selected"] and out["selected"] == expected
    assert out["evicted"] == [] and out["deleted"] == []
    gpu = bastion.run("evict_gpu_pods", bastion.with_token(bastion.reader, node_name=bastion.node), "--check")
    assert gpu["selected"] == select([bastion.admin.api_client.sanitize_for_serialization(p) for p in listing],
                                     drain=False)


def test_driver_reads_its_node_pods_with_a_token(bastion, tmp_path):
    root = tmp_path / "empty-node"
    root.mkdir()
    args = bastion.with_token(bastion.reader, state="absent", host_root=str(root), node_name=bastion.node)
    out = bastion.run("driver", args, "--check")
    assert out["changed"] is False
    refused = bastion.run("driver", dict(args, api_key=bastion.nobody), "--check", ok=False)
    assert "403" in refused["msg"] and bastion.host in refused["msg"] and "\n" not in refused["msg"]


def test_the_environment_alone_gives_the_connection(bastion):
    env = bastion.env(K8S_AUTH_HOST=bastion.host, K8S_AUTH_API_KEY=bastion.reader, K8S_AUTH_SSL_CA_CERT=bastion.ca_cert)
    nodes = bastion.run("kube_list", {"kind": "Node"}, env=env)
    assert bastion.node in [n["metadata"]["name"] for n in nodes["resources"]]


def test_impersonating_the_service_account_from_the_admin_kubeconfig(bastion):
    as_reader = {"kubeconfig": bastion.cluster.kubeconfig, "impersonate_user":
                 "system:serviceaccount:%s:%s" % (NAMESPACE, ACCOUNT)}
    nodes = bastion.run("kube_list", dict(as_reader, kind="Node"))
    assert bastion.node in [n["metadata"]["name"] for n in nodes["resources"]]
    refused = bastion.run("kube_list", dict(as_reader, kind="Secret", namespace=NAMESPACE), ok=False)
    assert "403" in refused["msg"] and "\n" not in refused["msg"]
    nobody = dict(as_reader, impersonate_user="system:serviceaccount:%s:%s" % (NAMESPACE, NO_RIGHTS))
    refused = bastion.run("kube_list", dict(nobody, kind="Node"), ok=False)
    assert "403" in refused["msg"] and bastion.cluster.kubeconfig in refused["msg"]


def test_the_ca_decides_whether_the_server_is_trusted(bastion):
    args = {"kind": "Node", "host": bastion.host, "api_key": bastion.reader}
    untrusted = bastion.run("kube_list", args, ok=False)
    assert bastion.host in untrusted["msg"] and "\n" not in untrusted["msg"] and "CERTIFICATE_VERIFY_FAILED" in untrusted["msg"]
    trusted = bastion.run("kube_list", dict(args, validate_certs=False))
    assert bastion.node in [n["metadata"]["name"] for n in trusted["resources"]]


def test_a_token_without_rights_is_refused_in_one_line_and_never_shown(bastion):
    refused = bastion.run("kube_list", bastion.with_token(bastion.nobody, kind="Node"), "-vvv", ok=False)
    msg = refused["msg"]
    assert "403" in msg and bastion.host in msg and "api_key" in msg and "\n" not in msg, msg
    assert refused["invocation"]["module_args"]["api_key"] == "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER"
    assert bastion.nobody not in bastion.outputs[-1]
