# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""module_utils/archive/: extraction that cannot leave its tree, within bounds (issue 39)."""

from __future__ import annotations

import gzip
import io
import lzma
import os
import stat
import tarfile
import tracemalloc

import pytest

from ansible_collections.metax.gpu.plugins.module_utils import archive as A


def entry(name, kind="file", data=b"", mode=0o644, link=""):
    info = tarfile.TarInfo(name)
    info.mode = mode
    info.mtime = 1700000000
    if kind == "file":
        info.size = len(data)
        return info, io.BytesIO(data)
    info.type = {"dir": tarfile.DIRTYPE, "sym": tarfile.SYMTYPE, "hard": tarfile.LNKTYPE,
                 "chr": tarfile.CHRTYPE, "blk": tarfile.BLKTYPE, "fifo": tarfile.FIFOTYPE}[kind]
    info.linkname = link
    return info, None


def write_tar(path, *entries, compress="", fmt=tarfile.PAX_FORMAT):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for info, data in entries:
            tar.addfile(info, data)
    data = buf.getvalue()
    if compress == "gz":
        data = gzip.compress(data, 1)
    elif compress == "xz":
        data = lzma.compress(data, preset=0)
    with open(str(path), "wb") as handle:
        handle.write(data)
    return str(path)


@pytest.fixture
def victim(tmp_path):
    path = tmp_path / "victim"
    path.mkdir()
    (path / "secret").write_bytes(b"host secret")
    os.chmod(str(path / "secret"), 0o600)
    os.chmod(str(path), 0o750)
    return path


def state(path):
    return sorted((p.name, p.read_bytes(), stat.S_IMODE(p.lstat().st_mode)) for p in path.iterdir()), \
        stat.S_IMODE(path.stat().st_mode)


def left_over(tmp_path):
    return sorted(n for n in os.listdir(str(tmp_path)) if n.endswith(".tmp"))


@pytest.mark.parametrize("compress", ["", "gz", "xz"])
def test_a_plain_archive_is_extracted_whole(tmp_path, compress):
    src = write_tar(tmp_path / "a.tar", entry("./", "dir", mode=0o755), entry("bin/", "dir", mode=0o755),
                    entry("bin/tool", data=b"#!/bin/sh\n", mode=0o755), entry("lib/libx.so.1", data=b"ELF"),
                    entry("lib/libx.so", "sym", link="libx.so.1"), entry("lib/libx.hard", "hard", link="lib/libx.so.1"),
                    compress=compress)
    dest = tmp_path / "out"
    assert A.extract(src, str(dest)) == []
    assert (dest / "bin" / "tool").read_bytes() == b"#!/bin/sh\n"
    assert stat.S_IMODE((dest / "bin" / "tool").stat().st_mode) == 0o755
    assert (dest / "bin" / "tool").stat().st_mtime == 1700000000
    assert os.readlink(str(dest / "lib" / "libx.so")) == "libx.so.1"
    assert (dest / "lib" / "libx.hard").stat().st_ino == (dest / "lib" / "libx.so.1").stat().st_ino
    assert left_over(tmp_path) == []


def test_setuid_setgid_sticky_and_write_for_others_are_stripped(tmp_path):
    src = write_tar(tmp_path / "a.tar", entry("d/", "dir", mode=0o1777), entry("d/su", data=b"x", mode=0o6777))
    A.extract(src, str(tmp_path / "out"))
    assert stat.S_IMODE((tmp_path / "out" / "d").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "out" / "d" / "su").stat().st_mode) == 0o755


def test_a_symlink_then_a_file_of_that_name_writes_no_host_file(tmp_path, victim):
    before = state(victim)
    src = write_tar(tmp_path / "a.tar", entry("evil", "sym", link=str(victim / "secret")),
                    entry("evil", data=b"pwned", mode=0o6777))
    A.extract(src, str(tmp_path / "out"))
    assert state(victim) == before
    assert not (tmp_path / "out" / "evil").is_symlink() and (tmp_path / "out" / "evil").read_bytes() == b"pwned"


