# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The GPU Operator scheme the administrator's way, on the local three-node cluster (issue 24, item 4).

ansible-playbook metax.gpu.site -e metax_gpu_scheme=operator with
docs/examples/local-cluster-inventory.yml: the images (operator-controller
included) and both charts go into the offline bundle and are pushed to the
local registry, the chart is installed from oci:// as the manual's 3.2.1 does,
the ClusterOperator becomes Ready and metax.gpu.verify passes (the Molecule
scenario ``operator`` run action by action: molecule_scenario.py). Then: a second
site run changes nothing, check mode with diff changes nothing, the GPU
Extensions scheme is refused while the operator is installed with nothing
changed (the other way round is test_e2e_site's, on its install), metax.gpu.uninstall leaves nothing of ours,
and the manual's 3.2.1 command as written installs from the local registry.

The tests of this module run in order (each builds on the cluster state of the
one before); a release of either chart found before is uninstalled for the
module's duration and installed again afterwards (fixture releases_aside).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest
from molecule_scenario import molecule
from playbook_output import recap
from playbook_runs import run_concurrently
from polling import wait_until
from test_operator_cluster import UNINSTALL_SCRIPT

from ansible_collections.metax.gpu.plugins.module_utils import names as N

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
INVENTORY = os.path.join(ROOT, "docs", "examples", "local-cluster-inventory.yml")
NS = N.OPERATOR_NAMESPACE
EXT_NS = "metax-gpu"                 # gpu_extensions_namespace's default, kept by the example inventory
PROJECT = "metax-gpu"                # push_artifacts_project of the example inventory
CRD = N.OPERATOR_PLURAL + "." + N.OPERATOR_GROUP
IMAGES = ("gpu-device", "gpu-label", "gpu-aware", "gpu-exporter", "operator-controller")
CHARTS = ("metax-gpu-extensions", "metax-operator")
pytestmark = pytest.mark.cluster


def playbook_cmd(cluster, name, *extra, scheme="operator"):
    return [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", INVENTORY,
            "-e", "metax_gpu_kubeconfig=" + cluster.kubeconfig, "-e", "metax_gpu_scheme=" + scheme,
            "metax.gpu." + name] + list(extra)


def playbook(cluster, name, *extra, scheme="operator"):
    start = time.monotonic()
    proc = subprocess.run(playbook_cmd(cluster, name, *extra, scheme=scheme), capture_output=True, text=True,
                          env=cluster.env, timeout=1800, check=False)
    return proc, round(time.monotonic() - start, 1)


def read_only_playbooks(cluster, *runs, scheme="operator"):
    """playbook's (proc, seconds) of each (name, *extra) in ``runs``, all run at the same time: only for runs that
    change nothing (check mode, or refused before any change), which cannot get in each other's way
    (playbook_runs)."""
    results = run_concurrently([playbook_cmd(cluster, *run, scheme=scheme) for run in runs], cluster.env, 1800)
    return [(proc, round(secs, 1)) for proc, secs in results]


def ok(proc):
    assert proc.returncode == 0, "%s\n%s" % (proc.stdout[-6000:], proc.stderr[-3000:])
    return proc.stdout


def helm_releases(cluster):
    res = subprocess.run([cluster.helm or "helm", "list", "-A", "-a", "-o", "json"], env=cluster.env,
                         capture_output=True, text=True, timeout=60, check=True)
    return sorted((r["namespace"], r["name"], r["chart"], r["revision"]) for r in json.loads(res.stdout or "[]"))


def get_json(cluster, *args):
    res = cluster.kubectl("get", "-o", "json", *args)
    return json.loads(res.stdout) if res.returncode == 0 else None


def nodes(cluster):
    return {n["metadata"]["name"]: n for n in cluster.read_nodes()}


def ours(node):
    meta = node["metadata"]
    return {k: v for part in ("labels", "annotations") for k, v in (meta.get(part) or {}).items()
            if k.startswith(N.PREFIX)}


def workloads(cluster):
    """Every DaemonSet/Deployment of either scheme, with its generation: what a refused run must not touch."""
    out = {}
    for ns in (NS, EXT_NS):
        for item in (get_json(cluster, "daemonsets,deployments", "-n", ns) or {"items": []})["items"]:
            out[(ns, item["kind"], item["metadata"]["name"])] = item["metadata"]["generation"]
    return out


def cr(cluster):
    return get_json(cluster, "clusteroperator", N.OPERATOR_CR_NAME, "-n", NS)


def cr_ready(body):
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in ((body or {}).get("status") or {}).get("conditions", []))


