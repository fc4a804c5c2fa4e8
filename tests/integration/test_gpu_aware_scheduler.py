# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""gpu-aware with the real kube-scheduler on the local cluster (both nodeCacheCapable modes).

Per mode the test starts its own gpu-aware process and a SECOND kube-scheduler
(its own schedulerName, leader election off, the extender on a loopback port;
the cluster's static-pod scheduler is left alone) and creates:

* hand-made GPU Nodes (status capacity and gpu-device annotations set by the
  test, tables from the real allocator; a private NoSchedule taint keeps
  everyone else's pods off them):
  ``vf``: 2 x C550 split into 8 VFs, all free -- the best 2-device set
  (two VFs of one chip) communicates best but takes from a full pool;
  ``pair``: 8 x C500 with only devices 0 and 4 free -- poor link, but
  taking them damages nothing;
  ``busy`` / ``stale``: allocatable 8 but 2 free healthy devices / only 2
  devices listed, for the pod that fits nowhere;
* the kubelet node takes part when gpu-device publishes GPUs on it; the
  expected choice is computed over whatever candidates exist.

Then: scoreWeight-only sends a 2-GPU pod to ``vf``; changing the ConfigMap to
lossWeight-only (no restart) sends the next one to ``pair``; and back. A
4-GPU pod limited to ``busy``/``stale`` stays Pending with gpu-aware's reasons
in its FailedScheduling event.

With gpu-device running on the kubelet node (the gpu-device tests' fixture,
simulated 8 x C500, all free), a 4-GPU pod goes to the kubelet node under
lossWeight-only (a whole MetaXLink group of 8: loss 160, against 1120 on
``vf``) and to ``vf`` under scoreWeight-only (two chips' VFs: 790 against
670); the pod on the kubelet node is really started by the kubelet.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

pytestmark = pytest.mark.cluster

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COLLECTIONS = os.path.join(REPO, ".build", "collections")
sys.path.insert(0, COLLECTIONS)

from ansible_collections.metax.gpu.plugins.module_utils.extender.nodeinfo import (  # noqa: E402
    ANNOTATION_DEVICES, ANNOTATION_LOSSES, ANNOTATION_SCORES, gpu_state, node_fields)
from ansible_collections.metax.gpu.plugins.module_utils.extender.policy import (  # noqa: E402
    Weights, prioritize, reason_free, reason_total)
# gpu-device on the kubelet node: the shared fixtures of the gpu-device cluster tests.
from test_gpu_device_cluster import device_agent  # noqa: E402,F401  pylint: disable=unused-import
from ports import free_port  # noqa: E402

GPU = "metax-tech.com/gpu"
AGENT = "ansible_collections.metax.gpu.plugins.module_utils.agents.gpu_aware"
PAUSE = "metax-gpu/pause:3.10"
TAINT = "metax.gpu/gpu-aware-it"


def _wait(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError("timed out after %ss waiting for %s" % (timeout, what))


def _tables(preset_name, free, vfs=0):
    from ansible_collections.metax.gpu.plugins.module_utils.sim.alloc_synth import topology_from_spec
    from ansible_collections.metax.gpu.plugins.module_utils.gpu.allocator import per_count_tables
    from ansible_collections.metax.gpu.plugins.module_utils.sim.spec import preset
    topology = topology_from_spec(preset(preset_name), vfs=vfs)
    scores, losses = per_count_tables(topology, free)
    compact = {"separators": (",", ":")}
    return (json.dumps({str(k): v for k, v in sorted(scores.items())}, **compact),
            json.dumps({str(k): v for k, v in sorted(losses.items())}, **compact))


def _devices(count, free, vfs_per_gpu=1):
    out = []
    for index in range(count):
        gpu = index // vfs_per_gpu
        bdf = "0000:%02x:00.%d" % (0x0b + gpu * 0x10, index % vfs_per_gpu)
        out.append({"id": bdf, "index": index, "bdf": bdf, "uuid": "GPU-it-%d" % index, "numa": gpu * 2 // 8,
                    "link_group": gpu // 4, "health": "Healthy", "allocated": index not in free})
    return json.dumps(out, separators=(",", ":"))


class Env:
    """Kubernetes objects of one test module run, removed at the end."""

    def __init__(self, cluster):
        from kubernetes import client
        self.cluster = cluster
        self.client = client
        self.api = cluster.api_client()
        self.core = client.CoreV1Api(self.api)
        self.suffix = uuid.uuid4().hex[:6]
        self.namespace = "gpu-aware-it-" + self.suffix
        self.nodes = {}
        self.registry = cluster.registry

    def node_name(self, short):
        return "gpu-aware-it-%s-%s" % (self.suffix, short)

    def create_node(self, short, capacity, annotations):
        name = self.node_name(short)
        labels = {"kubernetes.io/hostname": name, TAINT: self.suffix, "metax-tech.com/gpu.installed": "true"}
        body = {"metadata": {"name": name, "labels": labels, "annotations": annotations},
                "spec": {"taints": [{"key": TAINT, "value": self.suffix, "effect": "NoSchedule"}]}}
        self.core.create_node(body)
        resources = {"cpu": "64", "memory": "512Gi", "pods": "110", GPU: str(capacity)}
        self.core.patch_node_status(name, {"status": {"capacity": resources, "allocatable": resources}})
        self.nodes[short] = name
        return name

    def set_weights(self, score, loss):
        body = {"metadata": {"name": "gpu-aware-plugin", "namespace": self.namespace},
                "data": {"scoreWeight": str(score), "lossWeight": str(loss)}}
        try:
            self.core.replace_namespaced_config_map("gpu-aware-plugin", self.namespace, body)
        except self.client.ApiException as exc:
            if exc.status != 404:
                raise
            self.core.create_namespaced_config_map(self.namespace, body)

    def create_pod(self, name, scheduler, demand, nodes):
        container = {"name": "main", "image": "%s/%s" % (self.registry, PAUSE),
                     "resources": {"limits": {GPU: str(demand)}}}
        body = {"metadata": {"name": name, "namespace": self.namespace},
                "spec": {"schedulerName": scheduler, "containers": [container], "terminationGracePeriodSeconds": 0,
                         "tolerations": [{"key": TAINT, "operator": "Exists"},
                                         {"key": "node.kubernetes.io/not-ready", "operator": "Exists"},
                                         {"key": "node.kubernetes.io/unreachable", "operator": "Exists"}],
                         "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                             "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In",
                                                                     "values": [node]}]} for node in nodes]}}}}}
        self.core.create_namespaced_pod(self.namespace, body)

    def delete_pod(self, name):
        """Force-delete (no kubelet runs the hand-made nodes) and wait until it is gone."""
        self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)

        def gone():
            try:
                self.core.read_namespaced_pod(name, self.namespace)
                return False
            except self.client.ApiException as exc:
                return exc.status == 404

        _wait(gone, 60, "pod %s to be deleted" % name)

    def bound_node(self, name):
        pod = self.core.read_namespaced_pod(name, self.namespace)
        return pod.spec.node_name

    def phase(self, name):
        return self.core.read_namespaced_pod(name, self.namespace).status.phase

    def events(self, name):
        found = self.core.list_namespaced_event(self.namespace, field_selector="involvedObject.name=" + name)
        return [e.message or "" for e in found.items]

    def raw_node(self, name):
        resp = self.core.read_node(name, _preload_content=False)
        return json.loads(resp.data)

    def cleanup(self):
        try:
            self.core.delete_namespace(self.namespace, grace_period_seconds=0)
        except self.client.ApiException:
            pass
        for name in self.nodes.values():
            try:
                self.core.delete_node(name)
            except self.client.ApiException:
                pass


