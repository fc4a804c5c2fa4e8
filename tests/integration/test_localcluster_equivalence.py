# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""What runs is what tests/localcluster plans: checked against the running cluster.

The package writes and starts the cluster (scripts/cluster/cluster.sh only
delegates to it); what the bash version wrote and ran is compared in
tests/unit/localcluster/test_bash_fixtures.py. This test checks the running
cluster -- whichever checkout started it -- against the package's plan.
Read-only: it regenerates every configuration file from the cluster's own
inputs (its certificates, secrets, node table) and compares byte for byte,
with modes; certificates structurally (subject, SANs, usages, issuer, key,
signature); the component command lines and restart hashes, each node's bind
mounts (as its mount namespace sees them) and cgroups, iptables chains and pod
routes as they are; the baseline record and a teardown plan that must spare everything
the baseline lists. It needs no fixture of the cluster's: marked ``cluster``
so that a session brings the cluster up first (conftest.py); on a machine
whose cluster is shared, ``pytest --noconftest`` runs it without any `up`.
The same check as a command: ``PYTHONPATH=tests python3 -m localcluster compare``.
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from localcluster import equivalence  # noqa: E402
from localcluster.settings import from_env  # noqa: E402

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def results():
    settings = from_env(os.environ)
    assert os.path.isfile(settings.state_dir + "/nodes.json"), "no running cluster in %s" % settings.state_dir
    return equivalence.compare_running(settings)


def _group(results, predicate):
    chosen = [r for r in results if predicate(r)]
    assert chosen, "nothing of this kind was compared"
    bad = ["%s %s: %s" % (r.verdict, r.path, r.detail) for r in chosen if not r.ok]
    assert not bad, "\n".join(bad)
    return chosen


def _is_file(r):
    return r.path.startswith("/") and not r.path.endswith(".crt") and "/baseline/" not in r.path


def test_every_generated_file_is_byte_identical(results):
    files = _group(results, _is_file)
    # the node table, kubeconfigs, registries, registry hosts, scheduler, 5 per node, cluster.env, nodes.json
    assert len(files) >= 18 + 5 * 3
    assert all(r.verdict in ("identical", "patched") for r in files)
    assert sum(r.verdict == "patched" for r in files) <= 1  # only the scheduler manifest may be


def test_certificates_match_the_pki_plan(results):
    certs = _group(results, lambda r: r.path.endswith(".crt"))
    assert len(certs) >= 6 + 2 * 3 + 1  # the cluster's, two per node, the TLS registry's


def test_command_lines(results):
    procs = _group(results, lambda r: r.path.startswith("process "))
    assert {r.path for r in procs} >= {"process etcd", "process kube-apiserver", "process kubelet-vm"}


def test_health_urls_answer(results):
    ready = _group(results, lambda r: r.path.startswith("ready "))
    assert len(ready) >= 3 + 2 * 3  # etcd, apiserver, controller-manager; per node kubelet and kube-proxy


def test_node_mounts_and_cgroups(results):
    mounts = _group(results, lambda r: r.path.startswith("mount "))
    assert len(mounts) >= 2 + 6  # the first node's on the host, six per node
    _group(results, lambda r: r.path.startswith("cgroupRoot "))


def test_network(results):
    _group(results, lambda r: r.path.startswith("iptables "))
    _group(results, lambda r: r.path.startswith("route "))


def test_baseline_and_teardown_plan(results):
    _group(results, lambda r: "/baseline/" in r.path or r.path.startswith("teardown plan"))
