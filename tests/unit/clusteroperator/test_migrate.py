# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The move of an older install's namespaced ClusterOperator to the cluster-scoped CRD: the pure
parts of clusteroperator/migrate.py. The whole path against a real kube-apiserver (with its garbage
collector): tests/integration/test_operator_migration_apiserver.py."""

from __future__ import annotations

from ansible_collections.metax.gpu.plugins.module_utils import names as N
from ansible_collections.metax.gpu.plugins.module_utils.clusteroperator import migrate

OLD = {
    "apiVersion": "gpu.metax-tech.com/v1alpha1", "kind": "ClusterOperator",
    "metadata": {"name": "cluster-operator", "namespace": "metax-operator", "uid": "old-uid", "generation": 4,
                 "resourceVersion": "99", "finalizers": [N.OPERATOR_FINALIZER],
                 "labels": {"app.kubernetes.io/managed-by": "Helm", "app.kubernetes.io/instance": "metax-operator-1"},
                 "annotations": {"meta.helm.sh/release-name": "metax-operator-1",
                                 "meta.helm.sh/release-namespace": "metax-operator",
                                 N.OPERATOR_GROUP + "/last-handled-configuration": "{}",
                                 N.OPERATOR_GROUP + "/reconcile": "{}",
                                 "kopf.zalando.org/touch-dummy": "x"}},
    "spec": {"devicePlugin": {"healthyInterval": 3}, "vfioManager": {"deploy": False}},
    "status": {"conditions": []},
}


def test_the_carried_over_cr_is_cluster_scoped_with_the_same_spec_and_release():
    new = migrate.carried_over(OLD)
    assert "namespace" not in new["metadata"] and "uid" not in new["metadata"] and "status" not in new
    assert "finalizers" not in new["metadata"] and "resourceVersion" not in new["metadata"]
    assert new["spec"] == OLD["spec"] and new["metadata"]["name"] == N.OPERATOR_CR_NAME
    assert new["metadata"]["labels"] == OLD["metadata"]["labels"]
    assert new["metadata"]["annotations"] == {
        "meta.helm.sh/release-name": "metax-operator-1", "meta.helm.sh/release-namespace": "metax-operator",
        N.ANNOTATION_OPERATOR_OWNER_ID: "old-uid"}


def test_a_second_move_keeps_the_first_owner_id():
    once = dict(OLD, metadata=dict(OLD["metadata"], uid="second-uid",
                                   annotations={N.ANNOTATION_OPERATOR_OWNER_ID: "old-uid"}))
    assert migrate.carried_over(once)["metadata"]["annotations"][N.ANNOTATION_OPERATOR_OWNER_ID] == "old-uid"


def _deployment(revision):
    return {"metadata": {"annotations": {"deployment.kubernetes.io/revision": revision}}}


def _rs(revision, pod_hash):
    return {"metadata": {"annotations": {"deployment.kubernetes.io/revision": revision},
                         "labels": {"pod-template-hash": pod_hash}}}


def _pod(name, pod_hash):
    return {"metadata": {"name": name, "labels": {"pod-template-hash": pod_hash}}}


def test_old_controllers_are_the_pods_not_of_the_newest_replica_set():
    sets = [_rs("1", "aaa"), _rs("2", "bbb")]
    pods = [_pod("c-aaa-1", "aaa"), _pod("c-bbb-1", "bbb"), _pod("c-bbb-2", "bbb")]
    assert migrate.old_controllers(_deployment("2"), sets, pods) == ["c-aaa-1"]
    assert migrate.old_controllers(_deployment("2"), sets, pods[1:]) == []
    # the Deployment not rolled out yet (no ReplicaSet of its revision): every pod is an old one
    assert migrate.old_controllers(_deployment("3"), sets, pods[1:]) == ["c-bbb-1", "c-bbb-2"]


def test_without_owner_drops_only_the_old_crs_reference():
    refs = [{"uid": "old-uid", "kind": "ClusterOperator"}, {"uid": "other", "kind": "Something"}]
    assert migrate.without_owner(refs, "old-uid") == [{"uid": "other", "kind": "Something"}]
    assert migrate.without_owner(refs[:1], "old-uid") == []
    assert migrate.without_owner(refs[1:], "old-uid") is None      # nothing to patch


def test_with_scope_changes_only_the_scope_of_a_copy():
    crd = {"metadata": {"name": migrate.CRD_NAME}, "spec": {"scope": "Cluster", "group": "g", "versions": [{}]}}
    out = migrate.with_scope(crd, "Namespaced")
    assert out == {"metadata": {"name": migrate.CRD_NAME}, "spec": {"scope": "Namespaced", "group": "g", "versions": [{}]}}
    assert crd["spec"]["scope"] == "Cluster"
