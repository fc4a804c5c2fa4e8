"""The OCI client and pusher against a real docker-registry: push, pull back with skopeo, re-push, errors."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from registry_fixtures import (CuttingProxy, make_docker_archive, random_layers, skopeo_inspect)

from ansible_collections.metax.gpu.plugins.module_utils.registry.client import Registry
from ansible_collections.metax.gpu.plugins.module_utils.registry.errors import ArtifactError, AuthError, RegistryError
from ansible_collections.metax.gpu.plugins.module_utils.registry import api

skopeo = pytest.mark.skipif(not os.path.exists("/usr/bin/skopeo"), reason="skopeo not installed")


@pytest.fixture
def archive(tmp_path):
    path = str(tmp_path / "img.tar")
    info = make_docker_archive(path, "cr.example.com/cloud/gpu-device:1.2.3", random_layers(3, 200_000))
    info["path"] = path
    return info


@skopeo
@pytest.mark.parametrize("compression", ["gzip", "zstd", "none"])
def test_push_docker_archive_then_pull_back(registry, archive, cache_dir, tmp_path, compression):
    req = api.PushRequest(src=archive["path"], registry=registry.host + "/metax", plain_http=True,
                          compression=compression, cache_dir=cache_dir)
    first = api.push(req)
    assert first["changed"] is True
    (art,) = first["artifacts"]
    assert art["ref"] == registry.host + "/metax/gpu-device:1.2.3"
    assert art["blobs_uploaded"] == 4 and art["bytes_uploaded"] > 0
    pulled = skopeo_inspect(art["ref"])
    assert pulled["digest"] == art["digest"]
    manifest = json.loads(pulled["raw"])
    assert manifest["config"]["digest"] == archive["config_digest"]
    expected = {"gzip": "application/vnd.docker.image.rootfs.diff.tar.gzip",
                "zstd": "application/vnd.oci.image.layer.v1.tar+zstd",
                "none": "application/vnd.docker.image.rootfs.diff.tar"}[compression]
    assert {l["mediaType"] for l in manifest["layers"]} == {expected}
    # skopeo decompresses every layer and checks it against the config's diff_ids
    out = tmp_path / "pulled"
    subprocess.run(["skopeo", "copy", "--src-tls-verify=false", "docker://" + art["ref"], "oci:%s:x" % out],
                   check=True, capture_output=True)
    second = api.push(req)
    assert second["changed"] is False
    assert second["artifacts"][0]["digest"] == art["digest"]
    assert second["artifacts"][0]["bytes_uploaded"] == 0


def test_check_mode_reports_the_plan_and_writes_nothing(registry, archive, cache_dir):
    req = api.PushRequest(src=archive["path"], registry=registry.host + "/metax", plain_http=True,
                          cache_dir=cache_dir, check_mode=True, compression="none")
    plan = api.push(req)
    assert plan["changed"] is True
    assert plan["artifacts"][0]["would_upload_bytes"] > 600_000
    reg = Registry(registry.host, plain_http=True)
    assert reg.manifest_digest("metax/gpu-device", "1.2.3", ["application/vnd.docker.distribution.manifest.v2+json"]) is None


@pytest.mark.parametrize("compression", ["none", "gzip"])  # a monolithic PUT, a streamed PATCH
def test_cut_connection_mid_blob_still_completes(registry, archive, cache_dir, compression):
    port = int(registry.host.split(":")[1])
    proxy = CuttingProxy(port, cut_after=300_000)
    try:
        req = api.PushRequest(src=archive["path"], registry="127.0.0.1:%d/metax" % proxy.port, plain_http=True,
                              compression=compression, cache_dir=cache_dir, concurrency=1)
        result = api.push(req)
    finally:
        proxy.close()
    assert proxy.cuts == 1
    assert result["changed"] is True
    pulled = skopeo_inspect(registry.host + "/metax/gpu-device:1.2.3")
    assert pulled["digest"] == result["artifacts"][0]["digest"]


@skopeo
def test_tls_and_htpasswd(auth_registry, archive, cache_dir, tmp_path):
    base = dict(src=archive["path"], registry=auth_registry.host + "/metax", cache_dir=cache_dir,
                ca_path=auth_registry.ca)
    with pytest.raises(AuthError) as err:
        api.push(api.PushRequest(username=auth_registry.username, password="wrong", **base))
    assert auth_registry.host in str(err.value) and "refused" in str(err.value)
    with pytest.raises(AuthError) as err:
        api.push(api.PushRequest(**base))
    assert "username/password" in str(err.value)
    with pytest.raises(RegistryError) as err:  # no CA: the self-signed certificate is refused
        api.push(api.PushRequest(src=archive["path"], registry=auth_registry.host + "/metax",
                                 username=auth_registry.username, password=auth_registry.password, cache_dir=cache_dir))
    assert "ca_path" in str(err.value)
    good = api.push(api.PushRequest(username=auth_registry.username, password=auth_registry.password, **base))
    assert good["changed"] is True
    unverified = api.push(api.PushRequest(src=archive["path"], registry=auth_registry.host + "/metax",
                                          username=auth_registry.username, password=auth_registry.password,
                                          cache_dir=cache_dir, validate_certs=False))
    assert unverified["changed"] is False
    certs = tmp_path / "certs"
    certs.mkdir()
    (certs / "ca.crt").write_bytes(open(auth_registry.ca, "rb").read())
    pulled = skopeo_inspect(good["artifacts"][0]["ref"], tls_verify=True,
                            creds="%s:%s" % (auth_registry.username, auth_registry.password), cert_dir=str(certs))
    assert pulled["digest"] == good["artifacts"][0]["digest"]


def test_auth_file_supplies_credentials(auth_registry, archive, cache_dir, tmp_path, monkeypatch):
    import base64
    auth = tmp_path / "auth.json"
    token = base64.b64encode(("%s:%s" % (auth_registry.username, auth_registry.password)).encode()).decode()
    auth.write_text(json.dumps({"auths": {auth_registry.host: {"auth": token}}}))
    result = api.push(api.PushRequest(src=archive["path"], registry=auth_registry.host + "/metax", cache_dir=cache_dir,
                                      ca_path=auth_registry.ca, auth_file=str(auth)))
    assert result["changed"] is True
    # no auth_file: docker's config.json in its usual place (here $DOCKER_CONFIG), as after `docker login`
    docker_dir = tmp_path / "docker"
    docker_dir.mkdir()
    (docker_dir / "config.json").write_text(auth.read_text())
    for var in ("REGISTRY_AUTH_FILE", "XDG_RUNTIME_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DOCKER_CONFIG", str(docker_dir))
    again = api.push(api.PushRequest(src=archive["path"], registry=auth_registry.host + "/metax", cache_dir=cache_dir,
                                     ca_path=auth_registry.ca))
    assert again["changed"] is False


def test_corrupt_and_missing_archives_name_the_file(registry, tmp_path, cache_dir):
    missing = str(tmp_path / "nope.tar")
    with pytest.raises(ArtifactError, match="nope.tar: no such file"):
        api.push(api.PushRequest(src=missing, registry=registry.host + "/p", plain_http=True, cache_dir=cache_dir))
    bad = tmp_path / "bad.tar"
    bad.write_bytes(b"\0garbage" * 100)
    with pytest.raises(ArtifactError, match="bad.tar"):
        api.push(api.PushRequest(src=str(bad), registry=registry.host + "/p", plain_http=True, cache_dir=cache_dir))
    # a layer whose content does not match the config's diff_id
    path = str(tmp_path / "lying.tar")
    make_docker_archive(path, "x/y:1", random_layers(1, 1000))
    import tarfile
    with tarfile.open(path) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    layer = next(n for n in members if n.endswith("layer.tar"))
    members[layer] = members[layer][:-10] + b"0123456789"
    with tarfile.open(path, "w") as tar:
        import io
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(ArtifactError, match="layer content"):
        api.push(api.PushRequest(src=path, registry=registry.host + "/p", plain_http=True, cache_dir=cache_dir))
    reg = Registry(registry.host, plain_http=True)
    assert reg.manifest_digest("p/y", "1", ["application/vnd.docker.distribution.manifest.v2+json"]) is None


def test_registry_down_is_a_clear_error(tmp_path, archive, cache_dir):
    from registry_fixtures import free_port
    with pytest.raises(RegistryError, match="127.0.0.1"):
        api.push(api.PushRequest(src=archive["path"], registry="127.0.0.1:%d/p" % free_port(), plain_http=True,
                                 cache_dir=cache_dir, retries=1))


@skopeo
def test_oci_layout_directory_and_tar(registry, archive, cache_dir, tmp_path):
    layout = tmp_path / "layout"
    subprocess.run(["skopeo", "copy", "docker-archive:" + archive["path"], "oci:%s:gpu-label" % layout],
                   check=True, capture_output=True)
    result = api.push(api.PushRequest(src=str(layout), registry=registry.host + "/metax", plain_http=True,
                                      repository="gpu-label", tag="dir", cache_dir=cache_dir))
    (art,) = result["artifacts"]
    assert art["ref"].endswith("/metax/gpu-label:dir")
    # skopeo wrote gzip layers: pushed as they are, so the manifest is skopeo's own, byte for byte
    index = json.loads((layout / "index.json").read_text())
    assert art["digest"] != index["manifests"][0]["digest"] or art["blobs_uploaded"] == 4
    pulled = skopeo_inspect(art["ref"])
    assert pulled["digest"] == art["digest"]
    oci_tar = tmp_path / "image.oci.tar"
    subprocess.run(["skopeo", "copy", "docker-archive:" + archive["path"], "oci-archive:%s:gpu-aware" % oci_tar],
                   check=True, capture_output=True)
    result = api.push(api.PushRequest(src=str(oci_tar), registry=registry.host + "/metax", plain_http=True,
                                      cache_dir=cache_dir, compression="zstd"))
    (art,) = result["artifacts"]
    assert art["ref"].endswith("/metax/image.oci:gpu-aware") or art["ref"].endswith(":gpu-aware")
    manifest = json.loads(skopeo_inspect(art["ref"])["raw"])
    assert {l["mediaType"] for l in manifest["layers"]} == {"application/vnd.oci.image.layer.v1.tar+zstd"}


def test_index_is_pushed_with_its_children_and_tagged_last(registry, archive, cache_dir, tmp_path):
    # an OCI layout whose index.json points at an image index (a multi-arch image) of one manifest
    first = api.push(api.PushRequest(src=archive["path"], registry=registry.host + "/src", plain_http=True,
                                     cache_dir=cache_dir, compression="none"))
    reg = Registry(registry.host, plain_http=True)
    manifest_digest = first["artifacts"][0]["digest"]
    raw, media_type = reg.get_manifest("src/gpu-device", manifest_digest, [
        "application/vnd.docker.distribution.manifest.v2+json"])
    layout = tmp_path / "multi"
    (layout / "blobs" / "sha256").mkdir(parents=True)

    def put(data):
        digest = "sha256:" + __import__("hashlib").sha256(data).hexdigest()
        (layout / "blobs" / "sha256" / digest[7:]).write_bytes(data)
        return digest
    body = json.loads(raw)
    for desc in [body["config"]] + body["layers"]:
        put(reg.get_blob("src/gpu-device", desc["digest"]))
    put(raw)
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
             "manifests": [{"mediaType": media_type, "digest": manifest_digest, "size": len(raw),
                            "platform": {"architecture": "amd64", "os": "linux"}}]}
    index_raw = json.dumps(index).encode()
    index_digest = put(index_raw)
    (layout / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.index.v1+json", "digest": index_digest, "size": len(index_raw),
        "annotations": {"org.opencontainers.image.ref.name": "multi"}}]}))
    result = api.push(api.PushRequest(src=str(layout), registry=registry.host + "/dst", plain_http=True,
                                      cache_dir=cache_dir))
    (art,) = result["artifacts"]
    assert art["kind"] == "index" and art["digest"] == index_digest
    assert art["ref"] == registry.host + "/dst/multi:multi"
    assert reg.manifest_digest("dst/multi", manifest_digest, [media_type]) == manifest_digest
    assert api.push(api.PushRequest(src=str(layout), registry=registry.host + "/dst", plain_http=True,
                                    cache_dir=cache_dir))["changed"] is False


def test_chart_tgz_then_helm_pull(registry, cache_dir, tmp_path):
    import glob
    import shutil
    helm = next(iter(sorted(glob.glob("/root/.cache/metax-gpu/helm/*/bin/helm"))), shutil.which("helm"))
    if not helm:
        pytest.skip("helm not installed")
    chart = tmp_path / "src" / "metax-gpu-extensions"
    chart.mkdir(parents=True)
    (chart / "templates").mkdir()
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: metax-gpu-extensions\nversion: 0.1.0\n"
                                      "description: test\ntype: application\n")
    (chart / "templates" / "cm.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: t\n")
    subprocess.run([helm, "package", str(chart), "-d", str(tmp_path)], check=True, capture_output=True)
    tgz = tmp_path / "metax-gpu-extensions-0.1.0.tgz"
    result = api.push(api.PushRequest(src=str(tgz), registry=registry.host + "/charts", plain_http=True,
                                      cache_dir=cache_dir))
    (art,) = result["artifacts"]
    assert art["kind"] == "chart" and art["ref"] == registry.host + "/charts/metax-gpu-extensions:0.1.0"
    out = tmp_path / "pulled"
    out.mkdir()
    proc = subprocess.run([helm, "pull", "oci://%s/charts/metax-gpu-extensions" % registry.host, "--version", "0.1.0",
                           "--plain-http", "-d", str(out)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert (out / tgz.name).read_bytes() == tgz.read_bytes()
    # what `helm install oci://...` reads, without a cluster
    shown = subprocess.run([helm, "show", "chart", "oci://%s/charts/metax-gpu-extensions" % registry.host,
                            "--version", "0.1.0", "--plain-http"], capture_output=True, text=True, check=False)
    assert shown.returncode == 0 and "name: metax-gpu-extensions" in shown.stdout, shown.stderr
    manifest = json.loads(skopeo_inspect(art["ref"])["raw"])
    assert manifest["config"]["mediaType"] == "application/vnd.cncf.helm.config.v1+json"
    assert manifest["layers"][0]["mediaType"] == "application/vnd.cncf.helm.chart.content.v1.tar+gzip"


def test_refused_media_type_is_named_and_nothing_tagged(registry, cache_dir, tmp_path):
    layout = tmp_path / "odd"
    (layout / "blobs" / "sha256").mkdir(parents=True)
    body = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.example.unknown+json",
                       "manifests": []}).encode()
    digest = "sha256:" + __import__("hashlib").sha256(body).hexdigest()
    (layout / "blobs" / "sha256" / digest[7:]).write_bytes(body)
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.example.unknown+json", "digest": digest, "size": len(body),
        "annotations": {"org.opencontainers.image.ref.name": "odd"}}]}))
    with pytest.raises(RegistryError) as err:
        api.push(api.PushRequest(src=str(layout), registry=registry.host + "/p", plain_http=True, cache_dir=cache_dir,
                                 retries=0))
    assert "refused the media type" in str(err.value), str(err.value)


def test_storage_failure_is_reported_and_leaves_no_tag(registry, archive, cache_dir):
    # the registry's blob store replaced by a file: every write fails with a 5xx, as on a full disk
    data = os.path.join(registry.root, "data", "docker", "registry", "v2")
    os.makedirs(data, exist_ok=True)
    with open(os.path.join(data, "blobs"), "w") as handle:
        handle.write("not a directory")
    with pytest.raises(RegistryError) as err:
        api.push(api.PushRequest(src=archive["path"], registry=registry.host + "/p", plain_http=True,
                                 cache_dir=cache_dir, compression="none", retries=1))
    assert "HTTP 5" in str(err.value) and "full disk" in str(err.value), str(err.value)
    reg = Registry(registry.host, plain_http=True)
    assert reg.manifest_digest("p/gpu-device", "1.2.3", ["application/vnd.docker.distribution.manifest.v2+json"]) is None


def test_proxy_refusing_chunked_uploads_falls_back_to_known_length(registry, archive, cache_dir):
    from registry_fixtures import NoChunkedProxy
    proxy = NoChunkedProxy(int(registry.host.split(":")[1]))
    try:
        result = api.push(api.PushRequest(src=archive["path"], registry="127.0.0.1:%d/metax" % proxy.port,
                                          plain_http=True, cache_dir=cache_dir, concurrency=1))
    finally:
        proxy.close()
    assert proxy.refused >= 1
    assert skopeo_inspect(registry.host + "/metax/gpu-device:1.2.3")["digest"] == result["artifacts"][0]["digest"]


def test_bearer_token_flow_caches_a_token_per_scope(tmp_path, archive, cache_dir):
    from registry_fixtures import start_token_registry
    reg, tokens = start_token_registry(str(tmp_path / "token-reg"), "robot", "t0ken-pass")
    try:
        with pytest.raises(AuthError) as err:
            api.push(api.PushRequest(src=archive["path"], registry=reg.host + "/metax", plain_http=True,
                                     cache_dir=cache_dir, username="robot", password="wrong"))
        assert reg.host in str(err.value)
        first = api.push(api.PushRequest(src=archive["path"], registry=reg.host + "/metax", plain_http=True,
                                         cache_dir=cache_dir, username="robot", password="t0ken-pass"))
        assert first["changed"] is True
        # one token for the ping, one for the repository: not one per request
        assert sorted(set(tokens.requests)) == ["", "repository:metax/gpu-device:pull,push"]
        assert tokens.requests.count("repository:metax/gpu-device:pull,push") == 1
        pulled = skopeo_inspect(first["artifacts"][0]["ref"], creds="robot:t0ken-pass")
        assert pulled["digest"] == first["artifacts"][0]["digest"]
        again = api.push(api.PushRequest(src=archive["path"], registry=reg.host + "/metax", plain_http=True,
                                         cache_dir=cache_dir, username="robot", password="t0ken-pass"))
        assert again["changed"] is False
    finally:
        reg.stop()
        tokens.close()