@pytest.fixture(scope="module")
def env(cluster):
    pytest.importorskip("kubernetes")
    env = Env(cluster)
    try:
        env.core.create_namespace({"metadata": {"name": env.namespace}})
        env.set_weights(1, 0)
        vf_scores, vf_losses = _tables("2xC550-sriov", range(8), vfs=4)
        env.create_node("vf", 8, {ANNOTATION_DEVICES: _devices(8, set(range(8)), vfs_per_gpu=4),
                                  ANNOTATION_SCORES: vf_scores, ANNOTATION_LOSSES: vf_losses})
        pair_scores, pair_losses = _tables("8xC500", [0, 4])
        env.create_node("pair", 2, {ANNOTATION_DEVICES: _devices(8, {0, 4}), ANNOTATION_SCORES: pair_scores,
                                    ANNOTATION_LOSSES: pair_losses})
        busy_scores, busy_losses = _tables("8xC500", [2, 7])
        env.create_node("busy", 8, {ANNOTATION_DEVICES: _devices(8, {2, 7}), ANNOTATION_SCORES: busy_scores,
                                    ANNOTATION_LOSSES: busy_losses})
        env.create_node("stale", 8, {ANNOTATION_DEVICES: _devices(2, {0, 1})})
        yield env
    finally:
        env.cleanup()