def test_a_symlink_to_a_directory_then_a_directory_entry_chmods_no_host_directory(tmp_path, victim):
    before = state(victim)
    src = write_tar(tmp_path / "a.tar", entry("d", "sym", link=str(victim)), entry("d/", "dir", mode=0o777))
    A.extract(src, str(tmp_path / "out"))
    assert state(victim) == before
    assert (tmp_path / "out" / "d").is_dir() and not (tmp_path / "out" / "d").is_symlink()


@pytest.mark.parametrize("link", ["{victim}", "../../victim", "sub/../../../victim"])
def test_a_member_through_a_symlink_is_refused_and_nothing_is_left(tmp_path, victim, link):
    before = state(victim)
    src = write_tar(tmp_path / "a.tar", entry("ok", data=b"written first"),
                    entry("d", "sym", link=link.format(victim=victim)), entry("d/secret", data=b"pwned"))
    with pytest.raises(A.ArchiveError, match="member d/secret: d is a symbolic link: nothing is written through it"):
        A.extract(src, str(tmp_path / "out"))
    assert state(victim) == before
    assert not (tmp_path / "out").exists() and left_over(tmp_path) == []


@pytest.mark.parametrize("entries, match", [
    ([entry("lnk", "sym", link="/etc/hostname"), entry("copy", "hard", link="lnk")], "not a regular file"),
    ([entry("copy", "hard", link="/etc/hostname")], "a hard link to /etc/hostname, outside the archive"),
    ([entry("copy", "hard", link="../victim/secret")], "outside the archive"),
    ([entry("copy", "hard", link="missing")], "which is not in the tree|not a regular file"),
    ([entry("d/", "dir"), entry("copy", "hard", link="d")], "not a regular file"),
])
def test_hard_links_only_name_regular_files_of_the_tree(tmp_path, entries, match):
    src = write_tar(tmp_path / "a.tar", *entries)
    with pytest.raises(A.ArchiveError, match="member copy: .*" + match):
        A.extract(src, str(tmp_path / "out"))
    assert not (tmp_path / "out").exists() and left_over(tmp_path) == []


@pytest.mark.parametrize("name, match", [
    ("/etc/evil", "an absolute name"), ("../evil", "a name with '..'"), ("a/../../evil", "a name with '..'"),
    ("a/" * 200 + "f", "levels deep"), ("x" * 5000, "a name of 5000 characters"),
])
def test_names_that_leave_the_tree_are_refused(tmp_path, name, match):
    src = write_tar(tmp_path / "a.tar", entry(name, data=b"x"))
    with pytest.raises(A.ArchiveError, match=match):
        A.extract(src, str(tmp_path / "out"))
    assert not (tmp_path / "evil").exists() and not (tmp_path / "out").exists()


def test_devices_and_fifos_are_skipped_and_reported(tmp_path):
    src = write_tar(tmp_path / "a.tar", entry("null", "chr"), entry("sda", "blk"), entry("pipe", "fifo"),
                    entry("f", data=b"x"))
    assert A.extract(src, str(tmp_path / "out")) == ["null", "sda", "pipe"]
    assert os.listdir(str(tmp_path / "out")) == ["f"]


def test_an_existing_destination_is_refused(tmp_path):
    src = write_tar(tmp_path / "a.tar", entry("f", data=b"x"))
    (tmp_path / "out").mkdir()
    with pytest.raises(A.ArchiveError, match="exists"):
        A.extract(src, str(tmp_path / "out"))


def test_too_many_members(tmp_path):
    src = write_tar(tmp_path / "a.tar", *[entry("f%d" % i) for i in range(30)])
    with pytest.raises(A.ArchiveError, match="member f20: more than 20 members"):
        A.extract(src, str(tmp_path / "out"), A.Limits(max_members=20))
    assert left_over(tmp_path) == []
    A.extract(src, str(tmp_path / "out"), A.Limits(max_members=30))