def registry_tags(cluster, repo):
    url = "http://%s/v2/%s/%s/tags/list" % (cluster.registry, PROJECT, repo)
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return json.loads(resp.read()).get("tags") or []
    except OSError:
        return []


def assert_nothing_of_ours(cluster):
    assert [r for r in helm_releases(cluster) if r[2].startswith(CHARTS)] == []
    assert cluster.kubectl("get", "crd", CRD).returncode != 0, "the ClusterOperator CRD is left"
    for ns in (NS, EXT_NS):
        assert cluster.kubectl("get", "namespace", ns).returncode != 0, "namespace %s is left" % ns
    for name, node in nodes(cluster).items():
        assert ours(node) == {}, (name, ours(node))
    roles = get_json(cluster, "clusterroles")["items"]
    assert not [r["metadata"]["name"] for r in roles
                if (r["metadata"].get("labels") or {}).get(N.LABEL_OPERATOR_OWNER)
                or (r["metadata"].get("labels") or {}).get("app.kubernetes.io/part-of") == "metax-gpu-extensions"]


@pytest.fixture(scope="module")
def releases_aside(cluster):
    """Uninstall a release of either chart that another test or the demo left; install it again afterwards.

    This module installs and removes both schemes, and refuses one where the other is: it needs a cluster with
    neither. The releases found are put back with their values (charts from the checkout) when it ends.
    """
    helm = cluster.helm or "helm"
    saved = []
    for ns, name, chart, _rev in [r for r in helm_releases(cluster) if r[2].startswith(CHARTS)]:
        values = subprocess.run([helm, "get", "values", name, "-n", ns, "-o", "json"], env=cluster.env,
                                capture_output=True, text=True, timeout=60, check=True).stdout
        saved.append((ns, name, chart.rsplit("-", 1)[0], values))
        res = subprocess.run([helm, "uninstall", name, "-n", ns, "--wait"], env=cluster.env, capture_output=True,
                             text=True, timeout=600, check=False)
        assert res.returncode == 0, res.stderr
    yield [name for _ns, name, _chart, _values in saved]
    for ns, name, chart, values in saved:
        subprocess.run([helm, "install", name, os.path.join(ROOT, "files", "charts", chart), "-n", ns,
                        "--create-namespace", "--wait", "--values", "-"], input=values, env=cluster.env,
                       capture_output=True, text=True, timeout=600, check=False)


@pytest.fixture(scope="module")
def site(cluster, releases_aside):
    assert [r for r in helm_releases(cluster) if r[2].startswith(CHARTS)] == [], helm_releases(cluster)
    # the administrator's dry run on a cluster without the operator: what would change, and nothing changes
    dry_before = (helm_releases(cluster), cluster.kubectl("get", "namespace", NS).returncode)
    dry, _secs = playbook(cluster, "install", "--check", "--diff")
    dry_after = (helm_releases(cluster), cluster.kubectl("get", "namespace", NS).returncode)
    out, secs = molecule(cluster, "operator", "converge")     # metax.gpu.site -e metax_gpu_scheme=operator
    state = {"stdout": out, "seconds": secs, "dry_run": dry, "dry_before": dry_before, "dry_after": dry_after,
             "clean": False}
    yield state
    # the uninstall is a test below; this only makes sure nothing stays when a test failed
    if not state["clean"]:
        playbook(cluster, "uninstall")