class Running:
    """gpu-aware + a second kube-scheduler using it, for one nodeCacheCapable mode."""

    def __init__(self, env, cluster, tmp, node_cache):
        self.env = env
        self.port = free_port()
        self.scheduler_name = "metax-gpu-aware-it-%s-%s" % (env.suffix, "cache" if node_cache else "nodes")
        environment = dict(os.environ, PYTHONPATH=COLLECTIONS)
        environment.pop("POD_NAMESPACE", None)
        self.agent_log = open(os.path.join(tmp, "gpu-aware.log"), "wb")
        self.agent = subprocess.Popen(
            [sys.executable, "-m", AGENT, "--address", "127.0.0.1", "--port", str(self.port), "--kubeconfig",
             cluster.kubeconfig, "--namespace", env.namespace, "--score-weight", "1", "--loss-weight", "1",
             "--log-format", "text", "--log-level", "debug", "--resync-seconds", "60"] +
            ([] if node_cache else ["--no-node-cache"]),
            stdout=self.agent_log, stderr=subprocess.STDOUT, env=environment)
        _wait(lambda: self._get("/readyz") == 200, 60, "gpu-aware ready")
        config = os.path.join(tmp, "scheduler.yaml")
        with open(config, "w", encoding="utf-8") as handle:
            handle.write(SCHEDULER_CONFIG.format(kubeconfig=cluster.kubeconfig, name=self.scheduler_name,
                                                 port=self.port, cache=str(node_cache).lower()))
        self.scheduler_log = open(os.path.join(tmp, "kube-scheduler.log"), "wb")
        binary = os.path.join(cluster.info["METAX_KUBE_BIN"], "kube-scheduler")
        self.scheduler = subprocess.Popen([binary, "--config", config, "--secure-port=0", "--v=2"],
                                          stdout=self.scheduler_log, stderr=subprocess.STDOUT)

    def _get(self, path):
        try:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
            conn.request("GET", path)
            resp = conn.getresponse()
            self.last_body = resp.read().decode()
            conn.close()
            return resp.status
        except OSError:
            if self.agent.poll() is not None:
                raise AssertionError("gpu-aware exited:\n" + self.log_tail())
            return None

    def metrics(self):
        self._get("/metrics")
        return self.last_body

    def log_tail(self, lines=40):
        out = []
        for log in (self.agent_log, self.scheduler_log):
            log.flush()
            with open(log.name, "rb") as handle:
                out.append("== %s\n%s" % (log.name, b"\n".join(handle.read().splitlines()[-lines:]).decode()))
        return "\n".join(out)

    def stop(self):
        for proc in (self.scheduler, self.agent):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in (self.scheduler, self.agent):
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.agent_log.close()
        self.scheduler_log.close()
        return self.agent.returncode


