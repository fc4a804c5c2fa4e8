# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""gpu-device in CDI mode on the local cluster: the real kubelet, containerd 2.4 and its CDI resolution.

gpu-device runs with ``--cdi-mode auto`` and the node's ``/var/run/cdi``
mounted, as the chart deploys it; the node's containerd 2.4 reads CDI by
default, so gpu-device must choose CDI mode by itself. A pod asking for two
GPUs then gets exactly the allocator's pair, the host's MXMACA read-only on
/opt/maca and its environment, all from the spec, through ``cdi_devices``
(gpu-device's answer carries no device node). A failed GPU leaves the spec,
a new pod still starts on the remaining ones, and the GPU comes back into
the spec on recovery.

It runs on the second node (4xN100) when the cluster has one: the first
node's directories are also the machine's standard paths (the local
cluster's host binds), which other sessions' tools may share. The simulated
root gets a MACA for the module and loses it afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid

import pytest

pytestmark = pytest.mark.cluster

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from test_gpu_device_cluster import (ANNOTATIONS, DEVICE_ARGS, GPU, NS, SIM_MOUNT, Agents,  # noqa: E402
                                     devices_annotation, wait_for, wait_registered)

from ansible_collections.metax.gpu.plugins.module_utils.gpu.allocator import allocate  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.host import HostRoot  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.sim.spec import preset  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.gpu.discovery import discover  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.names import CDI_SPEC_DIR, CDI_SPEC_FILE  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.sim import generator  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.sim.maca import MACA_LINK, install_maca, maca_dir  # noqa: E402

MACA_VERSION = "3.0.0.8"
SPEC = CDI_SPEC_DIR + "/" + CDI_SPEC_FILE
# what a GPU container reports: its DRM nodes, /dev/mxcd, MACA's version and mount options, the environment
SCRIPT = ("echo dri: $(ls /dev/dri | sort); echo mxcd: $(ls /dev/mxcd); echo maca: $(head -1 /opt/maca/Version.txt); "
          "echo mount: $(awk '$2 == \"/opt/maca\" {print $4}' /proc/mounts); "
          "env | grep -E '^(METAX_|MACA_PATH=|LD_LIBRARY_PATH=)' | sort; sleep 3600")


class NodeAgents(Agents):
    """Agents on one chosen node: its name, and its simulated root as the machine sees it."""

    def __init__(self, cluster, images, node):
        super().__init__(cluster, images)
        self.node = node["name"]
        self.preset = node["preset"]
        self.host_sim = node["sim_root"]     # on the machine; in the node it is at self.sim_root

    def sim(self):
        return HostRoot(self.host_sim)

    def recreate_sim(self, preset_name, vfs=0):
        assert not vfs
        return generator.create(self.host_sim, preset(preset_name), force=True)

    def gpus(self):
        return len(generator.load_state(self.sim())["gpus"])


def start_gpu_device_auto(agents):
    """gpu-device on the node as the chart runs it (``--cdi-mode auto``): it picks the mode from the node."""
    volumes = {
        "device-plugins": ("/var/lib/kubelet/device-plugins", "/var/lib/kubelet/device-plugins"),
        "pod-resources": ("/var/lib/kubelet/pod-resources", "/var/lib/kubelet/pod-resources"),
        "sim": (agents.sim_parent, SIM_MOUNT),
        # the node's own /run/cdi (each simulated node binds its own directory there)
        "cdi": (CDI_SPEC_DIR, CDI_SPEC_DIR),
    }
    args = DEVICE_ARGS + ["--host-prefix", agents.sim_root, "--cdi-mode", "auto", "--cdi-spec-dir", CDI_SPEC_DIR]
    agents.start("gpu-device", args, volumes)


@pytest.fixture(scope="module")
def cdi_agent(cluster, agent_images):  # noqa: F811
    node = cluster.nodes[1] if len(cluster.nodes) > 1 else cluster.nodes[0]
    agents = NodeAgents(cluster, agent_images, node)
    state = generator.load_state(agents.sim())
    if not agents.sim().exists("sys/module/metax") or any(g["failed"] for g in state["gpus"]):
        agents.recreate_sim(agents.preset)
    generator.reinstall_mx_smi(agents.sim())
    had_maca = agents.sim().exists(MACA_LINK)
    had_opt = agents.sim().exists("opt")
    if not had_maca:
        install_maca(agents.sim(), MACA_VERSION)
    try:
        start_gpu_device_auto(agents)
        yield agents
    finally:
        pod = agents.pod_of("gpu-device")
        if pod is not None:     # the spec stays when gpu-device stops (restarting containers need it): remove it
            agents.cluster.kubectl("-n", NS, "exec", pod.metadata.name, "--", "rm", "-f", SPEC)
        agents.delete("gpu-device")
        agents.remove_annotations(ANNOTATIONS)
        if not had_maca:
            os.unlink(agents.sim().join(MACA_LINK))
            shutil.rmtree(agents.sim().join(maca_dir(MACA_VERSION)))
            if not had_opt:
                os.rmdir(agents.sim().join("opt"))
        state = generator.load_state(agents.sim())
        if any(g["failed"] for g in state["gpus"]) or not state["driver_loaded"]:
            agents.recreate_sim(agents.preset)


def mode_logged(agents):
    """gpu-device's log once it names Allocate's mode: the mode is decided after the first
    registration, from the Node's runtime (docs/agents.md), so /healthz can come first."""
    def named():
        log = agents.logs("gpu-device")
        return log if "Allocate mode" in log else None
    return wait_for(named, 60, "gpu-device's log naming its Allocate mode")


def node_spec(agents):
    """The node's CDI spec as its containerd reads it (through gpu-device's mount of the node's /var/run/cdi)."""
    pod = agents.pod_of("gpu-device")
    res = agents.cluster.kubectl("-n", NS, "exec", pod.metadata.name, "--", "cat", SPEC)
    return json.loads(res.stdout) if res.returncode == 0 else None


def index_names(spec):
    return sorted((d["name"] for d in (spec or {}).get("devices", []) if d["name"].isdigit()), key=int)


def gpu_pod(agents, count):
    name = "cdi-gpu-%s" % uuid.uuid4().hex[:6]
    agents.apply({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
        "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                 "nodeSelector": {"kubernetes.io/hostname": agents.node},
                 "tolerations": [{"operator": "Exists"}],
                 "containers": [{"name": "main", "image": agents.images["gpu-device"], "command": ["sh", "-c", SCRIPT],
                                 "resources": {"limits": {GPU: str(count)}}}]}})
    return name


def pod_report(agents, name):
    """({"dri": [...], "mxcd": ..., "maca": ..., "mount": ...}, env) once the pod runs and printed its report."""
    def running():
        pod = agents.api.read_namespaced_pod(name, NS)
        waiting = [s.state.waiting for s in pod.status.container_statuses or [] if s.state.waiting]
        # a runtime that cannot resolve a CDI name leaves the container waiting with the reason
        assert not [w for w in waiting if w.reason in ("CreateContainerError", "RunContainerError")], waiting
        return pod.status.phase == "Running"
    wait_for(running, 180, "the GPU pod %s running" % name)
    log = wait_for(lambda: "METAX_VISIBLE_DEVICES=" in agents.api.read_namespaced_pod_log(name, NS), 30,
                   "the pod's report") and agents.api.read_namespaced_pod_log(name, NS)
    return parse_report(log)


def parse_report(log):
    """SCRIPT's output: ({"dri": [...], "mxcd": ..., "maca": ..., "mount": ...}, env)."""
    report, env = {}, {}
    for line in log.splitlines():
        key, sep, value = line.partition(": ")
        if sep and key in ("dri", "mxcd", "maca", "mount"):
            report[key] = value.split() if key == "dri" else value.strip()
        elif "=" in line:
            k, _sep, v = line.partition("=")
            env[k] = v
    return report, env


def test_gpu_device_chooses_cdi_on_containerd_2_and_writes_the_spec(cdi_agent):
    agents = cdi_agent
    wait_registered(agents)
    log = mode_logged(agents)
    assert "Allocate mode cdi" in log and "containerd://2." in log, log[-2000:]
    spec = wait_for(lambda: node_spec(agents), 30, "the node's CDI spec")
    assert index_names(spec) == [str(i) for i in range(agents.gpus())]
    mounts = spec["containerEdits"]["mounts"]
    assert [(m["hostPath"], m["containerPath"]) for m in mounts] == [
        (agents.sim_root + "/" + maca_dir(MACA_VERSION), "/opt/maca")]


def allocators_pair(agents):
    """Once every GPU is allocatable: the two free devices the allocator picks for a pod asking for two."""
    count = agents.gpus()
    wait_for(lambda: agents.gpu_resources() == (count, count), 60, "allocatable %d" % count)
    inv = discover(agents.sim())
    busy = {d["id"] for d in devices_annotation(agents) or [] if d["allocated"]}
    free = [d.index for d in inv.devices if d.healthy and d.id not in busy]
    return [inv.devices[i] for i in allocate(inv.topology, free, 2).devices]


def a_pair_pod_sees_exactly_its_devices_and_maca(agents, mode):
    """A pod asking for two GPUs sees exactly the allocator's pair, /dev/mxcd, the node's MXMACA read-only
    on /opt/maca and its environment, however gpu-device handed them over (``mode``, checked in its
    Allocate answer). Returns the pair and that answer for the mode's own checks."""
    pair = allocators_pair(agents)
    name = gpu_pod(agents, 2)
    try:
        report, env = pod_report(agents, name)
        assert report["dri"] == sorted([d.drm_card for d in pair] + [d.drm_render for d in pair]), report
        assert report["mxcd"] == "/dev/mxcd" and report["maca"] == "Version:" + MACA_VERSION, report
        assert report["mount"].split(",")[0] == "ro", report          # the host's MACA, read-only
        assert env["MACA_PATH"] == "/opt/maca"
        assert env["LD_LIBRARY_PATH"].startswith("/opt/maca/lib:/opt/maca/mxgpu_llvm/lib")
        assert env["METAX_VISIBLE_DEVICES"] == ",".join(d.id for d in pair)
        answers = [json.loads(line) for line in agents.logs("gpu-device").splitlines()
                   if line.startswith("{") and '"Allocate: ' in line]
        assert answers and answers[-1]["mode"] == mode, answers[-1:]
        return pair, answers[-1]
    finally:
        agents.api.delete_namespaced_pod(name, NS, grace_period_seconds=0)


def test_a_pod_gets_exactly_its_devices_and_maca_through_cdi(cdi_agent):
    pair, answer = a_pair_pod_sees_exactly_its_devices_and_maca(cdi_agent, "cdi")
    # through cdi_devices: gpu-device's answer named the pair and carried no device node
    assert answer["cdi_devices"] == sorted("%s=%d" % (GPU, d.index) for d in pair), answer


# The manual's section 3.3: the application is built in a stage that has MXMACA (the vendor's MACA image;
# here the base image with a MACA tree copied in, of another version than the node's), and its final
# stage is a plain base image. ``with-maca`` is the same application as an image without the operator
# would have to be: on top of its MACA (the image-size comparison).
APP_CONTAINERFILE = """\
FROM {base} AS build
COPY maca/ /opt/maca/
COPY gpu-app.sh /src/gpu-app.sh
RUN head -1 /opt/maca/Version.txt > /src/BUILT_WITH \\
 && install -D -m 0755 /src/gpu-app.sh /app/gpu-app && install -m 0644 /src/BUILT_WITH /app/BUILT_WITH

FROM build AS with-maca
ENTRYPOINT ["/app/gpu-app"]

FROM {base}
COPY --from=build /app /app
ENTRYPOINT ["/app/gpu-app"]
"""
BUILD_MACA_VERSION = "2.23.0.4"
# the Job's report: SCRIPT's, without the sleep
APP_SCRIPT = "#!/bin/sh\necho built: $(cat /app/BUILT_WITH)\n" + SCRIPT.replace("; sleep 3600", "") + "\n"


def podman(cluster, *args, timeout=600):
    res = subprocess.run(["podman", *args], env=cluster.env, capture_output=True, text=True, timeout=timeout,
                         stdin=subprocess.DEVNULL, check=False)
    assert res.returncode == 0, "podman %s: %s" % (" ".join(args), res.stderr[-2000:])
    return res.stdout.strip()


def du(path):
    return sum(os.lstat(os.path.join(d, f)).st_size for d, _dirs, files in os.walk(path) for f in files)


@pytest.fixture(scope="module")
def maca_app(cluster, tmp_path_factory):
    """The section 3.3 image built and pushed; its size and the with-MACA variant's, for the record."""
    ctx = tmp_path_factory.mktemp("maca-app")
    build_root = HostRoot(str(tmp_path_factory.mktemp("build-maca")))
    shutil.copytree(build_root.join(install_maca(build_root, BUILD_MACA_VERSION, activate=False).lstrip("/")),
                    str(ctx / "maca"))
    (ctx / "gpu-app.sh").write_text(APP_SCRIPT)
    (ctx / "Containerfile").write_text(APP_CONTAINERFILE.format(base=cluster.base_image))
    tag = uuid.uuid4().hex[:10]
    local = {"app": "localhost/metax-gpu/maca-app:" + tag, "with-maca": "localhost/metax-gpu/maca-app:with-maca-" + tag}
    try:
        podman(cluster, "build", "--quiet", "--network", "none", "-t", local["with-maca"], "--target", "with-maca",
               str(ctx))
        podman(cluster, "build", "--quiet", "--network", "none", "-t", local["app"], str(ctx))
        sizes = {k: int(podman(cluster, "image", "inspect", "--format", "{{.Size}}", ref)) for k, ref in local.items()}
        maca_in_final = podman(cluster, "run", "--rm", "--network", "none", "--entrypoint", "sh", local["app"], "-c",
                               "test -e /opt/maca && echo present || echo absent")
        ref = "%s/metax-gpu/maca-app:%s" % (cluster.registry, tag)
        podman(cluster, "push", "--quiet", "--tls-verify=false", local["app"], "docker://" + ref)
    finally:
        for image in local.values():
            subprocess.run(["podman", "rmi", "-f", image], env=cluster.env, capture_output=True,
                           stdin=subprocess.DEVNULL, check=False)
    print("\nsection 3.3 image: %d bytes without MACA, %d with (MACA tree %d bytes)"
          % (sizes["app"], sizes["with-maca"], du(str(ctx / "maca"))))
    return {"ref": ref, "sizes": sizes, "maca_bytes": du(str(ctx / "maca")), "maca_in_final": maca_in_final}


def test_the_manuals_multi_stage_image_runs_as_a_job_with_the_nodes_maca(cdi_agent, maca_app):
    """Manual section 3.3: the image has no /opt/maca; as a Job asking for two GPUs it sees exactly the
    allocator's pair and the node's MACA (not the version it was built with), through CDI."""
    agents = cdi_agent
    assert maca_app["maca_in_final"] == "absent"
    assert maca_app["sizes"]["with-maca"] - maca_app["sizes"]["app"] >= maca_app["maca_bytes"], maca_app
    pair = allocators_pair(agents)
    name = "maca-app-%s" % uuid.uuid4().hex[:6]
    agents.apply({
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": NS},
        "spec": {"backoffLimit": 0, "template": {"spec": {
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
            "nodeSelector": {"kubernetes.io/hostname": agents.node}, "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "app", "image": maca_app["ref"],
                            "resources": {"limits": {GPU: "2"}}}]}}}})
    from kubernetes import client
    batch = client.BatchV1Api(agents.api.api_client)
    try:
        def finished():
            status = batch.read_namespaced_job_status(name, NS).status
            assert not status.failed, agents.diagnose()
            return bool(status.succeeded)
        wait_for(finished, 180, "the Job %s succeeded" % name)
        (pod,) = agents.api.list_namespaced_pod(NS, label_selector="job-name=" + name).items
        log = agents.api.read_namespaced_pod_log(pod.metadata.name, NS)
        report, env = parse_report(log)
        assert "built: Version:" + BUILD_MACA_VERSION in log, log
        assert report["dri"] == sorted([d.drm_card for d in pair] + [d.drm_render for d in pair]), report
        assert report["mxcd"] == "/dev/mxcd" and report["maca"] == "Version:" + MACA_VERSION, report
        assert report["mount"].split(",")[0] == "ro", report
        assert env["MACA_PATH"] == "/opt/maca"
        assert env["LD_LIBRARY_PATH"].startswith("/opt/maca/lib:/opt/maca/mxgpu_llvm/lib")
        assert env["METAX_VISIBLE_DEVICES"] == ",".join(d.id for d in pair)
    finally:
        batch.delete_namespaced_job(name, NS, propagation_policy="Background", grace_period_seconds=0)


def test_a_failed_gpu_leaves_the_spec_and_a_new_pod_still_starts(cdi_agent):
    agents = cdi_agent
    count = agents.gpus()
    last = count - 1
    wait_for(lambda: agents.gpu_resources() == (count, count), 60, "allocatable %d" % count)
    try:
        t0 = time.monotonic()
        generator.fail_gpu(agents.sim(), last, "smi")
        wait_for(lambda: index_names(node_spec(agents)) == [str(i) for i in range(last)], 30,
                 "GPU %d out of the spec" % last)
        print("GPU failure -> spec rewritten in the node: %.1f s" % (time.monotonic() - t0))
        wait_for(lambda: agents.gpu_resources()[1] == last, 60, "allocatable %d" % last)
        name = gpu_pod(agents, last)
        try:
            report, _env = pod_report(agents, name)
            assert "card%d" % last not in report["dri"] and len(report["dri"]) == 2 * last, report
        finally:
            agents.api.delete_namespaced_pod(name, NS, grace_period_seconds=0)
    finally:
        generator.recover_gpu(agents.sim(), last)
    wait_for(lambda: index_names(node_spec(agents)) == [str(i) for i in range(count)], 30,
             "GPU %d back in the spec" % last)
