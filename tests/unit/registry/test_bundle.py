"""The offline bundle: module idempotence and check mode, the sh commands, push from the bundle, load with podman."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from registry_fixtures import make_docker_archive, random_layers, skopeo_inspect

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "modules"))
from module_runner import run_module  # noqa: E402

from ansible_collections.metax.gpu.plugins.modules import offline_bundle  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.registry import api  # noqa: E402

HELM = next(iter(sorted(__import__("glob").glob("/root/.cache/metax-gpu/helm/*/bin/helm"))), shutil.which("helm"))


@pytest.fixture
def inputs(tmp_path):
    images = []
    for name in ("gpu-device", "gpu-label"):
        path = str(tmp_path / ("%s.tar" % name))
        # shared first layer: the second image mounts it instead of uploading it again
        make_docker_archive(path, "cr.example.com/cloud/%s:0.1.0" % name,
                            random_layers(1, 150_000, seed=1) + random_layers(1, 50_000, seed=len(name) + ord(name[4])))
        images.append({"archive": path, "name": name, "tag": "0.1.0"})
    charts = []
    if HELM:
        chart_dir = tmp_path / "chart" / "demo"
        (chart_dir / "templates").mkdir(parents=True)
        (chart_dir / "Chart.yaml").write_text("apiVersion: v2\nname: demo\nversion: 1.2.3+build.4\nappVersion: \"1.0\"\n"
                                              "description: a test chart\n")
        (chart_dir / "templates" / "cm.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: demo\n")
        subprocess.run([HELM, "package", str(chart_dir), "-d", str(tmp_path)], check=True, capture_output=True)
        charts.append(str(tmp_path / "demo-1.2.3+build.4.tgz"))
    return {"images": images, "charts": charts}


def _args(tmp_path, inputs, **extra):
    args = {"path": str(tmp_path / "out" / "metax-k8s-images.0.1.0.run"), "version": "0.1.0",
            "images": inputs["images"], "charts": inputs["charts"], "registry": "cr.example.com/cloud",
            "cache_dir": str(tmp_path / "cache")}
    args.update(extra)
    return args


def test_module_is_idempotent_and_check_mode_predicts(tmp_path, inputs):
    args = _args(tmp_path, inputs)
    failed, planned = run_module(offline_bundle, args, check_mode=True)
    assert not failed and planned["changed"] is True
    assert not os.path.exists(args["path"])
    failed, first = run_module(offline_bundle, args)
    assert not failed and first["changed"] is True
    assert first["digest"] == planned["digest"]
    assert [i["name"] for i in first["images"]] == ["gpu-device", "gpu-label"]
    mtime = os.stat(args["path"]).st_mtime_ns
    failed, again_check = run_module(offline_bundle, args, check_mode=True)
    assert again_check["changed"] is False
    failed, second = run_module(offline_bundle, args)
    assert second["changed"] is False and second["images"] == first["images"]
    assert os.stat(args["path"]).st_mtime_ns == mtime
    # a different tag is different content
    images = [dict(i, tag="0.1.1") for i in inputs["images"]]
    failed, third = run_module(offline_bundle, dict(args, images=images))
    assert third["changed"] is True and third["digest"] != first["digest"]
    assert not [f for f in os.listdir(os.path.dirname(args["path"])) if f.startswith(".")]
    failed, removed = run_module(offline_bundle, dict(args, state="absent"))
    assert removed["changed"] is True and not os.path.exists(args["path"])


def test_module_names_a_missing_archive(tmp_path, inputs):
    images = inputs["images"] + [{"archive": str(tmp_path / "gone.tar"), "name": "x", "tag": "1"}]
    failed, result = run_module(offline_bundle, _args(tmp_path, inputs, images=images))
    assert failed and "gone.tar" in result["msg"]
    assert not os.path.exists(_args(tmp_path, inputs)["path"])


def test_sh_commands_and_push_from_the_bundle(tmp_path, inputs, registry):
    args = _args(tmp_path, inputs)
    failed, built = run_module(offline_bundle, args)
    assert not failed
    run = args["path"]
    listing = subprocess.run(["sh", run, "list"], check=True, capture_output=True, text=True).stdout
    assert "gpu-device:0.1.0" in listing and "gpu-label:0.1.0" in listing
    out = tmp_path / "x"
    subprocess.run(["sh", run, "extract", str(out)], check=True)
    layout = json.loads((out / "images" / "gpu-device" / "index.json").read_text())
    assert layout["manifests"][0]["digest"] == built["images"][0]["digest"]
    # skopeo reads the extracted OCI layout: the bundle's layouts are valid
    subprocess.run(["skopeo", "inspect", "oci:%s" % (out / "images" / "gpu-device")], check=True, capture_output=True)
    env = dict(os.environ, METAX_PLAIN_HTTP="1", PYTHONPATH="")
    env["PATH"] = os.path.dirname(sys.executable) + ":" + env["PATH"]  # python3 with requests
    proc = subprocess.run(["sh", run, "push", registry.host + "/metax"], env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    for image in built["images"]:
        assert skopeo_inspect("%s/metax/%s:0.1.0" % (registry.host, image["name"]))["digest"] == image["digest"]
    again = subprocess.run(["sh", run, "push", registry.host + "/metax"], env=env, capture_output=True, text=True, check=False)
    assert again.returncode == 0 and "pushed " not in again.stdout and again.stdout.count("present") >= 2
    if HELM:
        pulled = tmp_path / "pulled"
        pulled.mkdir()
        proc = subprocess.run([HELM, "pull", "oci://%s/metax/demo" % registry.host, "--version", "1.2.3+build.4",
                               "--plain-http", "-d", str(pulled)], capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stderr
        got = open(str(pulled / "demo-1.2.3+build.4.tgz"), "rb").read()
        assert got == open(inputs["charts"][0], "rb").read()


def test_registry_push_reads_the_bundle_and_mounts_shared_layers(tmp_path, inputs, registry):
    args = _args(tmp_path, inputs)
    run_module(offline_bundle, args)
    result = api.push(api.PushRequest(src=args["path"], registry=registry.host + "/proj", plain_http=True,
                                      cache_dir=str(tmp_path / "cache"), concurrency=1))
    by_name = {a["ref"].rsplit("/", 1)[1]: a for a in result["artifacts"]}
    assert by_name["gpu-label:0.1.0"]["blobs_mounted"] == 1
    assert result["changed"] is True


@pytest.mark.skipif(not shutil.which("podman"), reason="podman not installed")
def test_load_into_podman(tmp_path, inputs):
    args = _args(tmp_path, inputs)
    run_module(offline_bundle, args)
    import tempfile
    store = tempfile.mkdtemp(prefix="mxp.")  # podman refuses a runroot path longer than 50 characters
    wrapper = tmp_path / "bin" / "podman"
    wrapper.parent.mkdir()
    # a store of its own, and its own libpod tmpdir: the machine's other containers (the Molecule
    # nodes running beside the unit tests) keep theirs
    wrapper.write_text('#!/bin/sh\nexec %s --root %s/root --runroot %s/run --tmpdir %s/tmp --storage-driver vfs "$@"\n'
                       % (shutil.which("podman"), store, store, store))
    wrapper.chmod(0o755)
    env = dict(os.environ, METAX_BUNDLE_RUNTIME="podman", PATH="%s:%s" % (wrapper.parent, os.environ["PATH"]))
    proc = subprocess.run(["sh", args["path"], "load", "registry.local/proj"], env=env, capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    images = subprocess.run([str(wrapper), "images", "--format", "{{.Repository}}:{{.Tag}}"], env=env,
                            check=True, capture_output=True, text=True).stdout.split()
    assert "registry.local/proj/gpu-device:0.1.0" in images
    assert "cr.example.com/cloud/gpu-label:0.1.0" in images
    subprocess.run([str(wrapper), "rmi", "-a", "-f"], env=env, capture_output=True, check=False)
    # never `system reset`: it also frees every libpod lock of the machine, and podman then takes the
    # machine's running containers for stopped ("container state improper")
    shutil.rmtree(store, ignore_errors=True)


def test_layers_shared_by_images_are_stored_once(tmp_path, inputs):
    import tarfile
    args = _args(tmp_path, inputs)
    failed, built = run_module(offline_bundle, args)
    assert not failed
    from ansible_collections.metax.gpu.plugins.module_utils.registry.sources import read_bundle_header
    offset = read_bundle_header(args["path"])["offset"]
    with open(args["path"], "rb") as handle:
        handle.seek(offset)
        with tarfile.open(fileobj=handle, mode="r:") as tar:
            members = tar.getmembers()
    links = [m for m in members if m.islnk()]
    assert len(links) == 1 and links[0].name.startswith("images/gpu-label/blobs/sha256/")
    assert links[0].linkname.startswith("images/gpu-device/blobs/sha256/")


@pytest.fixture
def containerd():
    """A containerd of the test's own (temp root, state and socket; CRI off), for `load`."""
    import tempfile
    import time
    if not (shutil.which("containerd") and shutil.which("ctr")) or os.geteuid() != 0:
        pytest.skip("containerd/ctr not installed or not root")
    root = tempfile.mkdtemp(prefix="ctd.")  # a socket path must stay under 108 bytes
    config = os.path.join(root, "config.toml")
    with open(config, "w") as handle:
        handle.write('version = 2\nroot = "%s/root"\nstate = "%s/state"\n'
                     'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
                     '[grpc]\n  address = "%s/c.sock"\n[ttrpc]\n  address = "%s/t.sock"\n'
                     % (root, root, root, root))
    proc = subprocess.Popen([shutil.which("containerd"), "--config", config],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    env = dict(os.environ, CONTAINERD_ADDRESS=os.path.join(root, "c.sock"))
    deadline = time.time() + 60          # generous: a loaded CI machine starts it slowly
    while time.time() < deadline:
        if subprocess.run(["ctr", "version"], env=env, capture_output=True, check=False).returncode == 0:
            break
        time.sleep(0.2)
    yield env
    proc.terminate()
    proc.wait(20)
    shutil.rmtree(root, ignore_errors=True)


def test_load_into_containerd_k8s_namespace(tmp_path, inputs, containerd):
    args = _args(tmp_path, inputs)
    run_module(offline_bundle, args)
    env = dict(containerd, METAX_BUNDLE_RUNTIME="containerd")
    proc = subprocess.run(["sh", args["path"], "load", "registry.local/proj"], env=env, capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    names = subprocess.run(["ctr", "-n", "k8s.io", "images", "ls", "-q"], env=containerd, capture_output=True,
                           text=True, check=True).stdout.split()
    for name in ("gpu-device", "gpu-label"):
        assert "registry.local/proj/%s:0.1.0" % name in names
        assert "cr.example.com/cloud/%s:0.1.0" % name in names