def test_a_small_xz_that_expands_hugely(tmp_path):
    big = tarfile.TarInfo("zeros")
    big.size = 96 << 20
    src = write_tar(tmp_path / "bomb.tar.xz", (big, io.BytesIO(bytes(big.size))), compress="xz")
    assert os.path.getsize(src) < 64 << 10
    with pytest.raises(A.ArchiveError, match="member zeros is 100663296 bytes, above max_member_size"):
        A.extract(src, str(tmp_path / "out"), A.Limits(max_member_size=32 << 20))
    with pytest.raises(A.ArchiveError, match="member zeros: the archive expands to more than max_total_size"):
        A.extract(src, str(tmp_path / "out"), A.Limits(max_total_size=32 << 20))
    assert left_over(tmp_path) == [] and not (tmp_path / "out").exists()


def test_many_small_members_add_up_to_the_total(tmp_path):
    src = write_tar(tmp_path / "a.tar", *[entry("f%d" % i, data=bytes(1000)) for i in range(10)])
    with pytest.raises(A.ArchiveError, match="member f5: the archive expands to more than max_total_size"):
        A.extract(src, str(tmp_path / "out"), A.Limits(max_total_size=5500))


@pytest.mark.parametrize("compress", ["gz", "xz"])
def test_decompression_is_bounded_in_memory(tmp_path, compress):
    big = tarfile.TarInfo("zeros")
    big.size = 64 << 20
    src = write_tar(tmp_path / "bomb.tar", (big, io.BytesIO(bytes(big.size))), compress=compress)
    tracemalloc.start()
    try:
        A.extract(src, str(tmp_path / "out"))
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (tmp_path / "out" / "zeros").stat().st_size == 64 << 20
    assert peak < 8 << 20, "peak %d MiB" % (peak >> 20)


def test_headers_are_not_kept(tmp_path):
    src = write_tar(tmp_path / "many.tar", *[entry("d%d/" % i, "dir") for i in range(20000)], fmt=tarfile.GNU_FORMAT)
    budget = A.Budget()
    tracemalloc.start()
    try:
        with open(src, "rb") as raw, A.open_stream(raw) as tar:
            count = sum(1 for _member in A.members(tar, budget))
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == budget.members == 20000
    assert peak < 4 << 20, "peak %d MiB" % (peak >> 20)  # every TarInfo kept: some 20 MiB


def test_an_oversized_pax_header_is_refused_before_it_is_read(tmp_path):
    info, data = entry("f", data=b"x")
    info.pax_headers = {"comment": "x" * (2 << 20)}
    src = write_tar(tmp_path / "a.tar", (info, data))
    with pytest.raises(A.ArchiveError, match="an extended tar header of .* bytes .* above max_header_size"):
        A.extract(src, str(tmp_path / "out"))
    A.extract(src, str(tmp_path / "out"), A.Limits(max_header_size=4 << 20))


def test_a_chain_of_extended_headers_is_refused(tmp_path):
    one = io.BytesIO()
    with tarfile.open(fileobj=one, mode="w", format=tarfile.GNU_FORMAT) as tar:
        tar.addfile(*entry("n" * 200, data=b"x"))   # a GNU long-name header, then the member
    block = one.getvalue()
    longname = block[:1024]  # the long-name header and its one data block
    with open(str(tmp_path / "a.tar"), "wb") as handle:
        handle.write(longname * 50 + block[1024:])
    with pytest.raises(A.ArchiveError, match="extended tar headers in a row"):
        A.extract(str(tmp_path / "a.tar"), str(tmp_path / "out"))


def test_corrupt_input_is_an_archive_error(tmp_path):
    (tmp_path / "junk").write_bytes(b"\xfd7zXZ\x00 not really xz")
    with pytest.raises(A.ArchiveError, match="cannot extract"):
        A.extract(str(tmp_path / "junk"), str(tmp_path / "out"))
    assert left_over(tmp_path) == []


# -- layers ----------------------------------------------------------------------------------------

def staged(tmp_path, name, *entries):
    stage = tmp_path / name
    stage.mkdir()
    src = write_tar(tmp_path / (name + ".tar"), *entries)
    with open(src, "rb") as raw, A.open_stream(raw) as tar:
        A.extract_members(tar, str(stage), A.Budget())
    return str(stage)


