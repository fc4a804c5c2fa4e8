# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Crafted MXMACA payloads (issue 39, finding 1 and the resource bombs of finding 8) through ``maca.install``.

Each payload aims at a directory outside the node's tree (``victim``); the
install must refuse it (naming the member) or neutralise it, leave the victim
as it was, and leave nothing of the version behind in /opt.
"""

from __future__ import annotations

import io
import json
import lzma
import os
import stat
import tarfile
import tracemalloc

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.archive import Limits
from ansible_collections.metax.gpu.plugins.module_utils.host import HostRoot
from ansible_collections.metax.gpu.plugins.module_utils.maca import install as mi
from ansible_collections.metax.gpu.plugins.module_utils.maca import layout

VERSION = "2.23.0.4"


def entry(name, kind="file", data=b"", mode=0o644, link=""):
    info = tarfile.TarInfo(name)
    info.mode = mode
    if kind == "file":
        info.size = len(data)
        return info, io.BytesIO(data)
    info.type = {"dir": tarfile.DIRTYPE, "sym": tarfile.SYMTYPE, "hard": tarfile.LNKTYPE,
                 "chr": tarfile.CHRTYPE, "fifo": tarfile.FIFOTYPE}[kind]
    info.linkname = link
    if kind == "chr":
        info.devmajor, info.devminor = 1, 3
    return info, None


def layer(*entries, compress=""):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:" + compress, format=tarfile.PAX_FORMAT) as tar:
        for info, data in entries:
            tar.addfile(info, data)
    return buf.getvalue()


BASE = layer(entry("opt/", "dir", mode=0o755), entry("opt/maca/", "dir", mode=0o755),
             entry("opt/maca/lib/", "dir", mode=0o755), entry("opt/maca/Version.txt", data=b"Version:2.23.0.4\n"))


def payload(path, *layers):
    """A docker-save archive (xz), layers first, manifest.json last."""
    buf = io.BytesIO()
    names = []
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for i, data in enumerate(layers):
            names.append("%064x/layer.tar" % (i + 1))
            tar.addfile(*entry(names[-1], data=data))
        manifest = json.dumps([{"Config": "config.json", "RepoTags": ["maca-c500:%s" % VERSION], "Layers": names}])
        tar.addfile(*entry("config.json", data=b"{}"))
        tar.addfile(*entry("manifest.json", data=manifest.encode()))
    with open(str(path), "wb") as handle:
        handle.write(lzma.compress(buf.getvalue(), preset=0))
    return str(path)


@pytest.fixture
def node(tmp_path):
    host = HostRoot(str(tmp_path / "node"))
    os.makedirs(host.join("opt/other"))
    with open(host.join("opt/other/keep"), "w") as handle:
        handle.write("another product's file\n")
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "secret").write_bytes(b"host secret")
    os.chmod(str(victim / "secret"), 0o600)
    os.chmod(str(victim), 0o750)
    return host, victim


def victim_state(victim):
    return {name: ((victim / name).read_bytes(), stat.S_IMODE(os.lstat(str(victim / name)).st_mode))
            for name in sorted(os.listdir(str(victim)))}, stat.S_IMODE(os.stat(str(victim)).st_mode)


def refused(host, archive, match, **kwargs):
    with pytest.raises(layout.MacaLayoutError, match=match):
        mi.install(host, archive, VERSION, **kwargs)
    # nothing of the version: no directory, no staging, no link; the neighbour untouched
    assert sorted(os.listdir(host.join("opt"))) == ["other"]
    assert open(host.join("opt/other/keep")).read() == "another product's file\n"


# -- finding 1: the five crafted payloads ----------------------------------------------------------

def test_a_symlink_then_a_file_of_that_name_replaces_the_link_not_the_host_file(node, tmp_path):
    host, victim = node
    before = victim_state(victim)
    archive = payload(tmp_path / "p.xz", BASE, layer(
        entry("opt/maca/lib/evil", "sym", link=str(victim / "secret")),
        entry("opt/maca/lib/evil", data=b"pwned", mode=0o6777)))
    mi.install(host, archive, VERSION)
    assert victim_state(victim) == before
    installed = host.join("opt/maca-%s/lib/evil" % VERSION)
    st = os.lstat(installed)
    assert stat.S_ISREG(st.st_mode) and open(installed, "rb").read() == b"pwned"
    assert stat.S_IMODE(st.st_mode) == 0o755  # setuid, setgid and write for others never reach the host


def test_a_symlink_to_a_directory_then_a_directory_entry_never_chmods_the_target(node, tmp_path):
    host, victim = node
    before = victim_state(victim)
    archive = payload(tmp_path / "p.xz", BASE, layer(
        entry("opt/maca/d", "sym", link=str(victim)), entry("opt/maca/d/", "dir", mode=0o777)))
    mi.install(host, archive, VERSION)
    assert victim_state(victim) == before
    installed = host.join("opt/maca-%s/d" % VERSION)
    assert stat.S_ISDIR(os.lstat(installed).st_mode) and os.listdir(installed) == []


def test_a_symlinked_directory_then_files_in_it_in_the_next_layer_is_refused(node, tmp_path):
    host, victim = node
    before = victim_state(victim)
    archive = payload(tmp_path / "p.xz", BASE, layer(entry("opt/maca/d", "sym", link=str(victim))),
                      layer(entry("opt/maca/d/", "dir", mode=0o755), entry("opt/maca/d/secret", data=b"pwned")))
    refused(host, archive, "opt/maca/d|d/: a lower layer made d a symbolic link")
    assert victim_state(victim) == before


def test_a_symlinked_directory_then_a_file_through_it_in_the_same_layer_is_refused(node, tmp_path):
    host, victim = node
    before = victim_state(victim)
    archive = payload(tmp_path / "p.xz", BASE, layer(entry("opt/maca/d", "sym", link=str(victim)),
                                                     entry("opt/maca/d/secret", data=b"pwned")))
    refused(host, archive, "member opt/maca/d/secret: d is a symbolic link")
    assert victim_state(victim) == before


def test_an_opaque_whiteout_inside_a_symlinked_directory_is_refused(node, tmp_path):
    host, victim = node
    before = victim_state(victim)
    archive = payload(tmp_path / "p.xz", BASE, layer(entry("opt/maca/d", "sym", link=str(victim))),
                      layer(entry("opt/maca/d/.wh..wh..opq")))
    refused(host, archive, "symbolic link")
    assert victim_state(victim) == before


def test_a_whiteout_inside_a_symlinked_directory_is_refused(node, tmp_path):
    host, victim = node
    before = victim_state(victim)
    archive = payload(tmp_path / "p.xz", BASE, layer(entry("opt/maca/d", "sym", link=str(victim))),
                      layer(entry("opt/maca/d/.wh.secret")))
    refused(host, archive, "symbolic link")
    assert victim_state(victim) == before


def test_a_hardlink_to_a_host_file_through_a_symlink_is_refused(node, tmp_path):
    host, victim = node
    archive = payload(tmp_path / "p.xz", BASE, layer(
        entry("opt/maca/lnk", "sym", link=str(victim / "secret")),
        entry("opt/maca/copied", "hard", link="opt/maca/lnk")))
    refused(host, archive, "member opt/maca/copied: a hard link to opt/maca/lnk, which is not a regular file")


def test_a_hardlink_outside_the_tree_is_refused(node, tmp_path):
    host, victim = node
    archive = payload(tmp_path / "p.xz", BASE, layer(entry("opt/maca/copied", "hard", link=str(victim / "secret"))))
    refused(host, archive, "member opt/maca/copied: a hard link to .*victim/secret, outside the archive")


def test_a_whiteout_of_dot_dot_is_refused_and_removes_nothing(node, tmp_path):
    host, _victim = node
    # ".wh..." names "..": the old merge removed the parent of the version directory (all of /opt)
    archive = payload(tmp_path / "p.xz", BASE, layer(entry("opt/maca/.wh...")))
    refused(host, archive, r"a whiteout of '\.\.'")


def test_a_legitimate_hardlink_inside_the_tree_is_kept(node, tmp_path):
    host, _victim = node
    archive = payload(tmp_path / "p.xz", BASE, layer(
        entry("opt/maca/lib/libx.so.1", data=b"ELF"), entry("opt/maca/lib/libx.so", "hard", link="opt/maca/lib/libx.so.1")))
    mi.install(host, archive, VERSION)
    lib = host.join("opt/maca-%s/lib" % VERSION)
    assert os.stat(lib + "/libx.so").st_ino == os.stat(lib + "/libx.so.1").st_ino


# -- names and special files -----------------------------------------------------------------------

@pytest.mark.parametrize("name, match", [
    ("/opt/maca/abs", "an absolute name"),
    ("opt/maca/../../../escape", "a name with '..'"),
    ("../../escape", "a name with '..'"),
])
def test_absolute_and_dot_dot_names_are_refused(node, tmp_path, name, match):
    host, _victim = node
    refused(host, payload(tmp_path / "p.xz", BASE, layer(entry(name, data=b"x"))), "member %s: %s" % (name, match))
    assert not os.path.exists(str(tmp_path / "escape"))


def test_device_nodes_and_fifos_are_skipped(node, tmp_path):
    host, _victim = node
    archive = payload(tmp_path / "p.xz", BASE, layer(entry("opt/maca/null", "chr"), entry("opt/maca/pipe", "fifo")))
    mi.install(host, archive, VERSION)
    assert sorted(os.listdir(host.join("opt/maca-%s" % VERSION))) == ["Version.txt", "lib"]


# -- finding 8: bounds -----------------------------------------------------------------------------

def test_too_many_members_are_refused(node, tmp_path):
    host, _victim = node
    archive = payload(tmp_path / "p.xz", BASE, layer(*[entry("opt/maca/f%d" % i) for i in range(50)]))
    refused(host, archive, "more than 40 members", limits=Limits(max_members=40))
    mi.install(host, archive, VERSION, limits=Limits(max_members=100))   # raised: accepted


def test_a_small_xz_that_expands_hugely_is_refused_before_it_is_written(node, tmp_path):
    host, _victim = node
    big = tarfile.TarInfo("opt/maca/zeros")
    big.size = 64 << 20
    inner = io.BytesIO()
    with tarfile.open(fileobj=inner, mode="w") as tar:
        tar.addfile(big, io.BytesIO(bytes(big.size)))
    archive = payload(tmp_path / "p.xz", BASE, inner.getvalue())
    assert os.path.getsize(archive) < 64 << 10
    refused(host, archive, "member opt/maca/zeros is 67108864 bytes, above max_member_size \\(16777216\\)",
            limits=Limits(max_member_size=16 << 20))
    refused(host, archive, "more than max_total_size", limits=Limits(max_total_size=32 << 20))


def test_the_payload_is_streamed_not_held_in_memory(node, tmp_path):
    host, _victim = node
    # 24 layers of 4 MiB each (compressed to a few KiB): the old reader kept every member up to 4 MiB
    layers = [layer(entry("opt/maca/lib/f%d" % i, data=bytes((4 << 20) - (16 << 10)))) for i in range(24)]
    archive = payload(tmp_path / "p.xz", BASE, *layers)
    tracemalloc.start()
    try:
        mi.install(host, archive, VERSION)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(os.listdir(host.join("opt/maca-%s/lib" % VERSION))) == 24
    assert peak < 24 << 20, "peak %d MiB" % (peak >> 20)


# -- what the streamed reader must still read ------------------------------------------------------

def test_a_truncated_layer_is_a_clear_error_and_leaves_nothing(node, tmp_path):
    host, _victim = node
    whole = layer(entry("opt/maca/lib/big", data=bytes(100000)))
    refused(host, payload(tmp_path / "p.xz", BASE, whole[:20000]), "cannot read the payload .*unexpected end of data")


def test_an_oci_archive_with_gzip_layers_and_an_empty_layer(node, tmp_path):
    import gzip
    import hashlib
    host, _victim = node
    blobs = {}

    def blob(data):
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs["blobs/sha256/" + digest[7:]] = data
        return digest

    layers = [blob(gzip.compress(BASE)), blob(bytes(1024)),   # docker's empty layer: two zero blocks
              blob(gzip.compress(layer(entry("opt/maca/bin/", "dir", mode=0o755),
                                       entry("opt/maca/bin/mxcc", data=b"#!/bin/sh\n", mode=0o755))))]
    config = blob(b'{"rootfs": {"type": "layers"}}')
    manifest = blob(json.dumps({"schemaVersion": 2, "config": {"digest": config},
                                "layers": [{"digest": d} for d in layers]}).encode())
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.addfile(*entry("oci-layout", data=b'{"imageLayoutVersion":"1.0.0"}'))
        for name, data in blobs.items():
            tar.addfile(*entry(name, data=data))
        tar.addfile(*entry("index.json", data=json.dumps({"manifests": [{"digest": manifest}]}).encode()))
    (tmp_path / "oci.tar").write_bytes(buf.getvalue())
    mi.install(host, str(tmp_path / "oci.tar"), VERSION)
    installed = host.join("opt/maca-%s" % VERSION)
    assert sorted(os.listdir(installed)) == ["Version.txt", "bin", "lib"]
    assert open(installed + "/bin/mxcc", "rb").read() == b"#!/bin/sh\n"
