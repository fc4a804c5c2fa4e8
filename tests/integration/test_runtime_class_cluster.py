# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The RuntimeClass metax on the local cluster (issue 38): a pod naming it runs and gets what it gets without it.

Real MetaX clusters have a RuntimeClass ``metax`` and workloads name
``runtimeClassName: metax``. container-runtime adds containerd's runtime
handler ``metax`` beside the others (a copy of the default runtime, never the
default) and removes it byte-identically; the Extensions chart's
container-runtime template renders the RuntimeClass.

Here, on one node's real containerd 2.4 (the second node when there is one,
as test_cdi_cluster.py):

- the node's containerd reads its config from the local cluster's state
  directory, not /etc/containerd: for the test, /etc/containerd in the node's
  mount namespace is bound to that directory, so the import container-runtime
  writes (``/etc/containerd/conf.d/99-metax-gpu-cdi.toml``) resolves as on a
  real node; the binding goes afterwards;
- container-runtime runs as a pod with that /etc/containerd as its node's
  (``--restart never``: the local cluster has no service manager; the test
  restarts the node's containerd the local cluster's way, which is what
  ``systemctl restart containerd`` does on a real node: running containers
  keep running);
- the RuntimeClass is the chart's own object (helm template);
- gpu-device in CDI mode (test_cdi_cluster.py's fixture) hands out the GPUs:
  the same pod asking for one GPU, without and then with
  ``runtimeClassName: metax``, sees the same devices, /dev/mxcd, MXMACA and
  environment;
- after container-runtime's removal and containerd's restart, the node's
  config.toml is byte-identical (mode included) and conf.d is gone.

Whatever happens, the node's config is put back and its containerd restarted
on it before the module ends: the cluster is shared.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
import uuid

import pytest
import yaml

pytestmark = pytest.mark.cluster

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from localcluster import containerd  # noqa: E402
from localcluster.nodes import Node, NodePaths  # noqa: E402
from localcluster.runtime import from_environ  # noqa: E402

from test_cdi_cluster import SCRIPT, cdi_agent, pod_report  # noqa: E402,F401  # pylint: disable=unused-import
from test_gpu_device_cluster import GPU, NS, wait_for, wait_registered  # noqa: E402

from ansible_collections.metax.gpu.plugins.module_utils import names as N  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.cdi import runtime_config as rc  # noqa: E402

tomllib = pytest.importorskip("tomllib")

ROOT = os.path.dirname(os.path.dirname(HERE))
CHART = os.path.join(ROOT, "files", "charts", "metax-gpu-extensions")
AGENT = "container-runtime"
ETC = "/etc/containerd"


class NodeContainerd:
    """One node's containerd as the local cluster runs it: its config, /etc/containerd bound to it in the
    node's mount namespace, and a restart (the local cluster's: TERM, then start it again on its config)."""

    def __init__(self, cluster, node):
        self.rt = from_environ(dict(os.environ, METAX_LC_KUBE_BIN=cluster.info["METAX_KUBE_BIN"]))
        self.node = Node(int(node["index"]), node["name"], node["preset"])
        self.dir = NodePaths(self.rt.settings, self.node).dir + "/containerd"
        self.config = self.dir + "/config.toml"
        self.holder = self.rt.host.pid("ns-" + self.node.name)
        assert self.holder, "no namespace holder for node %s" % self.node.name
        self.made_etc = False
        self.bound = False

    def in_node(self, *argv, check=True):
        return subprocess.run(["nsenter", "-t", str(self.holder), "-m", "--"] + list(argv), capture_output=True,
                              text=True, timeout=60, check=check)

    def bind(self):
        if self.in_node("test", "-d", ETC, check=False).returncode != 0:
            self.in_node("mkdir", ETC)
            self.made_etc = True
        self.in_node("mount", "--bind", self.dir, ETC)
        self.bound = True

    def unbind(self):
        if self.bound:
            self.in_node("umount", ETC, check=False)
            self.bound = False
        if self.made_etc:
            self.in_node("rmdir", ETC, check=False)
            self.made_etc = False

    def restart(self):
        """containerd started again on its config (the local cluster restarts it when the file changed)."""
        spec = containerd.process(self.rt.settings, self.node, self.rt.tools.containerd_bin + "/containerd",
                                  self.holder)
        # containerd finds its shim on PATH: cluster.sh starts it with its own build's bin first, and
        # without that it runs Debian's 1.x shim, which cannot start a 2.x task ("type with url ...
        # not found") and leaves the node unable to start any pod
        saved = os.environ["PATH"]
        os.environ["PATH"] = self.rt.tools.containerd_bin + os.pathsep + saved
        try:
            self.rt.host.start(spec)
        finally:
            os.environ["PATH"] = saved
        sock = NodePaths(self.rt.settings, self.node).socket
        wait_for(lambda: subprocess.run([self.rt.tools.containerd_bin + "/ctr", "--address", sock, "version"],
                                        capture_output=True, timeout=30, check=False).returncode == 0,
                 60, "node %s's containerd answering" % self.node.name, interval=1)

    def files(self):
        """config.toml (bytes, mode) and whether conf.d exists: all container-runtime may change here."""
        st = os.stat(self.config)
        with open(self.config, "rb") as handle:
            return handle.read(), stat.S_IMODE(st.st_mode), os.path.exists(os.path.join(self.dir, "conf.d"))


def chart_runtime_class(cluster):
    """The RuntimeClass as the Extensions chart renders it with container-runtime on."""
    res = subprocess.run([cluster.helm or "helm", "template", "x", CHART, "--set", "containerRuntime.enabled=true",
                          "--show-only", "templates/container-runtime.yaml"], env=cluster.env, capture_output=True,
                         text=True, timeout=120, check=True)
    (obj,) = [d for d in yaml.safe_load_all(res.stdout) if d and d["kind"] == "RuntimeClass"]
    return obj


def runtime_agent(agents, image):
    """container-runtime on the agents' node, with the node's /etc/containerd as its node's."""
    return {
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": AGENT, "namespace": NS},
        "spec": {"selector": {"matchLabels": {"app": AGENT}}, "template": {
            "metadata": {"labels": {"app": AGENT}},
            "spec": {
                "serviceAccountName": AGENT, "nodeSelector": {"kubernetes.io/hostname": agents.node},
                "tolerations": [{"operator": "Exists"}], "terminationGracePeriodSeconds": 60,
                "containers": [{
                    "name": AGENT, "image": image, "imagePullPolicy": "IfNotPresent", "command": [AGENT],
                    "args": ["--host-root=/host", "--restart=never", "--log-format=text"],
                    "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
                    "readinessProbe": {"exec": {"command": ["test", "-f", "/tmp/runtime-ready"]}, "periodSeconds": 2},
                    "securityContext": {"privileged": True},
                    "volumeMounts": [{"name": "etc-containerd", "mountPath": "/host" + ETC},
                                     {"name": "state", "mountPath": "/host/var/lib"}],
                }],
                "volumes": [{"name": "etc-containerd", "hostPath": {"path": ETC, "type": "Directory"}},
                            {"name": "state", "emptyDir": {}}],
            }}}}


def one_gpu_pod(agents, runtime_class=None):
    name = "rtc-%s-%s" % (runtime_class or "default", uuid.uuid4().hex[:6])
    spec = {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
            "nodeSelector": {"kubernetes.io/hostname": agents.node}, "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "main", "image": agents.images["gpu-device"], "command": ["sh", "-c", SCRIPT],
                            "resources": {"limits": {GPU: "1"}}}]}
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    agents.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS}, "spec": spec})
    return name