def test_site_installs_the_operator_from_the_registry_and_verifies(cluster, site):
    out = site["stdout"]
    body = cr(cluster)
    assert cr_ready(body), body.get("status")
    # the same verification as Extensions (manual 3.2.4 = 2.1.3) ran on the operator's namespace
    assert "GPU node(s) verified" in out and "DaemonSets ready: " in out
    releases = [r for r in helm_releases(cluster) if r[2].startswith("metax-operator")]
    assert len(releases) == 1 and releases[0][0] == NS and releases[0][1].startswith("metax-operator-"), releases
    # installed from oci://DOMAIN/PROJECT/metax-operator (the version pushed there), --set registry=DOMAIN/PROJECT
    assert releases[0][2].rsplit("-", 1)[1] in registry_tags(cluster, "metax-operator")
    values = json.loads(subprocess.run([cluster.helm or "helm", "get", "values", releases[0][1], "-n", NS, "-o", "json"],
                                       env=cluster.env, capture_output=True, text=True, check=True).stdout)
    assert values["registry"] == "%s/%s" % (cluster.registry, PROJECT)
    # the bundle carried both charts and every image, and push_artifacts pushed them
    for repo in IMAGES + CHARTS:
        assert registry_tags(cluster, repo), "%s/%s not in the registry" % (PROJECT, repo)
    ctrl = get_json(cluster, "deployment", "operator-controller", "-n", NS)
    assert ctrl["spec"]["template"]["spec"]["containers"][0]["image"].startswith(
        "%s/%s/operator-controller:" % (cluster.registry, PROJECT))
    # every GPU node runs gpu-device from the operator, none from an Extensions release
    assert get_json(cluster, "daemonset", N.DAEMONSET_GPU_DEVICE, "-n", EXT_NS) is None
    ds = get_json(cluster, "daemonset", N.DAEMONSET_GPU_DEVICE, "-n", NS)
    assert ds["status"]["numberReady"] == len(cluster.nodes) >= 3
    assert ds["metadata"]["labels"]["app.kubernetes.io/managed-by"] == N.OPERATOR_FIELD_MANAGER


def test_check_mode_before_the_first_install_changes_nothing(cluster, site):
    out = ok(site["dry_run"])
    assert recap(out)["localhost"]["changed"] >= 1, out[-3000:]     # the release and the namespace would change
    assert site["dry_after"] == site["dry_before"]


def test_second_site_run_changes_nothing_and_verify_passes(cluster, site):
    molecule(cluster, "operator", "idempotence")   # molecule fails it on any changed task
    molecule(cluster, "operator", "verify")        # metax.gpu.verify + the CR Ready, gpu-device the controller's


def test_check_and_diff_change_nothing(cluster, site):
    before = (helm_releases(cluster), workloads(cluster), cr(cluster)["metadata"]["generation"])
    # both check-mode runs at once (reads, helm's and the apiserver's dry runs: nothing written)
    (unchanged, _secs), (changed, _secs) = read_only_playbooks(
        cluster, ("install", "--check", "--diff"),
        ("install", "--check", "--diff", "-e", "gpu_extensions_gpu_device_healthy_interval=7"))
    counts = recap(ok(unchanged))
    assert counts and all(c["changed"] == 0 for c in counts.values()), counts
    # a changed option shows as a diff in check mode and changes nothing
    out = ok(changed)
    assert recap(out)["localhost"]["changed"] >= 1, out[-3000:]
    assert "healthyInterval" in out
    assert (helm_releases(cluster), workloads(cluster), cr(cluster)["metadata"]["generation"]) == before


def test_extensions_refused_where_the_operator_is(cluster, site):
    before = (helm_releases(cluster), workloads(cluster), {n: ours(v) for n, v in nodes(cluster).items()},
              cluster.kubectl("get", "namespace", EXT_NS).returncode)
    # both at once: each is refused by metax.gpu.scheme_check (helm list and reads only) before any change, in
    # install's first role and in site's first play, whose failure ends the playbook
    for proc, _secs in read_only_playbooks(cluster, ("install",), ("site",), scheme="extensions"):
        assert proc.returncode != 0, proc.stdout[-3000:]
        assert "Refusing to install the GPU Extensions scheme: the GPU Operator scheme is installed" in proc.stdout
        assert "metax.gpu.uninstall" in proc.stdout and "helm list -q -f metax -n metax-operator" in proc.stdout
        assert all(c["changed"] == 0 for c in recap(proc.stdout).values()), recap(proc.stdout)
    assert (helm_releases(cluster), workloads(cluster), {n: ours(v) for n, v in nodes(cluster).items()},
            cluster.kubectl("get", "namespace", EXT_NS).returncode) == before


