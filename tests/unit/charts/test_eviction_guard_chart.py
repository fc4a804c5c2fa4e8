# -*- coding: utf-8 -*-
"""The eviction guard in both charts (issue 39): the webhook configuration, its certificate, the server behind it.

What the guard admits is tested against the real API server in
tests/integration/test_node_agent_policy_cluster.py; here what the charts render:
the configuration reaches the server each chart runs, with the CA that signed
that server's certificate, for the agents that evict (driver-manager, vfio-manager) and those
the server was told to guard, no other; driver-manager lists no pods.
"""

from __future__ import annotations

import base64
import shutil
import subprocess

import pytest

from ansible_collections.metax.gpu.plugins.module_utils import eviction_webhook, names
from ansible_collections.metax.gpu.plugins.module_utils.agents import eviction_webhook as guard_agent
from ansible_collections.metax.gpu.plugins.module_utils.agents import operator_controller

from .helm import CHART, CHARTS, find_helm, helm_required, render

HELM = find_helm()
pytestmark = helm_required(HELM)
OPERATOR_CHART = CHARTS / "metax-operator"
NS = "gpu-ns"
DRIVER = {"driverManager": {"enabled": True, "payload": {"version": "2.29.0.13"}}, "nodeAgentPolicy": {"enabled": True}}
OPERATOR = {"minimal": True, "nodeAgentPolicy": {"enabled": True}}


def by_key(objects):
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def rendered(values, chart=CHART):
    rc, objects, err = render(HELM, values, namespace=NS, chart=chart)
    assert rc == 0, err
    return by_key(objects)