SCHEDULER_CONFIG = """\
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: {kubeconfig}
leaderElection:
  leaderElect: false
profiles:
  - schedulerName: {name}
extenders:
  - urlPrefix: http://127.0.0.1:{port}
    filterVerb: filter
    prioritizeVerb: prioritize
    weight: 500
    enableHTTPS: false
    nodeCacheCapable: {cache}
    ignorable: false
    managedResources:
      - name: metax-tech.com/gpu
        ignoredByScheduler: false
"""


def _candidates(env, demand):
    """Nodes that can reach prioritize for a pod limited to vf, pair and the kubelet node: name -> GpuState."""
    out = {}
    for short in ("vf", "pair"):
        state = gpu_state(node_fields(env.raw_node(env.nodes[short])))
        if state.fit >= demand:
            out[env.nodes[short]] = state
    kubelet = env.raw_node(env.cluster.node_name)
    allocatable = (kubelet.get("status") or {}).get("allocatable") or {}
    try:
        has_gpus = int(allocatable.get(GPU, "0")) >= demand
    except ValueError:
        has_gpus = False
    state = gpu_state(node_fields(kubelet))
    if has_gpus and state.fit >= demand:
        out[env.cluster.node_name] = state
    return out


def _favoured(candidates, demand, weights, kubelet_may_drop_out=True):
    """Every node that may win: the top score over all candidates and, when the kubelet node may be
    filtered out by kube-scheduler itself (pressure, taints), over the hand-made ones alone."""
    winners = set()
    subsets = [list(candidates)]
    if kubelet_may_drop_out:
        subsets.append([n for n in candidates if n.startswith("gpu-aware-it-")])
    for names in subsets:
        if not names:
            continue
        states = [candidates[n] for n in names]
        scores = prioritize(demand, states, weights)
        top = max(scores)
        winners.update(n for n, s in zip(names, scores) if s == top)
    return winners


@pytest.mark.parametrize("node_cache", [False, True], ids=["nodeCacheCapable-false", "nodeCacheCapable-true"])
def test_real_scheduler_follows_the_weights(env, cluster, tmp_path, node_cache):
    run = Running(env, cluster, str(tmp_path), node_cache)
    mode = "c" if node_cache else "n"
    try:
        allowed = [env.nodes["vf"], env.nodes["pair"], cluster.node_name]
        plan = [("score", 1, 0, env.nodes["vf"]), ("loss", 0, 1, env.nodes["pair"]),
                ("score-again", 1, 0, env.nodes["vf"])]
        for step, score_weight, loss_weight, expected in plan:
            env.set_weights(score_weight, loss_weight)
            _wait(lambda: ('gpu_aware_weight{name="score"} %d' % score_weight in run.metrics() and
                           'gpu_aware_weight{name="loss"} %d' % loss_weight in run.last_body),
                  60, "gpu-aware to apply scoreWeight=%s lossWeight=%s" % (score_weight, loss_weight))
            favoured = _favoured(_candidates(env, 2), 2, Weights(score_weight, loss_weight))
            assert expected in favoured, (step, favoured)
            pod = "p-%s-%s" % (mode, step)
            env.create_pod(pod, run.scheduler_name, 2, allowed)
            try:
                node = _wait(lambda: env.bound_node(pod), 90, "pod %s to be bound" % pod)
            except AssertionError:
                raise AssertionError("%s not scheduled; events %s\n%s" % (pod, env.events(pod), run.log_tail()))
            assert node in favoured, (step, node, favoured, run.log_tail())
            if favoured == {expected}:
                assert node == expected
            env.delete_pod(pod)              # give the devices back for the next step
        # An invalid value is rejected, the last good weights stay.
        env.core.patch_namespaced_config_map("gpu-aware-plugin", env.namespace, {"data": {"scoreWeight": "heavy"}})
        _wait(lambda: "gpu_aware_config_valid 0" in run.metrics(), 60, "the invalid ConfigMap to be reported")
        assert 'gpu_aware_weight{name="score"} 1' in run.last_body
        env.set_weights(1, 0)

        # A pod that fits nowhere: the scheduler's own resource check passes (allocatable 8), gpu-aware says no.
        pod = "p-%s-nowhere" % mode
        env.create_pod(pod, run.scheduler_name, 4, [env.nodes["busy"], env.nodes["stale"]])

        def reasons():
            messages = [m for m in env.events(pod) if "gpu-aware" in m]
            return messages if any(reason_free(4) in m for m in messages) else None

        messages = _wait(reasons, 90, "FailedScheduling with gpu-aware's reason")
        assert any(reason_total(4) in m for m in messages), messages
        time.sleep(2)
        assert env.bound_node(pod) is None
        assert "gpu_aware_filter_nodes_total" in run.metrics()
        env.delete_pod(pod)
    finally:
        code = run.stop()
    assert code == 0, "gpu-aware did not stop cleanly"