def test_layers_merge_with_whiteouts_and_opaque_directories(tmp_path):
    dest = tmp_path / "tree"
    dest.mkdir()
    A.merge_layer(staged(tmp_path, "l1", entry("a/", "dir", mode=0o755), entry("a/x", data=b"1"),
                         entry("a/y", data=b"1"), entry("b/", "dir"), entry("b/z", data=b"1"), entry("c", data=b"1"),
                         entry("link", "sym", link="a")), str(dest))
    A.merge_layer(staged(tmp_path, "l2", entry("a/.wh.x"), entry("b/.wh..wh..opq"), entry("b/new", data=b"2"),
                         entry("c/", "dir"), entry("c/inside", data=b"2"), entry(".wh.link")), str(dest))
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*")) == ["a", "a/y", "b", "b/new", "c", "c/inside"]


@pytest.mark.parametrize("name", [".wh..", ".wh...", ".wh."])
def test_a_whiteout_naming_dot_or_dot_dot_is_refused(tmp_path, name):
    dest = tmp_path / "tree"
    (dest / "sub").mkdir(parents=True)
    (dest / "sub" / "kept").write_bytes(b"k")
    with pytest.raises(A.ArchiveError, match="a whiteout of"):
        A.merge_layer(staged(tmp_path, "l", entry("sub/" + name)), str(dest))
    assert (dest / "sub" / "kept").read_bytes() == b"k"


def test_a_layer_directory_over_a_lower_symlink_is_refused(tmp_path, victim):
    before = state(victim)
    dest = tmp_path / "tree"
    dest.mkdir()
    A.merge_layer(staged(tmp_path, "l1", entry("d", "sym", link=str(victim))), str(dest))
    for n, layer in enumerate([[entry("d/.wh..wh..opq")], [entry("d/.wh.secret")], [entry("d/secret", data=b"x")],
                               [entry("d/", "dir", mode=0o777)]]):
        with pytest.raises(A.ArchiveError, match="a lower layer made d a symbolic link"):
            A.merge_layer(staged(tmp_path, "l2-%d" % n, *layer), str(dest))
        assert state(victim) == before


def test_a_layer_file_replaces_a_lower_symlink_itself(tmp_path, victim):
    before = state(victim)
    dest = tmp_path / "tree"
    dest.mkdir()
    A.merge_layer(staged(tmp_path, "l1", entry("f", "sym", link=str(victim / "secret"))), str(dest))
    A.merge_layer(staged(tmp_path, "l2", entry("f", data=b"new", mode=0o4755)), str(dest))
    assert state(victim) == before
    assert (dest / "f").read_bytes() == b"new" and stat.S_IMODE((dest / "f").stat().st_mode) == 0o755


# -- a tree copied (an image volume) ---------------------------------------------------------------

def test_copy_tree_copies_links_as_links_skips_fifos_and_strips_setuid(tmp_path, victim):
    src = tmp_path / "src"
    (src / "lib").mkdir(parents=True)
    (src / "lib" / "libx.so.1").write_bytes(b"ELF")
    os.symlink("libx.so.1", str(src / "lib" / "libx.so"))
    os.symlink(str(victim), str(src / "escape"))
    os.mkfifo(str(src / "pipe"))
    (src / "su").write_bytes(b"x")
    os.chmod(str(src / "su"), 0o4755)
    A.copy_tree(str(src), str(tmp_path / "dest"))
    dest = tmp_path / "dest"
    assert sorted(os.listdir(str(dest))) == ["escape", "lib", "su"]
    assert os.readlink(str(dest / "escape")) == str(victim) and os.readlink(str(dest / "lib" / "libx.so")) == "libx.so.1"
    assert (dest / "lib" / "libx.so.1").read_bytes() == b"ELF"
    assert stat.S_IMODE((dest / "su").stat().st_mode) == 0o755