def check_webhook_reaches(objs, service_name, pod_labels, ports, guarded):
    """The configuration's service is in front of pods whose port serves the guard, with its CA."""
    config = objs[("ValidatingWebhookConfiguration", "%s-eviction-guard" % NS)]
    hook, = config["webhooks"]
    assert hook["failurePolicy"] == "Fail" and hook["sideEffects"] == "None"
    assert hook["rules"] == [{"apiGroups": [""], "apiVersions": ["*"], "operations": ["CREATE"],
                              "resources": ["pods/eviction"], "scope": "Namespaced"}]
    assert hook["matchConditions"][0]["expression"] == 'request.userInfo.username in [%s]' % ",".join(
        '"system:serviceaccount:%s:%s"' % (NS, account) for account in guarded)
    ref = hook["clientConfig"]["service"]
    assert (ref["name"], ref["namespace"], ref["path"]) == (service_name, NS, eviction_webhook.PATH)
    service = objs[("Service", service_name)]
    port, = [p for p in service["spec"]["ports"] if p["port"] == ref["port"]]
    assert all(pod_labels.get(k) == v for k, v in service["spec"]["selector"].items())
    assert port["targetPort"] in ports
    secret = objs[("Secret", service_name + "-tls")]
    assert secret["type"] == "kubernetes.io/tls"
    assert hook["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
    return secret


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_the_certificate_is_the_services_and_signed_by_the_ca_bundle(tmp_path):
    objs = rendered(DRIVER)
    secret = objs[("Secret", "metax-eviction-guard-tls")]
    for key in ("ca.crt", "tls.crt", "tls.key"):
        (tmp_path / key).write_bytes(base64.b64decode(secret["data"][key]))
    proc = subprocess.run(["openssl", "verify", "-CAfile", str(tmp_path / "ca.crt"), "-verify_hostname",
                           "metax-eviction-guard.%s.svc" % NS, str(tmp_path / "tls.crt")],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # and the key is the certificate's: the server loads the pair
    eviction_webhook.tls_context(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"))


def test_extensions_chart_runs_its_own_guard_for_driver_manager():
    objs = rendered(DRIVER)
    deployment = objs[("Deployment", names.EVICTION_WEBHOOK)]
    pod = deployment["spec"]["template"]["spec"]
    container, = pod["containers"]
    ports = {p["name"] for p in container["ports"]} | {p["containerPort"] for p in container["ports"]}
    secret = check_webhook_reaches(objs, names.EVICTION_WEBHOOK, deployment["spec"]["template"]["metadata"]["labels"],
                                   ports, [names.SERVICE_ACCOUNT_DRIVER_MANAGER])
    assert container["command"][-1] == guard_agent.__name__
    args = guard_agent.build_parser().parse_args(container["args"])
    assert args.namespace == NS and args.eviction_webhook_guard == [names.SERVICE_ACCOUNT_DRIVER_MANAGER]
    assert args.eviction_webhook_port in ports
    mount, = [m for m in container["volumeMounts"] if m["mountPath"] == args.eviction_webhook_tls_dir]
    volume, = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"] == secret["metadata"]["name"]
    assert container["securityContext"]["runAsNonRoot"] is True
    # its own account reads pods by name, nothing else
    assert pod["serviceAccountName"] == names.EVICTION_WEBHOOK
    assert objs[("ClusterRole", "metax-gpu-eviction-guard")]["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]
    binding = objs[("ClusterRoleBinding", "metax-gpu-eviction-guard")]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": names.EVICTION_WEBHOOK, "namespace": NS}]


def test_driver_manager_lists_no_pods_and_reads_the_kubelets_pod_resources():
    objs = rendered(DRIVER)
    rules = objs[("ClusterRole", "metax-gpu-driver-manager")]["rules"]
    assert [r for r in rules if "pods" in r["resources"]] == []
    assert {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]} in rules
    pod = objs[("DaemonSet", names.DAEMONSET_DRIVER)]["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["pod-resources"] == "/var/lib/kubelet/pod-resources"
    assert volumes["pod-resources"]["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"


@pytest.mark.parametrize("values, guarded", [
    ({"vfioAgent": {"enabled": True}, "nodeAgentPolicy": {"enabled": True}}, [names.SERVICE_ACCOUNT_VFIO_MANAGER]),
    (dict(DRIVER, vfioAgent={"enabled": True}), [names.SERVICE_ACCOUNT_DRIVER_MANAGER, names.SERVICE_ACCOUNT_VFIO_MANAGER]),
], ids=["vfio-manager-alone", "both"])
def test_extensions_chart_guards_the_evicting_agents_it_deploys(values, guarded):
    # vfio-manager evicts the pods holding a GPU it hands to vfio-pci: pods/eviction create, confined the same way
    objs = rendered(values)
    deployment = objs[("Deployment", names.EVICTION_WEBHOOK)]
    container, = deployment["spec"]["template"]["spec"]["containers"]
    ports = {p["name"] for p in container["ports"]} | {p["containerPort"] for p in container["ports"]}
    check_webhook_reaches(objs, names.EVICTION_WEBHOOK, deployment["spec"]["template"]["metadata"]["labels"],
                          ports, guarded)
    assert guard_agent.build_parser().parse_args(container["args"]).eviction_webhook_guard == guarded


@pytest.mark.parametrize("values", [
    {"driverManager": {"enabled": False}, "nodeAgentPolicy": {"enabled": True}},
    dict(DRIVER, driverManager=dict(DRIVER["driverManager"], evictionGuard={"enabled": False})),
    dict(DRIVER, nodeAgentPolicy={"enabled": False}),
], ids=["no-driver-manager", "guard-off", "policy-off"])
def test_extensions_chart_without_the_guard(values):
    assert not [k for k in rendered(values) if "eviction-guard" in k[1]]


def test_operator_chart_the_controller_serves_the_guard():
    objs = rendered(OPERATOR, OPERATOR_CHART)
    deployment = objs[("Deployment", "operator-controller")]
    pod = deployment["spec"]["template"]["spec"]
    container, = pod["containers"]
    ports = {p["name"] for p in container["ports"]} | {p["containerPort"] for p in container["ports"]}
    guarded = [names.SERVICE_ACCOUNT_DRIVER_MANAGER, names.SERVICE_ACCOUNT_VFIO_MANAGER]
    secret = check_webhook_reaches(objs, names.EVICTION_WEBHOOK, deployment["spec"]["template"]["metadata"]["labels"],
                                   ports, guarded)
    args = operator_controller.build_parser().parse_args(container["args"])
    assert args.eviction_webhook_guard == guarded       # the server judges what the configuration sends it
    assert args.eviction_webhook_port in ports
    # a replica is behind the Service once the guard listens
    probe_port = container["readinessProbe"]["tcpSocket"]["port"]
    assert [p["containerPort"] for p in container["ports"] if p["name"] == probe_port] == [args.eviction_webhook_port]
    mount, = [m for m in container["volumeMounts"] if m["mountPath"] == args.eviction_webhook_tls_dir]
    volume, = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"] == secret["metadata"]["name"]
    rules = objs[("ClusterRole", "metax-operator-controller")]["rules"]
    pods = [r for r in rules if r["resources"] == ["pods"]]
    assert pods == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]


def test_operator_chart_without_the_policy_keeps_the_secret_the_controller_mounts():
    objs = rendered(dict(OPERATOR, nodeAgentPolicy={"enabled": False}), OPERATOR_CHART)
    assert ("Secret", "metax-eviction-guard-tls") in objs
    assert not [k for k in objs if k[0] == "ValidatingWebhookConfiguration"]
