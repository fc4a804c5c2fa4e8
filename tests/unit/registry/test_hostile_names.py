"""Hostile names at the registry's boundary (issue 39, findings 3, 5 and 7): each field with its hostile value.

Repository and tag names by the OCI distribution grammar, digests by the OCI digest grammar before they become
paths, registry addresses and versions before they go into the bundle's shell script, the bundle header's
fields, and a layer whose bytes are not its digest. A real docker-registry shows that nothing was written.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import sys
import tarfile

import pytest
import requests

from registry_fixtures import make_docker_archive, random_layers

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "modules"))
from module_runner import run_module  # noqa: E402

from ansible_collections.metax.gpu.plugins.modules import offline_bundle, registry_push  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.registry import api, bundle  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.registry import reference as R  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.registry.errors import ArtifactError  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.registry.sources import BUNDLE_MAGIC, read_source  # noqa: E402

HEX = "a" * 64


@pytest.mark.parametrize("name", ["gpu-device", "cloud/gpu-device", "a.b_c__d--e/f0", "x" * 255])
def test_valid_repositories(name):
    assert R.repository(name) == name


@pytest.mark.parametrize("name", ["../library/busybox", "cloud/../library/busybox", "cloud/./x", "/abs", "a//b",
                                  "a/", "UPPER", "a b", "a\nb", "-x", "x-", "a...b", "x" * 256, "", "a;b", "a:b"])
def test_hostile_repositories(name):
    with pytest.raises(ArtifactError, match="not a valid repository name"):
        R.repository(name)


@pytest.mark.parametrize("value", ["1.2.3", "1.2.3_build.4", "latest", "_x", "A" * 128])
def test_valid_tags(value):
    assert R.tag(value) == value


@pytest.mark.parametrize("value", ["../x", "-x", ".x", "a b", "a/b", "a\n", "x" * 129, "", "a:b", "$(id)"])
def test_hostile_tags(value):
    with pytest.raises(ArtifactError, match="not a valid tag"):
        R.tag(value)


@pytest.mark.parametrize("value", ["sha256:../../../x", "sha256:" + "../" * 22, "sha256:abc", "sha256:" + "A" * 64,
                                   "sha256:" + HEX + "/x", "md5:" + "a" * 32, "sha256", ":" + HEX, "sha256:" + "g" * 64,
                                   "sha512:" + HEX])
def test_hostile_digests(value):
    with pytest.raises(ArtifactError, match="not a valid digest"):
        R.digest(value)


def test_valid_digests():
    assert R.digest("sha256:" + HEX) and R.digest("sha512:" + "b" * 128)
    assert R.reference("sha256:" + HEX) and R.reference("v1")


@pytest.mark.parametrize("value", ["a b", "a b/cloud", "https://r.example/cloud", "r.example:99999", "r.example:0",
                                   "r.example:", "r.example:x", "-r.example", "r.example/../library", "r.example/Cloud",
                                   "r_example", "[::1", "", "r.example/cloud;id", "r.example$(id)/c"])
def test_hostile_registries(value):
    with pytest.raises(ArtifactError):
        R.registry(value)


@pytest.mark.parametrize("value,expected", [("cr.metax-tech.com/cloud", ("cr.metax-tech.com", "cloud")),
                                            ("127.0.0.1:5000", ("127.0.0.1:5000", "")),
                                            ("[::1]:5000/a/b", ("[::1]:5000", "a/b")),
                                            ("localhost:65535/x/", ("localhost:65535", "x"))])
def test_valid_registries(value, expected):
    assert R.registry(value) == expected


@pytest.mark.parametrize("value", ["1.0; rm -rf /", "1.0\nid", "$(id)", "`id`", "1.0'", "", "-1", "a b", "../1"])
def test_hostile_versions(value):
    with pytest.raises(ArtifactError, match="not a valid version"):
        R.version(value)


# ---------------------------------------------------------------------------------------------
# real sources against a real registry

def _catalog(registry) -> list:
    return requests.get("http://%s/v2/_catalog" % registry.host, timeout=60).json().get("repositories") or []


def _chart(path, name: str) -> str:
    """A packaged chart as helm writes it (<dir>/Chart.yaml inside a .tgz), named ``name``."""
    raw = ("apiVersion: v2\nname: %s\nversion: 1.0.0\n" % json.dumps(name)).encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("busybox/Chart.yaml")
        info.size = len(raw)
        tar.addfile(info, io.BytesIO(raw))
    with open(path, "wb") as handle:
        handle.write(gzip.compress(buf.getvalue()))
    return str(path)


def test_a_chart_named_dot_dot_does_not_escape_its_project(registry, tmp_path, cache_dir):
    src = _chart(tmp_path / "busybox-1.0.0.tgz", "../library/busybox")
    with pytest.raises(ArtifactError, match=r"library/busybox"):
        api.push(api.PushRequest(src=src, registry=registry.host + "/cloud", plain_http=True, cache_dir=cache_dir))
    assert _catalog(registry) == []            # neither library/busybox nor anything else was written
    # the same through the module: a clear error, no traceback
    failed, result = run_module(registry_push, {"src": src, "registry": registry.host, "project": "cloud",
                                                "plain_http": True, "cache_dir": cache_dir})
    assert failed and "not a valid repository name" in result["msg"] and "Traceback" not in json.dumps(result)
    assert _catalog(registry) == []


@pytest.mark.parametrize("ref", ["cr.example.com/cloud/..:1", "cr.example.com/cloud/Busybox:1", "x:../../y",
                                 "cr.example.com/cloud/x:-1"])
def test_docker_archive_repotags_are_checked(registry, tmp_path, cache_dir, ref):
    path = str(tmp_path / "img.tar")
    make_docker_archive(path, ref, random_layers(1, 1000))
    with pytest.raises(ArtifactError, match="RepoTags"):
        api.push(api.PushRequest(src=path, registry=registry.host + "/cloud", plain_http=True, cache_dir=cache_dir))
    assert _catalog(registry) == []


@pytest.mark.parametrize("field,value", [("repository", "../library/busybox"), ("tag", "../x"),
                                         ("registry", "127.0.0.1:99999/cloud"), ("registry", "a b")])
def test_push_request_overrides_are_checked_before_anything_is_read(tmp_path, field, value):
    req = api.PushRequest(src=str(tmp_path / "missing.tar"), registry="127.0.0.1:5000/cloud")
    setattr(req, field, value)
    with pytest.raises(ArtifactError) as info:
        api.push(req)
    assert "missing.tar" not in str(info.value)   # refused before the source was looked at


def _layout(root, manifest_digest=None, layer_bytes=None):
    """An OCI layout directory with one gzip layer; optionally a lying manifest digest or layer bytes."""
    blobs = root / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    layer = gzip.compress(b"layer content", mtime=0)
    layer_digest = "sha256:" + hashlib.sha256(layer).hexdigest()
    (blobs / layer_digest[7:]).write_bytes(layer_bytes if layer_bytes is not None else layer)
    config = json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {
        "type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(b"layer content").hexdigest()]}}).encode()
    config_digest = "sha256:" + hashlib.sha256(config).hexdigest()
    (blobs / config_digest[7:]).write_bytes(config)
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                      "digest": config_digest, "size": len(config)},
                           "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                                       "digest": layer_digest, "size": len(layer)}]}).encode()
    digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
    (blobs / digest[7:]).write_bytes(manifest)
    (root / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    (root / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": manifest_digest or digest,
        "size": len(manifest), "annotations": {"org.opencontainers.image.ref.name": "1.0"}}]}))
    return str(root)


def test_an_oci_layout_digest_is_not_a_path(registry, tmp_path, cache_dir):
    # the file a traversal would reach: outside the layout, named like a blob
    (tmp_path / "x").write_bytes(b"a host file outside the layout")
    layout = _layout(tmp_path / "layout", manifest_digest="sha256:../../../x")
    with pytest.raises(ArtifactError, match="not a valid digest"):
        api.push(api.PushRequest(src=layout, registry=registry.host + "/cloud", plain_http=True, cache_dir=cache_dir))
    assert _catalog(registry) == []


def test_the_bundle_writer_refuses_a_layer_that_is_not_its_digest(tmp_path):
    layout = _layout(tmp_path / "layout", layer_bytes=gzip.compress(b"other content", mtime=0))
    out = tmp_path / "out" / "metax-k8s-images.1.0.run"
    failed, result = run_module(offline_bundle, {"path": str(out), "version": "1.0", "registry": "r.example/cloud",
                                                 "images": [{"archive": layout, "name": "x", "tag": "1.0"}],
                                                 "cache_dir": str(tmp_path / "cache")})
    assert failed and "not written" in result["msg"] and "sha256:" in result["msg"]
    assert not out.exists() and os.listdir(str(out.parent)) == []     # no bundle, no temporary file


@pytest.fixture
def image(tmp_path):
    path = str(tmp_path / "img.tar")
    make_docker_archive(path, "cr.example.com/cloud/gpu-device:0.1.0", random_layers(1, 1000))
    return path


@pytest.mark.parametrize("field,value", [
    ("registry", "a b"), ("registry", "r.example/x'; touch /tmp/pwned; '"), ("registry", "r.example/$(id)"),
    ("registry", "r.example:99999"), ("version", "1.0; rm -rf /"), ("version", "1.0\nid"), ("version", "$(id)"),
    ("image_name", "../library/busybox"), ("image_name", "x y"), ("image_tag", "1.0 x"), ("image_tag", "../1")])
def test_offline_bundle_refuses_what_could_break_out_of_its_script(tmp_path, image, field, value):
    out = tmp_path / "out" / "metax-k8s-images.run"
    img = {"archive": image, "name": "gpu-device", "tag": "0.1.0"}
    args = {"path": str(out), "version": "0.1.0", "registry": "r.example/cloud", "images": [img],
            "cache_dir": str(tmp_path / "cache")}
    if field.startswith("image_"):
        img[field[6:]] = value
    else:
        args[field] = value
    for check_mode in (True, False):
        failed, result = run_module(offline_bundle, args, check_mode=check_mode)
        assert failed, result
        assert "not a valid" in result["msg"] or "port" in result["msg"], result["msg"]
    assert not out.parent.exists() or os.listdir(str(out.parent)) == []


def test_the_script_quotes_what_it_is_given(tmp_path, image):
    """Valid values, still quoted: the header's shell variables hold exactly the registry and the image list."""
    out = tmp_path / "b.run"
    bundle.build(str(out), "0.1.0", [{"archive": image, "name": "gpu-device", "tag": "0.1.0"}], [],
                 registry="[::1]:5000/cloud", cache_dir=str(tmp_path / "cache"))
    head = out.read_bytes()[:4096].decode("utf-8", "replace")
    assert "REGISTRY_DEFAULT='[::1]:5000/cloud'\n" in head
    assert "IMAGES=gpu-device:0.1.0\n" in head