def test_copy_tree_is_bounded(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(5):
        (src / ("f%d" % i)).write_bytes(bytes(1000))
    with pytest.raises(A.ArchiveError, match="more than 3 members"):
        A.copy_tree(str(src), str(tmp_path / "d1"), A.Limits(max_members=3))
    with pytest.raises(A.ArchiveError, match="above max_member_size"):
        A.copy_tree(str(src), str(tmp_path / "d2"), A.Limits(max_member_size=999))
    with pytest.raises(A.ArchiveError, match="more than max_total_size"):
        A.copy_tree(str(src), str(tmp_path / "d3"), A.Limits(max_total_size=2500))


# -- sizes -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, value", [
    (4096, 4096), ("4096", 4096), ("64GiB", 64 << 30), ("64G", 64 << 30), ("64gb", 64 << 30), ("512MiB", 512 << 20),
    ("1 TiB", 1 << 40), ("10k", 10240), ("7B", 7),
])
def test_parse_size(text, value):
    assert A.parse_size(text) == value


@pytest.mark.parametrize("text", ["", "-1", "0", "1.5G", "12Q", "GiB", True, "1iB"])
def test_parse_size_refuses_nonsense(text):
    with pytest.raises(A.ArchiveError):
        A.parse_size(text)


def test_limits_must_be_positive():
    with pytest.raises(A.ArchiveError, match="max_members must be at least 1"):
        A.Limits(max_members=0)


def test_copy_files_copies_only_regular_files_and_never_writes_through_a_link(tmp_path, victim):
    before = state(victim)
    src = tmp_path / "payload" / "deb"
    src.mkdir(parents=True)
    (src / "metax-driver_2.14.3_amd64.deb").write_bytes(b"!<arch>\n")
    os.symlink(str(victim / "secret"), str(src / "leak.deb"))     # would read a file of the pod's image
    os.mkfifo(str(src / "pipe.deb"))                              # would block the copy
    (src / "sub").mkdir()
    dest = tmp_path / "cache"
    dest.mkdir()
    os.symlink(str(victim / "secret"), str(dest / "metax-driver_2.14.3_amd64.deb"))  # a link left in the cache
    copied = A.copy_files(str(src), str(dest), A.Budget())
    assert copied == ["metax-driver_2.14.3_amd64.deb"]
    assert not (dest / copied[0]).is_symlink() and (dest / copied[0]).read_bytes() == b"!<arch>\n"
    assert sorted(os.listdir(str(dest))) == copied
    assert state(victim) == before
    with pytest.raises(A.ArchiveError, match="above max_member_size"):
        A.copy_files(str(src), str(dest), A.Budget(A.Limits(max_member_size=4)))


def _with_size_minus_one(tar_bytes, header):
    """TAR_BYTES with the size of the member whose header starts at HEADER set to -1 (base-256)."""
    raw = bytearray(tar_bytes)
    raw[header + 124:header + 136] = b"\xff" * 12
    raw[header + 148:header + 156] = b"        "
    raw[header + 148:header + 155] = b"%06o\x00" % sum(raw[header:header + 512])   # the header checksum again
    return bytes(raw)


def test_a_negative_size_of_a_later_member_is_refused_not_taken_for_the_end(tmp_path):
    """Pythons with the fix for negative offsets (Debian's 3.11.2-6+deb12u8) end the archive quietly at
    such a header; the members after it would be lost without a word."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name in ("f", "g", "h"):
            tar.addfile(*entry(name, data=b"x" * 600))
    # g's header: after f's header and its two data blocks
    (tmp_path / "neg.tar").write_bytes(_with_size_minus_one(buf.getvalue(), 3 * 512))
    for opener in (A.open_seekable, A.open_stream):
        with pytest.raises(A.ArchiveError, match="member g: a negative size"):
            with open(str(tmp_path / "neg.tar"), "rb") as handle, opener(handle) as tar:
                list(A.members(tar, A.Budget()))


def test_a_negative_size_is_refused_not_looped_on(tmp_path):
    info, data = entry("f", data=b"x" * 600)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        tar.addfile(info, data)
        tar.addfile(*entry("g", data=b"y"))
    # -1 seeks back to this header for ever
    (tmp_path / "neg.tar").write_bytes(_with_size_minus_one(buf.getvalue(), 0))
    # refused as tarfile reads the first header, in open_seekable
    with pytest.raises(A.ArchiveError, match="member f: a negative size"):
        with open(str(tmp_path / "neg.tar"), "rb") as handle, A.open_seekable(handle) as tar:
            list(A.members(tar, A.Budget()))
