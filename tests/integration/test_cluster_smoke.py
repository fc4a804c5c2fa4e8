# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Smoke tests of the local cluster (scripts/cluster/cluster.sh)."""

from __future__ import annotations

import os
import stat
import subprocess
import time
import uuid

import pytest

pytestmark = pytest.mark.cluster

SMOKE_SCRIPT = r'''
import json, os, ssl, urllib.request
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
ctx = ssl.create_default_context(cafile=sa + "/ca.crt")
url = "https://%s:%s/version" % (os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"])
req = urllib.request.Request(url, headers={"Authorization": "Bearer " + open(sa + "/token").read()})
version = json.load(urllib.request.urlopen(req, context=ctx, timeout=20))["gitVersion"]
print("metax-smoke ok", open("/smoke-marker").read().strip(), "apiserver", version)
'''


def smoke_context(ctx, base_image):
    """Write the smoke image's build context (FROM the debootstrap base) into ``ctx``; returns its unique marker."""
    marker = uuid.uuid4().hex[:12]
    (ctx / "smoke-marker").write_text(marker + "\n")
    (ctx / "smoke.py").write_text(SMOKE_SCRIPT)
    (ctx / "Containerfile").write_text(
        "FROM %s\nCOPY smoke-marker /smoke-marker\nCOPY smoke.py /smoke.py\nCMD [\"python3\", \"/smoke.py\"]\n"
        % base_image)
    return marker


@pytest.fixture(scope="module")
def smoke_image(cluster, tmp_path_factory):
    """A tiny image FROM the debootstrap base, built with podman, pushed to both registries."""
    ctx = tmp_path_factory.mktemp("smoke-image")
    marker = smoke_context(ctx, cluster.base_image)
    local = "localhost/metax-gpu/smoke:%s" % marker
    plain = "%s/metax-gpu/smoke:%s" % (cluster.registry, marker)
    auth = "%s/metax-gpu/smoke:%s" % (cluster.registry_auth, marker)
    env = cluster.env

    def run(*cmd):
        res = subprocess.run(list(cmd), env=env, capture_output=True, text=True, timeout=300,
                             stdin=subprocess.DEVNULL, check=False)
        assert res.returncode == 0, "%s failed:\n%s%s" % (cmd[:2], res.stdout, res.stderr)

    run("podman", "build", "--quiet", "--layers=false", "--network", "host", "-t", local, str(ctx))
    try:
        run("podman", "push", "--quiet", "--tls-verify=false", local, "docker://" + plain)
        run("podman", "push", "--quiet", "--cert-dir", cluster.registry_auth_cert_dir,
            "--creds", "%s:%s" % (cluster.registry_auth_user, cluster.registry_auth_password),
            local, "docker://" + auth)
    finally:
        subprocess.run(["podman", "rmi", "-f", local], env=env, capture_output=True, stdin=subprocess.DEVNULL,
                       check=False)
    return {"marker": marker, "plain": plain, "auth": auth}


@pytest.fixture
def namespace(cluster):
    from kubernetes import client

    api = client.CoreV1Api(cluster.api_client())
    name = "metax-smoke-" + uuid.uuid4().hex[:6]
    api.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    # the ServiceAccount controller creates "default" shortly after
    deadline = time.time() + 60
    while time.time() < deadline:
        if any(sa.metadata.name == "default" for sa in api.list_namespaced_service_account(name).items):
            break
        time.sleep(0.5)
    yield name
    api.delete_namespace(name, grace_period_seconds=0)


def _run_pod(cluster, namespace, name, image, host_network=False, timeout=180):
    from kubernetes import client

    api = client.CoreV1Api(cluster.api_client())
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(
            restart_policy="Never",
            host_network=host_network,
            containers=[client.V1Container(name="smoke", image=image, image_pull_policy="Always")],
        ),
    )
    api.create_namespaced_pod(namespace, pod)
    deadline = time.time() + timeout
    phase = None
    while time.time() < deadline:
        got = api.read_namespaced_pod(name, namespace)
        phase = got.status.phase
        if phase in ("Succeeded", "Failed"):
            break
        time.sleep(1)
    events = [e.message for e in api.list_namespaced_event(namespace).items]
    assert phase == "Succeeded", "pod %s ended in phase %s; events: %s" % (name, phase, events)
    return api.read_namespaced_pod_log(name, namespace, container="smoke")


def test_node_ready(cluster):
    from kubernetes import client

    node = client.CoreV1Api(cluster.api_client()).read_node(cluster.node_name)
    ready = [c for c in node.status.conditions if c.type == "Ready"]
    assert ready and ready[0].status == "True", node.status.conditions
    assert node.status.node_info.kubelet_version.startswith("v1.36.")
    assert not [t for t in (node.spec.taints or []) if t.effect == "NoSchedule"], node.spec.taints
    # sockets later issues talk to (device plugin registration, pod resources)
    assert os.path.exists("/var/lib/kubelet/device-plugins/kubelet.sock")
    assert os.path.exists("/var/lib/kubelet/pod-resources/kubelet.sock")


def test_static_pod_scheduler_from_local_image(cluster):
    from kubernetes import client

    assert os.path.isfile("/etc/kubernetes/manifests/kube-scheduler.yaml")
    assert os.path.isfile("/etc/kubernetes/scheduler.conf")
    pod = client.CoreV1Api(cluster.api_client()).read_namespaced_pod("kube-scheduler-" + cluster.node_name,
                                                                     "kube-system")
    assert pod.status.phase == "Running"
    assert pod.spec.containers[0].image == cluster.scheduler_image
    assert pod.metadata.annotations.get("kubernetes.io/config.source") == "file"


def test_pod_from_local_registry_runs_and_logs(cluster, smoke_image, namespace):
    log = _run_pod(cluster, namespace, "smoke-plain", smoke_image["plain"])
    assert "metax-smoke ok %s apiserver v1.36." % smoke_image["marker"] in log, log


def test_hostnetwork_pod_from_auth_registry(cluster, smoke_image, namespace):
    log = _run_pod(cluster, namespace, "smoke-auth", smoke_image["auth"], host_network=True)
    assert "metax-smoke ok %s" % smoke_image["marker"] in log, log


def test_auth_registry_requires_credentials(cluster):
    res = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--cacert",
                          cluster.registry_auth_ca, "https://%s/v2/" % cluster.registry_auth],
                         capture_output=True, text=True, timeout=30, check=False)
    assert res.stdout == "401", res


def test_kubectl_auth_can_i(cluster):
    res = cluster.kubectl("auth", "can-i", "*", "*", "--all-namespaces")
    assert res.returncode == 0 and res.stdout.strip() == "yes", res
    res = cluster.kubectl("auth", "can-i", "create", "pods", "--as", "system:serviceaccount:default:default")
    assert res.stdout.strip() == "no", res


def test_simulated_node_root(cluster):
    root = cluster.sim_root
    assert os.path.isdir(root), root
    mxcd = os.path.join(root, "dev", "mxcd")
    assert stat.S_ISCHR(os.stat(mxcd).st_mode), "dev/mxcd must be a real character device node"
