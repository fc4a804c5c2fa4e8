"""The vendor's .xz MACA archives pushed in one streaming pass, against a real docker-registry (and skopeo)."""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess

import pytest

from registry_fixtures import (NEW, OLD, CuttingProxy, compressible_layers, layer_tar, make_docker_archive, make_xz,
                               random_layers)

from ansible_collections.metax.gpu.plugins.module_utils.registry import api
from ansible_collections.metax.gpu.plugins.module_utils.registry import xzsource
from ansible_collections.metax.gpu.plugins.module_utils.registry.client import Registry
from ansible_collections.metax.gpu.plugins.module_utils.registry.errors import ArtifactError
from ansible_collections.metax.gpu.plugins.module_utils.registry.xzpush import ALL_MANIFEST_TYPES, progress_line


def layer_diff_ids_from_registry(ref: str, out_dir: str) -> list:
    """skopeo copies the pushed image to a directory; every layer is decompressed and hashed here."""
    subprocess.run(["skopeo", "copy", "-q", "--src-tls-verify=false", "docker://" + ref, "dir:" + out_dir],
                   check=True, capture_output=True)
    with open(os.path.join(out_dir, "manifest.json")) as handle:
        manifest = json.load(handle)
    ids = []
    for layer in manifest["layers"]:
        with open(os.path.join(out_dir, layer["digest"].split(":")[1]), "rb") as handle:
            data = handle.read()
        if layer["mediaType"].endswith("zstd"):
            import zstandard
            data = zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True).read()
        elif layer["mediaType"].endswith("gzip"):
            data = gzip.decompress(data)
        ids.append("sha256:" + hashlib.sha256(data).hexdigest())
    return ids


@pytest.mark.parametrize("generation", [OLD, NEW], ids=["maca-c500", "mxc500-maca"])
def test_guess_name_from_both_vendor_file_names(generation):
    file_name, _ref, name, _tag = generation
    assert xzsource.guess_name("/srv/" + file_name) == name


@pytest.mark.parametrize("generation,compression,multi_block,tool", [
    (OLD, "gzip", True, "xz"),
    (NEW, "gzip", False, "python"),
    (NEW, "zstd", True, "python"),
    (OLD, "none", False, "xz"),
], ids=["old-gzip-multiblock-xz", "new-gzip-singleblock-lzma", "new-zstd-multiblock-lzma", "old-none-singleblock-xz"])
def test_push_xz_archive_then_read_back_diff_ids(registry, cache_dir, tmp_path, monkeypatch, generation,
                                                 compression, multi_block, tool):
    file_name, ref, name, tag = generation
    layers = compressible_layers(2, 600_000) + random_layers(1, 300_000)
    info = make_xz(tmp_path, file_name, ref, layers, multi_block)
    assert xzsource.is_xz(info["path"])
    req = api.PushRequest(src=info["path"], registry=registry.host + "/metax", plain_http=True,
                          compression=compression, cache_dir=cache_dir, xz_tool=tool)
    first = api.push(req)
    (art,) = first["artifacts"]
    assert first["changed"] is True
    assert art["ref"] == "%s/metax/%s:%s" % (registry.host, name, tag)
    assert art["blobs_uploaded"] == 4 and art["blobs_mounted"] == 0   # the file name's guess was right
    assert [l["diff_id"] for l in art["layers"]] == info["diff_ids"]
    assert art["progress"] and "ETA" in art["progress"][-1]
    # what a puller gets back decompresses to the config's diff_ids
    assert layer_diff_ids_from_registry(art["ref"], str(tmp_path / "pulled")) == info["diff_ids"]
    config = json.loads(subprocess.run(["skopeo", "inspect", "--config", "--tls-verify=false", "docker://" + art["ref"]],
                                       check=True, capture_output=True).stdout)
    assert config["rootfs"]["diff_ids"] == info["diff_ids"]

    # unchanged re-push: the cache knows the manifest, the archive is not decompressed at all
    def no_reading(*_args, **_kw):
        raise AssertionError("an unchanged re-push must not decompress the archive")
    monkeypatch.setattr(xzsource, "XzReader", no_reading)
    second = api.push(req)
    assert second["changed"] is False
    assert second["artifacts"][0]["digest"] == art["digest"]
    assert second["artifacts"][0]["bytes_uploaded"] == 0


def test_image_name_wins_over_the_file_name(registry, cache_dir, tmp_path):
    info = make_xz(tmp_path, "vendor-image.bin", OLD[1], random_layers(2, 100_000))
    req = api.PushRequest(src=info["path"], registry=registry.host + "/metax", plain_http=True, cache_dir=cache_dir)
    (art,) = api.push(req)["artifacts"]
    assert art["ref"] == registry.host + "/metax/maca-c500:2.23.0.4"
    assert art["blobs_mounted"] == 2   # uploaded under the guessed name, mounted where the image belongs