def test_uninstall_leaves_nothing_of_ours(cluster, site):
    molecule(cluster, "operator", "cleanup")       # metax.gpu.uninstall + its own nothing-left checks
    assert_nothing_of_ours(cluster)
    # and a second uninstall has nothing to do
    proc, _secs = playbook(cluster, "uninstall")
    counts = recap(ok(proc))
    assert all(c["changed"] == 0 for c in counts.values()), counts


def test_manual_install_command_as_written_from_the_local_registry(cluster, site):
    """Manual 3.2.1 word for word, DOMAIN/PROJECT = the local registry the playbooks pushed to; then 3.2.5."""
    domain_project = "%s/%s" % (cluster.registry, PROJECT)
    # with the payload flags of the manual (and of helm-install-operator-0.9.2.txt): the driver and MACA
    # components are on by default (issue 38) and refuse an install without them. These nodes' real root
    # has no MetaX GPU, so no payload is pulled here (the payloads' own tests pull theirs).
    command = ("helm install oci://%s/metax-operator --create-namespace -n metax-operator --generate-name --wait "
               "--set registry=%s --set driver.payload.version=2.29.0.13 --set maca.payload.registry=%s "
               "--set maca.payload.images={mxc500-maca:2.29.0.7-ubuntu22.04-amd64}"
               % (domain_project, domain_project, domain_project))
    start = time.monotonic()
    res = subprocess.run(["bash", "-c", command], env=cluster.env, capture_output=True, text=True, timeout=600,
                         check=False)
    try:
        assert res.returncode == 0, res.stdout + res.stderr
        print("\n%s: %.1fs" % (command, time.monotonic() - start))
        release = [r for r in helm_releases(cluster) if r[2].startswith("metax-operator")]
        assert len(release) == 1 and release[0][1].startswith("metax-operator-"), release
        body = cr(cluster)
        assert body["spec"]["devicePlugin"]["image"]["registry"] == domain_project
        # the whole product: the chain components on, with the flags' payloads, and driver-config at once
        assert body["spec"]["driver"]["payload"]["version"] == "2.29.0.13"
        # pullPolicy as the real CR carries it (clusteroperator-0.9.2.txt), from the global pullPolicy
        assert body["spec"]["maca"]["payload"] == {"registry": domain_project, "pullPolicy": "IfNotPresent",
                                                   "images": ["mxc500-maca:2.29.0.7-ubuntu22.04-amd64"]}
        assert all(body["spec"][key]["deploy"] for key in ("driver", "maca", "runtime"))
        assert get_json(cluster, "configmap", "driver-config", "-n", NS) is not None
        ctrl = get_json(cluster, "deployment", "operator-controller", "-n", NS)
        assert ctrl["status"].get("readyReplicas") == ctrl["spec"]["replicas"]
        # the controller deploys gpu-label everywhere (default hostRoot: these nodes' real root has no MetaX GPU)
        wait_until(lambda: (get_json(cluster, "daemonset", N.DAEMONSET_GPU_LABEL, "-n", NS) or {}).get("status", {}).get(
            "numberReady") == len(cluster.nodes), 120, "gpu-label on every node")
        # an operator installed by hand is found too: the Extensions scheme is refused
        proc, _secs = playbook(cluster, "install", scheme="extensions")
        assert proc.returncode != 0 and "the GPU Operator scheme is installed" in proc.stdout, proc.stdout[-3000:]
    finally:
        res = subprocess.run(["bash", "-c", UNINSTALL_SCRIPT], env=cluster.env, capture_output=True, text=True,
                             timeout=600, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert [r for r in helm_releases(cluster) if r[2].startswith("metax-operator")] == []
    for name, node in nodes(cluster).items():
        assert ours(node) == {}, (name, ours(node))
    # the CRD (helm keeps crds/) and the namespace: metax.gpu.uninstall takes them
    ok(playbook(cluster, "uninstall")[0])
    assert_nothing_of_ours(cluster)
    site["clean"] = True          # the module's last test: nothing for the fixture to take away