def _kubelet_all_free(env, count=8):
    node = env.raw_node(env.cluster.node_name)
    annotations = node["metadata"].get("annotations") or {}
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    state = gpu_state(node_fields(node))
    return (allocatable.get(GPU) == str(count) and state.source == "devices" and state.free == count
            and ANNOTATION_SCORES in annotations)


@pytest.mark.parametrize("node_cache", [False, True], ids=["nodeCacheCapable-false", "nodeCacheCapable-true"])
def test_real_scheduler_with_the_kubelet_node(env, cluster, device_agent, tmp_path, node_cache):
    assert device_agent is not None
    _wait(lambda: _kubelet_all_free(env), 120, "gpu-device to publish 8 free GPUs on the kubelet node")
    run = Running(env, cluster, str(tmp_path), node_cache)
    mode = "kc" if node_cache else "kn"
    try:
        kubelet = cluster.node_name
        allowed = [env.nodes["vf"], env.nodes["pair"], kubelet]
        for step, score_weight, loss_weight, expected in (("loss", 0, 1, kubelet),
                                                          ("score", 1, 0, env.nodes["vf"])):
            _wait(lambda: _kubelet_all_free(env), 120, "the kubelet node's GPUs to be free again")
            env.set_weights(score_weight, loss_weight)
            _wait(lambda: ('gpu_aware_weight{name="score"} %d' % score_weight in run.metrics() and
                           'gpu_aware_weight{name="loss"} %d' % loss_weight in run.last_body),
                  60, "gpu-aware to apply scoreWeight=%s lossWeight=%s" % (score_weight, loss_weight))
            candidates = _candidates(env, 4)
            assert kubelet in candidates, "the kubelet node is not a 4-GPU candidate"
            favoured = _favoured(candidates, 4, Weights(score_weight, loss_weight), kubelet_may_drop_out=False)
            assert favoured == {expected}, (step, favoured)
            pod = "p-%s-%s" % (mode, step)
            env.create_pod(pod, run.scheduler_name, 4, allowed)
            try:
                node = _wait(lambda: env.bound_node(pod), 90, "pod %s to be bound" % pod)
            except AssertionError:
                raise AssertionError("%s not scheduled; events %s\n%s" % (pod, env.events(pod), run.log_tail()))
            assert node == expected, (step, node, run.log_tail())
            if node == kubelet:
                phase = _wait(lambda: env.phase(pod) != "Pending" and env.phase(pod), 120,
                              "the kubelet to start %s" % pod)
                assert phase == "Running", (phase, env.events(pod))
            env.delete_pod(pod)
    finally:
        code = run.stop()
    assert code == 0, "gpu-aware did not stop cleanly"