def _bundle_file(path, header) -> str:
    with open(path, "w") as handle:
        handle.write("#!/bin/sh\n%s%s\n" % (BUNDLE_MAGIC, json.dumps(header)))
    return str(path)


@pytest.mark.parametrize("header,needle", [
    ({"images": [], "charts": []}, "offset is missing"),
    ({"offset": "512", "images": []}, "offset is '512'"),
    ({"offset": -512, "images": []}, "offset is -512"),
    ({"offset": 512, "images": [{"name": "../../etc", "tag": "1"}]}, "not a valid repository name"),
    ({"offset": 512, "images": [{"name": "x", "tag": "$(id)"}]}, "not a valid tag"),
    ({"offset": 512, "images": ["x"]}, "not an object"),
    ({"offset": 512, "charts": [{"file": "../x.tgz", "name": "x", "digest": "sha256:" + HEX, "metadata": {}}]},
     "not a plain file name"),
    ({"offset": 512, "charts": [{"file": "x.tgz", "name": "x", "digest": "sha256:../x", "metadata": {}}]},
     "not a valid digest"),
    ({"offset": 512, "charts": [{"file": "x.tgz"}]}, "without file or metadata"),
])
def test_bundle_headers_are_checked(tmp_path, header, needle):
    path = _bundle_file(tmp_path / "b.run", header)
    with pytest.raises(ArtifactError, match=needle.replace("$", r"\$").replace("(", r"\(").replace(")", r"\)")):
        read_source(path)
    failed, result = run_module(registry_push, {"src": path, "registry": "127.0.0.1:9/cloud", "plain_http": True})
    assert failed and "Traceback" not in result["msg"]