def test_overrides_and_tag_from_an_earlier_push_of_the_same_archive(registry, cache_dir, tmp_path):
    info = make_xz(tmp_path, NEW[0], NEW[1], random_layers(1, 100_000))
    base = dict(src=info["path"], plain_http=True, cache_dir=cache_dir)
    first = api.push(api.PushRequest(**dict(base, registry=registry.host + "/mirror", repository="maca", tag="v1")))
    assert first["artifacts"][0]["ref"] == registry.host + "/mirror/maca:v1"
    # the cache holds the image's own name: without overrides it goes where the image says
    second = api.push(api.PushRequest(**dict(base, registry=registry.host + "/metax")))
    assert second["artifacts"][0]["ref"] == registry.host + "/metax/mxc500-maca:2.23.0.5"
    assert second["changed"] is True and second["artifacts"][0]["bytes_uploaded"] < 1000  # config only


@pytest.mark.parametrize("tool", ["xz", "python"])
def test_truncated_archive_fails_clearly_and_tags_nothing(registry, cache_dir, tmp_path, tool):
    info = make_xz(tmp_path, OLD[0], OLD[1], random_layers(3, 400_000))
    size = os.path.getsize(info["path"])
    with open(info["path"], "r+b") as handle:
        handle.truncate(size * 2 // 3)
    req = api.PushRequest(src=info["path"], registry=registry.host + "/metax", plain_http=True,
                          cache_dir=cache_dir, xz_tool=tool)
    with pytest.raises(ArtifactError, match="truncated or corrupt xz archive"):
        api.push(req)
    reg = Registry(registry.host, plain_http=True)
    assert reg.manifest_digest("metax/maca-c500", "2.23.0.4", ALL_MANIFEST_TYPES) is None


def test_cut_connection_mid_layer_restarts_that_layer(registry, cache_dir, tmp_path):
    info = make_xz(tmp_path, NEW[0], NEW[1], random_layers(3, 400_000))
    port = int(registry.host.split(":")[1])
    proxy = CuttingProxy(port, cut_after=700_000)   # inside the second layer
    try:
        req = api.PushRequest(src=info["path"], registry="127.0.0.1:%d/metax" % proxy.port, plain_http=True,
                              cache_dir=cache_dir)
        result = api.push(req)
    finally:
        proxy.close()
    assert proxy.cuts == 1
    (art,) = result["artifacts"]
    assert art["blobs_uploaded"] == 4
    ref = registry.host + "/metax/mxc500-maca:2.23.0.5"
    assert layer_diff_ids_from_registry(ref, str(tmp_path / "pulled")) == info["diff_ids"]


def test_check_mode_writes_nothing(registry, cache_dir, tmp_path):
    info = make_xz(tmp_path, OLD[0], OLD[1], random_layers(1, 100_000))
    req = api.PushRequest(src=info["path"], registry=registry.host + "/metax", plain_http=True,
                          cache_dir=cache_dir, check_mode=True)
    plan = api.push(req)
    assert plan["changed"] is True and plan["artifacts"][0]["would_upload_bytes"] > 0
    reg = Registry(registry.host, plain_http=True)
    assert reg.manifest_digest("metax/maca-c500", "2.23.0.4", ALL_MANIFEST_TYPES) is None


def test_archive_key_changes_with_content_not_with_a_copy_of_the_same_mtime(tmp_path):
    path = tmp_path / "a.xz"
    path.write_bytes(b"\xfd7zXZ\x00" + b"x" * 5000)
    key = xzsource.archive_key(str(path))
    os.utime(path, ns=(1, 1))
    assert xzsource.archive_key(str(path)) != key
    key = xzsource.archive_key(str(path))
    path.write_bytes(b"\xfd7zXZ\x00" + b"y" * 5000)
    os.utime(path, ns=(1, 1))
    assert xzsource.archive_key(str(path)) != key


def test_progress_line_has_bytes_rate_and_eta():
    line = progress_line("abc/layer.tar (9500 MiB)", 1 << 30, 10 << 30, 4.0)
    assert line == "abc/layer.tar (9500 MiB): 1.00 of 10.00 GiB (10%), 256 MiB/s, ETA 36 s"


def _add(tar, name: str, data: bytes = b"", link: str = "") -> None:
    import io
    import tarfile
    info = tarfile.TarInfo(name)
    info.mtime = 0
    if link:
        info.type, info.linkname = tarfile.SYMTYPE, link
        tar.addfile(info)
        return
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def test_docker25_layout_small_layers_and_a_symlinked_duplicate(registry, cache_dir, tmp_path):
    """docker >= 25 saves blobs/sha256/<diff_id> (small ones are buffered, large ones streamed);
    older docker writes a layer that appears twice as a symlink to the first copy."""
    import tarfile
    small, large = layer_tar({"etc/os-release": b"ID=ubuntu\n"}), compressible_layers(1, 6 << 20)[0]
    layers = [small, large, small]
    diff_ids = ["sha256:" + hashlib.sha256(l).hexdigest() for l in layers]
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {},
                         "rootfs": {"type": "layers", "diff_ids": diff_ids}}).encode()
    cfg = hashlib.sha256(config).hexdigest()
    tar_path = str(tmp_path / "image.tar")
    with tarfile.open(tar_path, "w") as tar:
        _add(tar, "blobs/sha256/" + diff_ids[0].split(":")[1], small)
        _add(tar, "blobs/sha256/" + diff_ids[1].split(":")[1], large)
        _add(tar, "dup/layer.tar", link="../blobs/sha256/" + diff_ids[0].split(":")[1])
        _add(tar, "blobs/sha256/" + cfg, config)
        entry = {"Config": "blobs/sha256/" + cfg, "RepoTags": [NEW[1]],
                 "Layers": ["blobs/sha256/" + d.split(":")[1] for d in diff_ids[:2]] + ["dup/layer.tar"]}
        _add(tar, "manifest.json", json.dumps([entry]).encode())
        _add(tar, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
    subprocess.run(["xz", "-T0", "-1", tar_path], check=True)
    req = api.PushRequest(src=tar_path + ".xz", registry=registry.host + "/metax", plain_http=True, cache_dir=cache_dir)
    (art,) = api.push(req)["artifacts"]
    assert art["ref"] == registry.host + "/metax/mxc500-maca:2.23.0.5"
    assert [l["member"] for l in art["layers"]] == ["blobs/sha256/" + diff_ids[1].split(":")[1]]  # streamed
    assert layer_diff_ids_from_registry(art["ref"], str(tmp_path / "pulled")) == diff_ids


def test_corrupt_layer_content_is_caught_by_the_diff_ids(registry, cache_dir, tmp_path):
    layers = random_layers(2, 100_000)
    tar = str(tmp_path / "image.tar")
    make_docker_archive(tar, OLD[1], layers)
    # the config promises other content than the archive holds (a damaged vendor file, a wrong config)
    with open(tar, "r+b") as handle:
        data = handle.read()
        handle.seek(data.index(b"data/1.bin") + 2048)
        handle.write(b"\x00" * 16)
    subprocess.run(["xz", "-T1", "-1", tar], check=True)
    req = api.PushRequest(src=tar + ".xz", registry=registry.host + "/metax", plain_http=True, cache_dir=cache_dir)
    with pytest.raises(ArtifactError, match="but the image config says"):
        api.push(req)
    reg = Registry(registry.host, plain_http=True)
    assert reg.manifest_digest("metax/maca-c500", "2.23.0.4", ALL_MANIFEST_TYPES) is None


def test_terminal_progress_line_shows_rate_and_eta(capsys):
    from ansible_collections.metax.gpu.plugins.module_utils.registry.cli import _progress_printer
    show = _progress_printer()
    show("harbor/metax/maca-c500:2.23.0.4", "abc/layer.tar", 0, 100 << 20)
    show("harbor/metax/maca-c500:2.23.0.4", "abc/layer.tar", 100 << 20, 100 << 20)
    err = capsys.readouterr().err
    assert err.startswith("\rharbor/metax/maca-c500:2.23.0.4 abc/layer.tar: 0.00 of 0.10 GiB (0%), 0 MiB/s, ETA 0 s\r")
    assert "abc/layer.tar: 0.10 of 0.10 GiB (100%), " in err and err.endswith(" MiB/s, ETA 0 s\n")


def test_docker_registry_cancels_a_torn_session_so_a_cut_layer_restarts(registry):
    """Why a cut layer restarts instead of resuming: after a PATCH dies mid-body, Distribution 2.8 answers
    BLOB_UPLOAD_INVALID for the session, even to the status GET a resuming client would send first."""
    import socket
    import time
    from urllib.parse import urlparse
    import requests
    base = "http://" + registry.host
    location = requests.post(base + "/v2/metax/t/blobs/uploads/").headers["Location"]
    first = requests.patch(location, data=b"a" * 100_000, headers={"Content-Type": "application/octet-stream"})
    assert first.status_code == 202 and first.headers["Range"] == "0-99999"
    url = urlparse(first.headers["Location"])
    with socket.create_connection((url.hostname, url.port)) as sock:
        sock.sendall(("PATCH %s?%s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/octet-stream\r\n"
                      "Transfer-Encoding: chunked\r\n\r\n" % (url.path, url.query, registry.host)).encode())
        sock.sendall(b"%x\r\n" % 50_000 + b"b" * 50_000 + b"\r\n")
        time.sleep(0.3)
    deadline = time.time() + 60
    while True:
        status = requests.get(first.headers["Location"])
        if status.status_code != 204 or time.time() > deadline:
            break
        time.sleep(0.1)
    assert status.status_code == 404 and "BLOB_UPLOAD_INVALID" in status.text
