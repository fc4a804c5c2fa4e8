# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The registry's archive readers against resource bombs (issue 39, finding 8): charts and image archives."""

from __future__ import annotations

import io
import json
import tarfile
import tracemalloc

import pytest

from ansible_collections.metax.gpu.plugins.module_utils import archive as A
from ansible_collections.metax.gpu.plugins.module_utils.registry import sources as S
from ansible_collections.metax.gpu.plugins.module_utils.registry.errors import ArtifactError

CHART_YAML = b"apiVersion: v2\nname: demo\nversion: 1.2.3\ndescription: a demo chart\n"


def add(tar, name, data=b"", kind=tarfile.REGTYPE):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def chart(path, chart_yaml=CHART_YAML, before=0):
    with tarfile.open(str(path), "w:gz", compresslevel=9) as tar:
        for i in range(before):
            add(tar, "demo/templates/%d" % i, kind=tarfile.DIRTYPE)
        add(tar, "demo/Chart.yaml", chart_yaml)
        add(tar, "demo/values.yaml", b"{}\n")
    return str(path)


def alias_bomb():
    lines = [b"apiVersion: v2", b"name: bomb", b"version: 1.0.0", b'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, cur in zip("abcdef", "bcdefg"):
        lines.append(("%s: &%s [%s]" % (cur, cur, ",".join(["*" + prev] * 9))).encode())
    lines.append(b"keywords: *g")
    return b"\n".join(lines) + b"\n"


def test_a_chart_is_read(tmp_path):
    art = S.read_chart(chart(tmp_path / "demo-1.2.3.tgz"))
    assert (art.name, art.tag) == ("demo", "1.2.3")
    assert json.loads(art.config.read_all()) == {"name": "demo", "version": "1.2.3", "description": "a demo chart",
                                                 "apiVersion": "v2"}


def test_the_yaml_alias_bomb_in_chart_yaml_is_refused(tmp_path):
    bomb = alias_bomb()
    assert len(bomb) < 600   # 520-odd bytes that expand to some 32 MiB of chart config
    with pytest.raises(ArtifactError, match="Chart.yaml is not valid YAML .*alias"):
        S.read_chart(chart(tmp_path / "bomb.tgz", bomb))


def test_a_chart_yaml_anchor_without_an_alias_is_fine(tmp_path):
    art = S.read_chart(chart(tmp_path / "demo.tgz", CHART_YAML + b"annotations: &x {a: b}\n"))
    assert json.loads(art.config.read_all())["annotations"] == {"a": "b"}


def test_a_chart_with_many_members_before_chart_yaml_keeps_no_header(tmp_path):
    path = chart(tmp_path / "many.tgz", before=30000)
    tracemalloc.start()
    try:
        art = S.read_chart(path)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert art.name == "demo"
    assert peak < 6 << 20, "peak %d MiB" % (peak >> 20)   # every header kept: some 40 MiB


def test_a_chart_beyond_helms_bounds_is_refused(tmp_path):
    with pytest.raises(ArtifactError, match="Chart.yaml is 6291456 bytes, above max_member_size"):
        S.read_chart(chart(tmp_path / "big.tgz", CHART_YAML + b"#" * ((6 << 20) - len(CHART_YAML))))
    with tarfile.open(str(tmp_path / "fat.tgz"), "w:gz") as tar:
        for i in range(30):
            add(tar, "demo/files/%d" % i, bytes(4 << 20))
        add(tar, "demo/Chart.yaml", CHART_YAML)
    with pytest.raises(ArtifactError, match="expands to more than max_total_size"):
        S.read_chart(str(tmp_path / "fat.tgz"))


def docker_archive(path, junk=0):
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        add(tar, "hello", b"hi\n")
    layer_bytes = layer.getvalue()
    config = json.dumps({"rootfs": {"type": "layers", "diff_ids": ["sha256:" + "0" * 64]}}).encode()
    with tarfile.open(str(path), "w") as tar:
        for i in range(junk):
            add(tar, "junk/%d" % i, kind=tarfile.DIRTYPE)
        add(tar, "abc/layer.tar", layer_bytes)
        add(tar, "config.json", config)
        add(tar, "manifest.json", json.dumps([{"Config": "config.json", "RepoTags": ["demo:1"],
                                               "Layers": ["abc/layer.tar"]}]).encode())
    return str(path)


def test_a_docker_archive_index_keeps_no_tarinfo(tmp_path):
    path = docker_archive(tmp_path / "img.tar", junk=30000)
    tracemalloc.start()
    try:
        arts = S.read_source(path)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [(a.name, a.tag) for a in arts] == [("demo", "1")]
    assert arts[0].layers[0].source.open().read(512)[:5] == b"hello"
    assert peak < 8 << 20, "peak %d MiB" % (peak >> 20)   # every TarInfo kept: some 40 MiB


def test_a_docker_archive_with_too_many_members_is_refused(tmp_path):
    path = docker_archive(tmp_path / "img.tar", junk=50)
    with pytest.raises(ArtifactError, match="more than 20 members"):
        S._TarStore(path, limits=A.Limits(max_members=20))


@pytest.fixture(scope="module")
def padded_xz(tmp_path_factory):
    """A docker archive with 20,000 members before the image, xz-compressed (built once: both readers only read it)."""
    import lzma
    base = tmp_path_factory.mktemp("padded-xz")
    plain = base / "img.tar"
    docker_archive(plain, junk=20000)
    (base / "img.tar.xz").write_bytes(lzma.compress(plain.read_bytes(), preset=0))
    return str(base / "img.tar.xz")


@pytest.mark.parametrize("tool", ["python", "auto"])
def test_the_xz_pusher_reads_its_archive_without_keeping_headers(padded_xz, tool):
    from ansible_collections.metax.gpu.plugins.module_utils.registry import xzsource as X
    budget = A.Budget()
    tracemalloc.start()
    try:
        with X.XzReader(padded_xz, tool) as reader:
            names = [m.name for m in A.members(X.open_tar(reader), budget, container=True) if m.isfile()]
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert names == ["abc/layer.tar", "config.json", "manifest.json"] and budget.members == 20003
    assert peak < 6 << 20, "peak %d MiB" % (peak >> 20)   # every header kept: some 20 MiB


def test_a_gzip_layer_is_inflated_a_chunk_at_a_time(tmp_path):
    import gzip
    from ansible_collections.metax.gpu.plugins.module_utils.registry import layerstream as LS
    plain = bytes(64 << 20)
    reader = LS._PlainReader(io.BytesIO(gzip.compress(plain, 9)))   # some 64 KiB: one read of the source
    sizes = []
    while True:
        block = reader.read()
        if not block:
            break
        sizes.append(len(block))
    assert sum(sizes) == len(plain)
    assert max(sizes) <= LS.CHUNK   # before: all 64 MiB out of one call


def test_a_zstd_layer_is_inflated_a_chunk_at_a_time():
    zstandard = pytest.importorskip("zstandard")
    from ansible_collections.metax.gpu.plugins.module_utils.registry import layerstream as LS
    plain = bytes(16 << 20) + b"end"
    packed = zstandard.ZstdCompressor().compress(plain[:8 << 20]) + zstandard.ZstdCompressor().compress(plain[8 << 20:])
    reader = LS._PlainReader(io.BytesIO(packed))
    blocks = []
    while True:
        block = reader.read()
        if not block:
            break
        blocks.append(block)
    assert b"".join(blocks) == plain   # both frames
    assert max(len(b) for b in blocks) <= LS.CHUNK


def test_an_xz_archive_is_pushed_without_keeping_its_headers(tmp_path):
    """The xz pusher against a real docker-registry: 30,000 member headers before the image cost no memory."""
    import lzma
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "registry"))
    from registry_fixtures import layer_tar, make_docker_archive, start_registry
    from ansible_collections.metax.gpu.plugins.module_utils.registry import api
    image = tmp_path / "image.tar"
    make_docker_archive(str(image), "cr.metax-tech.com/library/maca-c500:2.23.0.4", [layer_tar({"a": b"a" * 1000})])
    with tarfile.open(str(image)) as src, tarfile.open(str(tmp_path / "padded.tar"), "w") as out:
        for i in range(30000):
            add(out, "junk/%d" % i, kind=tarfile.DIRTYPE)
        for member in src.getmembers():
            out.addfile(member, src.extractfile(member))
    path = tmp_path / "maca-c500-container-2.23.0.4-ubuntu18.04-amd64.xz"
    path.write_bytes(lzma.compress((tmp_path / "padded.tar").read_bytes(), preset=0))
    registry = start_registry(str(tmp_path / "registry"))
    try:
        req = api.PushRequest(src=str(path), registry=registry.host + "/metax", plain_http=True, compression="gzip",
                              cache_dir=str(tmp_path / "cache"), xz_tool="python")
        tracemalloc.start()
        try:
            result = api.push(req)
            _current, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    finally:
        registry.stop()
    assert result["changed"] and result["artifacts"][0]["ref"].endswith("/metax/maca-c500:2.23.0.4")
    assert peak < 10 << 20, "peak %d MiB" % (peak >> 20)   # about 5 MiB; every header kept: 19 MiB