def test_a_bundle_header_that_is_not_an_object(tmp_path):
    path = _bundle_file(tmp_path / "b.run", [1, 2])
    with pytest.raises(ArtifactError, match="not an object"):
        read_source(path)


@pytest.mark.parametrize("value,expected", [
    ("cr.metax-tech.com/library/maca-c500:2.23.0.4", ("cr.metax-tech.com", "library/maca-c500", "2.23.0.4")),
    ("mxc500-maca:2.23.0.5", ("", "mxc500-maca", "2.23.0.5")), ("localhost:5000/x", ("localhost:5000", "x", "latest")),
    ("library/busybox", ("", "library/busybox", "latest"))])
def test_image_references(value, expected):
    assert R.image_reference(value) == expected


@pytest.mark.parametrize("value", ["x:../../y", "r.example/../x:1", "r.example/x:$(id)", "r.example:99999/x", "",
                                   "x@sha256:" + HEX, "r.example/X:1"])
def test_hostile_image_references(value):
    with pytest.raises(ArtifactError):
        R.image_reference(value)


def test_the_layer_cache_does_not_take_a_diff_id_as_a_path(tmp_path):
    from ansible_collections.metax.gpu.plugins.module_utils.registry import blobs as B

    cache = B.LayerCache(str(tmp_path / "cache" / "layers"))
    (tmp_path / "x.json").write_text('{"digest": "sha256:%s", "size": 1}' % HEX)     # what a traversal would read
    assert cache.lookup("gzip", "sha256:../../../x") is None
    with pytest.raises(ArtifactError, match="not a valid digest"):
        cache.record("gzip", "sha256:../../../y", "sha256:" + HEX, 1)
    assert not (tmp_path / "y.json").exists()