def delete_pod(agents, name):
    agents.cluster.kubectl("-n", NS, "delete", "pod", name, "--ignore-not-found", "--wait=true", "--timeout=60s")


@pytest.fixture
def node_containerd(cluster, cdi_agent):  # noqa: F811
    node = [n for n in cluster.nodes if n["name"] == cdi_agent.node][0]
    ctrd = NodeContainerd(cluster, node)
    before = ctrd.files()
    assert not before[2], "%s/conf.d exists before the test" % ctrd.dir
    ctrd.bind()
    try:
        yield ctrd, before
    finally:
        cdi_agent.delete(AGENT)
        if ctrd.files() != before:      # a revert that did not happen: the shared cluster's node comes first
            with open(ctrd.config, "wb") as handle:
                handle.write(before[0])
            os.chmod(ctrd.config, before[1])
            dropin = os.path.join(ctrd.dir, "conf.d", os.path.basename(rc.CONTAINERD_DROPIN))
            if os.path.exists(dropin):
                os.unlink(dropin)
                os.rmdir(os.path.dirname(dropin))
        ctrd.unbind()
        ctrd.restart()


def test_a_pod_naming_runtime_class_metax_runs_and_gets_what_it_gets_without_it(cluster, cdi_agent, node_containerd):
    agents, (ctrd, before) = cdi_agent, node_containerd
    wait_registered(agents)
    created = False
    runtime_class = chart_runtime_class(cluster)
    assert runtime_class["metadata"]["name"] == runtime_class["handler"] == N.RUNTIME_CLASS == "metax"
    if cluster.kubectl("get", "runtimeclass", N.RUNTIME_CLASS).returncode != 0:
        agents.apply(runtime_class)
        created = True
    pods = []
    try:
        # the pod without the RuntimeClass first: the reference (every GPU free, so the allocator's choice
        # for the second pod is the same)
        wait_for(lambda: agents.gpu_resources() == (agents.gpus(), agents.gpus()), 120, "every GPU allocatable")
        name = one_gpu_pod(agents)
        pods.append(name)
        plain = pod_report(agents, name)
        assert len(plain[0]["dri"]) == 2 and plain[1]["METAX_VISIBLE_DEVICES"], plain
        delete_pod(agents, name)
        # container-runtime adds the handler beside runc and is ready (containerd 2.x reads CDI already)
        agents.apply(*agents.rbac(AGENT))
        agents.apply(runtime_agent(agents, agents.images.get(AGENT) or agents.images["gpu-device"]))
        agents.wait_ready(AGENT)
        log = agents.logs(AGENT)
        assert "containerd://2." in log and "runtime handler metax added" in log, log[-2000:]
        with open(os.path.join(ctrd.dir, "conf.d", os.path.basename(rc.CONTAINERD_DROPIN)), "rb") as handle:
            dropin = tomllib.loads(handle.read().decode())
        config = tomllib.loads(ctrd.files()[0].decode())
        runtimes = config["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]
        assert dropin["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"] == {
            "metax": runtimes["runc"]}
        assert config.pop("imports") == [rc.CONTAINERD_DROPIN]
        assert config == tomllib.loads(before[0].decode())       # the main config: only the import
        assert config["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["default_runtime_name"] == "runc"
        # what `systemctl restart containerd` does on a real node; running pods (gpu-device) keep running
        ctrd.restart()
        wait_for(lambda: agents.gpu_resources() == (agents.gpus(), agents.gpus()), 120,
                 "every GPU allocatable again")
        # the same pod naming the RuntimeClass metax: runs (containerd knows the handler) and sees the same
        start = time.monotonic()
        name = one_gpu_pod(agents, N.RUNTIME_CLASS)
        pods.append(name)
        with_class = pod_report(agents, name)
        pod = agents.api.read_namespaced_pod(name, NS)
        assert pod.spec.runtime_class_name == N.RUNTIME_CLASS
        assert with_class == plain, (with_class, plain)
        print("\nruntimeClassName: metax pod running with the same devices in %.1fs" % (time.monotonic() - start))
        delete_pod(agents, name)
    finally:
        for name in pods:
            delete_pod(agents, name)
        if created:
            cluster.kubectl("delete", "runtimeclass", N.RUNTIME_CLASS, "--ignore-not-found")
    # container-runtime removed: the handler goes, byte-identical, and containerd runs on the config as before
    agents.delete(AGENT)
    assert ctrd.files() == before
    ctrd.restart()
    assert ctrd.files() == before
