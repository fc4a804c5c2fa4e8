"""The bad inputs issue 39 names (finding 10), one by one: a clear error, nothing changed, check mode too.

tests/unit/test_module_inputs.py covers every module with generic hostile values; these are the reported cases
with the outcome each must have.
"""
from __future__ import annotations

import os

import pytest

from ansible_collections.metax.gpu.plugins.modules import (cdi_runtime, evict_gpu_pods, maca, offline_bundle,
                                                           registry_push, scheduler_extender)

from module_runner import run_module, tree


@pytest.fixture
def kubeconfig(tmp_path):
    """A kubeconfig whose server nothing listens on: a call that got through would fail differently."""
    path = tmp_path / "kubeconfig"
    path.write_text("apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: k\n  cluster:\n"
                    "    server: https://127.0.0.1:9\ncontexts:\n- name: c\n  context:\n    cluster: k\n    user: u\n"
                    "users:\n- name: u\n  user:\n    token: abc\n")
    return str(path)


@pytest.mark.parametrize("node_name", ["", " ", "a,spec.nodeName!=b", "Node-1", "-x", "x" * 254])
@pytest.mark.parametrize("check_mode", [True, False])
def test_evict_gpu_pods_refuses_what_is_not_a_node_name(kubeconfig, node_name, check_mode):
    failed, result = run_module(evict_gpu_pods, {"node_name": node_name, "kubeconfig": kubeconfig},
                                check_mode=check_mode)
    assert failed and not result.get("changed")
    assert "is not a node name" in result["msg"]         # refused before the API was asked (not "cannot reach")


def test_evict_gpu_pods_unreachable_api_is_one_line(kubeconfig):
    failed, result = run_module(evict_gpu_pods, {"node_name": "node-1", "kubeconfig": kubeconfig}, check_mode=True)
    assert failed and "\n" not in result["msg"]
    assert result["msg"].startswith("cannot reach the Kubernetes API server https://127.0.0.1:9 (kubeconfig %s)" % kubeconfig)


@pytest.mark.parametrize("keep", [-1, -100])
def test_maca_refuses_a_negative_keep(tmp_path, keep):
    before = tree(str(tmp_path))
    for check_mode in (True, False):
        failed, result = run_module(maca, {"host_root": str(tmp_path), "version": "2.23.0.4", "keep": keep},
                                    check_mode=check_mode)
        assert failed and "keep must be 0 or more" in result["msg"]
        assert tree(str(tmp_path)) == before


@pytest.mark.parametrize("url", ["not a url", "ftp://x:21", "http://", "10.96.12.34:8080", "http://x:99999",
                                 "http://x:0", "http://a b:80"])
def test_scheduler_extender_refuses_a_url_that_is_not_one(tmp_path, url):
    before = tree(str(tmp_path))
    failed, result = run_module(scheduler_extender, {"host_root": str(tmp_path), "url": url, "wait": False},
                                check_mode=True)
    assert failed and "url" in result["msg"] and repr(url) in result["msg"]
    assert tree(str(tmp_path)) == before


@pytest.mark.parametrize("registry", ["a b", "a b/cloud", "r.example:99999/cloud", "https://r.example/cloud",
                                      "r.example/$(id)"])
def test_offline_bundle_refuses_a_registry_that_is_not_one(tmp_path, registry):
    out = tmp_path / "out" / "b.run"
    failed, result = run_module(offline_bundle, {"path": str(out), "version": "1.0", "images": [],
                                                 "registry": registry}, check_mode=True)
    assert failed and "registry" in result["msg"]
    assert not out.parent.exists()


@pytest.mark.parametrize("registry", ["127.0.0.1:99999", "127.0.0.1:0/x", "a b"])
def test_registry_push_refuses_a_port_out_of_range(tmp_path, registry):
    src = tmp_path / "x.tar"
    src.write_bytes(b"")
    failed, result = run_module(registry_push, {"src": str(src), "registry": registry, "plain_http": True})
    assert failed and "registry" in result["msg"]


def test_cdi_runtime_refuses_a_host_root_that_does_not_exist(tmp_path):
    missing = str(tmp_path / "node")
    failed, result = run_module(cdi_runtime, {"host_root": missing})
    assert failed and missing in result["msg"]
    assert not os.path.exists(missing)


def test_cdi_runtime_asks_the_nodes_runtime_not_this_machines(tmp_path):
    """An existing root without containerd: the version is not taken from the machine running the module."""
    failed, result = run_module(cdi_runtime, {"host_root": str(tmp_path)}, check_mode=True)
    assert failed and "containerd is not installed under host_root %s" % tmp_path in result["msg"]
    assert "runtime_version" in result["msg"]
