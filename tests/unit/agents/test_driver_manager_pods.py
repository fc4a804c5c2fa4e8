# -*- coding: utf-8 -*-
"""driver-manager learns which pods hold its node's GPUs from the kubelet (pod-resources API), not
from a pod list: its ClusterRole has no pods list/watch (issue 39, docs/security.md)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

import pytest

grpc = pytest.importorskip("grpc")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "deviceplugin"))
from kubelet_peer import PodResourcesPeer  # noqa: E402

from ansible_collections.metax.gpu.plugins.module_utils.agents import driver_manager as dm  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.kube.client import ApiException  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.kubelet import podresources  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.kubelet.podresources import PodResourcesError  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.names import RESOURCE_NAME  # noqa: E402


@pytest.fixture(name="kubelet")
def kubelet_fixture():
    directory = tempfile.mkdtemp(prefix="mxdm-", dir="/tmp")     # unix socket paths are short
    peer = PodResourcesPeer(os.path.join(directory, "kubelet.sock"))
    peer.start()
    yield peer
    peer.stop()
    shutil.rmtree(directory, ignore_errors=True)


class EvictingCore:
    """CoreV1Api without any pod list: the eviction takes the pod's assignment off the kubelet."""

    def __init__(self, kubelet, blocked=()):
        self.kubelet = kubelet
        self.blocked = set(blocked)
        self.evicted = []

    def list_pod_for_all_namespaces(self, **kwargs):
        raise AssertionError("driver-manager may not list pods")

    def create_namespaced_pod_eviction(self, name, namespace, body):
        assert body["kind"] == "Eviction" and body["metadata"] == {"name": name, "namespace": namespace}
        if name in self.blocked:
            exc = ApiException()
            exc.status, exc.reason, exc.body = 429, "Too Many Requests", None
            raise exc
        self.evicted.append("%s/%s" % (namespace, name))
        self.kubelet.assignments = [a for a in self.kubelet.assignments if (a[0], a[1]) != (namespace, name)]


def kube(core, kubelet):
    k = dm.Kube.__new__(dm.Kube)
    k.core, k.node = core, "n1"
    k.holders = podresources.gpu_holders(kubelet.socket)
    return k


def test_the_holders_are_the_kubelets_assignments_of_the_gpu_resource(kubelet):
    kubelet.assignments = [("ml", "train", "main", RESOURCE_NAME, ["GPU-1"]),
                           ("ml", "train", "sidecar", RESOURCE_NAME, ["GPU-2"]),
                           ("web", "nic", "main", "example.com/nic", ["nic-0"]),
                           ("ml", "infer", "main", RESOURCE_NAME, ["GPU-3"])]
    holders = podresources.gpu_holders(kubelet.socket)
    assert holders() == ["ml/infer", "ml/train"]
    kubelet.assignments = []
    assert holders() == [] and kubelet.calls == 2        # asked again at each call


def test_gpu_pods_and_eviction_without_a_pod_list(kubelet):
    kubelet.assignments = [("ml", "a", "c", RESOURCE_NAME, ["GPU-1"]), ("ml", "b", "c", RESOURCE_NAME, ["GPU-2"])]
    core = EvictingCore(kubelet)
    k = kube(core, kubelet)
    assert k.gpu_pods() == ["ml/a", "ml/b"] and core.evicted == []
    assert k.evict_gpu_pods(timeout=60) == ["ml/a", "ml/b"]
    assert core.evicted == ["ml/a", "ml/b"] and k.gpu_pods() == []


def test_a_budgets_refusal_ends_the_call_at_once(kubelet):
    kubelet.assignments = [("ml", "a", "c", RESOURCE_NAME, ["GPU-1"])]
    k = kube(EvictingCore(kubelet, blocked={"a"}), kubelet)
    with pytest.raises(dm.kube_evict.EvictionError) as caught:
        k.evict_gpu_pods(timeout=300)
    assert caught.value.remaining == ["ml/a"]


def test_no_kubelet_socket_is_a_clear_error():
    holders = podresources.gpu_holders("/tmp/mxdm-none/kubelet.sock")
    with pytest.raises(PodResourcesError, match="mxdm-none/kubelet.sock"):
        holders()


def test_the_flag_names_the_socket():
    args = dm.build_parser().parse_args(["--pod-resources-socket", "/x/kubelet.sock"])
    assert args.pod_resources_socket == "/x/kubelet.sock"
    assert dm.build_parser().parse_args([]).pod_resources_socket == "/var/lib/kubelet/pod-resources/kubelet.sock"
