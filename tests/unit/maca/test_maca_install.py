# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""MXMACA from its payload image onto a host: versioned directories, an atomic /opt/maca switch (maca/)."""

from __future__ import annotations

import io
import json
import lzma
import os
import tarfile

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.cdi.writer import host_maca
from ansible_collections.metax.gpu.plugins.module_utils.host import HostRoot
from ansible_collections.metax.gpu.plugins.module_utils.maca import install as mi
from ansible_collections.metax.gpu.plugins.module_utils.maca import layout


def layer(entries):
    """A layer tar: (name, content bytes | None for a directory | ('link', target))."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, content in entries:
            info = tarfile.TarInfo(name)
            if content is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif isinstance(content, tuple):
                info.type, info.linkname = tarfile.SYMTYPE, content[1]
                tar.addfile(info)
            else:
                info.size, info.mode = len(content), 0o755 if name.endswith("/mxcc") else 0o644
                tar.addfile(info, io.BytesIO(content))
    return buf.getvalue()


def payload(path, version, layers, xz=True, tag="maca-c500"):
    """A docker-save archive, layers first and manifest.json last (as docker and the vendor write it)."""
    buf = io.BytesIO()
    names = []
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for i, data in enumerate(layers):
            name = "%064x/layer.tar" % (i + 1)
            names.append(name)
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        manifest = json.dumps([{"Config": "config.json", "RepoTags": ["cr.metax-tech.com/library/%s:%s-ubuntu18.04-amd64"
                                                                      % (tag, version)], "Layers": names}]).encode()
        for name, data in (("config.json", b"{}"), ("manifest.json", manifest)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    data = buf.getvalue()
    with open(path, "wb") as handle:
        handle.write(lzma.compress(data) if xz else data)
    return str(path)


BASE = [("usr/", None), ("usr/bin/", None), ("usr/bin/bash", b"not maca"),
        ("opt/", None), ("opt/maca/", None), ("opt/maca/lib/", None), ("opt/maca/bin/", None)]


def maca_layers(version):
    return [
        layer(BASE + [("opt/maca/lib/libmcruntime.so." + version, b"runtime " + version.encode()),
                      ("opt/maca/lib/libmcruntime.so", ("link", "libmcruntime.so." + version)),
                      ("opt/maca/lib/old.so", b"removed by the next layer"),
                      ("opt/maca/tools/", None), ("opt/maca/tools/x", b"emptied by an opaque dir")]),
        layer([("opt/maca/bin/mxcc", b"#!/bin/sh\n"), ("opt/maca/lib/.wh.old.so", b""),
               ("opt/maca/tools/.wh..wh..opq", b""), ("opt/maca/tools/y", b"kept"),
               ("opt/maca/Version.txt", ("Version:%s\n" % version).encode()),
               ("etc/passwd", b"outside opt/maca")]),
    ]


def tree(root):
    out = {}
    for base, dirs, files in os.walk(root):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(base, d))]:
            path = os.path.join(base, name)
            rel = os.path.relpath(path, root)
            out[rel] = ("->" + os.readlink(path)) if os.path.islink(path) else open(path, "rb").read()
    return out


@pytest.mark.parametrize("xz", [True, False])
def test_install_extracts_only_opt_maca_with_whiteouts_and_switches(tmp_path, xz):
    host = HostRoot(str(tmp_path / "node"))
    os.makedirs(host.join("opt"))
    archive = payload(tmp_path / "maca.xz", "2.23.0.4", maca_layers("2.23.0.4"), xz=xz)
    the_plan = mi.install(host, archive, "2.23.0.4")
    assert the_plan.install and the_plan.switch and the_plan.remove == ()
    assert os.readlink(host.join("opt/maca")) == "maca-2.23.0.4"
    assert tree(host.join("opt/maca-2.23.0.4")) == {
        "lib/libmcruntime.so.2.23.0.4": b"runtime 2.23.0.4", "lib/libmcruntime.so": "->libmcruntime.so.2.23.0.4",
        "bin/mxcc": b"#!/bin/sh\n", "tools/y": b"kept", "Version.txt": b"Version:2.23.0.4\n"}
    assert os.access(host.join("opt/maca-2.23.0.4/bin/mxcc"), os.X_OK)
    # nothing but the version directory and the link: no temporary or staging directory left, nothing outside
    assert sorted(os.listdir(host.join("opt"))) == ["maca", "maca-2.23.0.4"]
    assert sorted(os.listdir(host.path)) == ["opt"]
    # the CDI spec follows the link to the version directory (what containers mount)
    assert host_maca(host).host_path == host.join("opt/maca-2.23.0.4")


def test_upgrade_keeps_the_previous_version_for_running_containers_and_drops_older(tmp_path):
    host = HostRoot(str(tmp_path / "node"))
    os.makedirs(host.join("opt"))
    for version in ("2.18.0.3", "2.23.0.4", "3.0.0.8"):
        archive = payload(tmp_path / ("maca-%s.xz" % version), version, maca_layers(version))
        the_plan = mi.install(host, archive, version, keep=1)
    assert the_plan.active_before == "2.23.0.4" and the_plan.remove == ("2.18.0.3",)
    assert sorted(os.listdir(host.join("opt"))) == ["maca", "maca-2.23.0.4", "maca-3.0.0.8"]
    assert os.readlink(host.join("opt/maca")) == "maca-3.0.0.8"
    # back to the previous one: no payload needed, nothing extracted, nothing removed
    back = mi.install(host, None, "2.23.0.4", keep=1)
    assert (back.install, back.switch, back.remove) == (False, True, ())
    assert open(host.join("opt/maca/Version.txt")).read() == "Version:2.23.0.4\n"
    # idempotent
    again = mi.install(host, None, "2.23.0.4", keep=1)
    assert (again.install, again.switch, again.remove) == (False, False, ())


def test_check_mode_changes_nothing_and_a_real_directory_is_never_replaced(tmp_path):
    host = HostRoot(str(tmp_path / "node"))
    os.makedirs(host.join("opt/maca/lib"))
    archive = payload(tmp_path / "maca.xz", "2.23.0.4", maca_layers("2.23.0.4"))
    with pytest.raises(layout.MacaLayoutError, match="is a directory"):
        mi.install(host, archive, "2.23.0.4")
    with pytest.raises(layout.MacaLayoutError, match="left alone"):
        mi.uninstall(host)
    os.rmdir(host.join("opt/maca/lib"))
    os.rmdir(host.join("opt/maca"))
    assert mi.install(host, archive, "2.23.0.4", check_mode=True).install
    assert os.listdir(host.join("opt")) == []


def test_uninstall_removes_the_link_and_the_versions(tmp_path):
    host = HostRoot(str(tmp_path / "node"))
    os.makedirs(host.join("opt/other"))
    mi.install(host, payload(tmp_path / "m.xz", "2.23.0.4", maca_layers("2.23.0.4")), "2.23.0.4")
    assert mi.uninstall(host) == ["/opt/maca", "/opt/maca-2.23.0.4"]
    assert os.listdir(host.join("opt")) == ["other"]


def test_payload_errors_are_clear(tmp_path):
    host = HostRoot(str(tmp_path / "node"))
    os.makedirs(host.join("opt"))
    no_maca = payload(tmp_path / "plain.xz", "1.0", [layer(BASE[:3])])
    with pytest.raises(layout.MacaLayoutError, match="no /opt/maca"):
        mi.install(host, no_maca, "2.23.0.4")
    (tmp_path / "junk").write_bytes(b"junk")
    with pytest.raises(layout.MacaLayoutError, match="cannot read the payload"):
        mi.install(host, str(tmp_path / "junk"), "2.23.0.4")
    assert os.listdir(host.join("opt")) == []


@pytest.mark.parametrize("ref, version", [
    ("cr.metax-tech.com/library/maca-c500:2.23.0.4-ubuntu18.04-amd64", "2.23.0.4"),
    ("mxc500-maca:2.23.0.4-ubuntu20.04-amd64", "2.23.0.4"),
    ("maca-n100:3.0.0.8", "3.0.0.8"),
])
def test_version_of_the_payload_image(ref, version):
    assert layout.version_of_image(ref) == version


def test_a_tag_without_a_version_is_refused():
    with pytest.raises(layout.MacaLayoutError):
        layout.version_of_image("maca-c500:latest")


def payload_tree(tmp_path, version, extra=b""):
    """A payload image's /opt/maca as the kubelet mounts it (an image volume), with a soname link."""
    from ansible_collections.metax.gpu.plugins.module_utils.sim.maca import write_tree
    tree = tmp_path / ("image-" + version) / "opt" / "maca"
    write_tree(str(tree), version, product="C500")
    os.symlink("libmxc-runtime64.so", str(tree / "lib" / "libmxc-runtime64.so.2"))
    (tree / "bin" / "mxcc").write_bytes(b"#!/bin/sh\n" + extra)
    os.chmod(str(tree / "bin" / "mxcc"), 0o755)
    return str(tree)


def test_install_from_a_mounted_payload_tree_is_the_same_versioned_install(tmp_path):
    host = HostRoot(str(tmp_path / "node"))
    os.makedirs(host.join("/opt"))
    first = mi.install(host, None, "2.18.0.3", tree=payload_tree(tmp_path, "2.18.0.3"))
    assert first.install and first.switch
    assert os.readlink(host.join("/opt/maca")) == "maca-2.18.0.3"
    installed = host.join("/opt/maca-2.18.0.3")
    assert open(os.path.join(installed, "Version.txt")).read() == "Version:2.18.0.3\n"
    # links stay links, modes stay modes
    assert os.readlink(os.path.join(installed, "lib/libmxc-runtime64.so.2")) == "libmxc-runtime64.so"
    assert os.stat(os.path.join(installed, "bin/mxcc")).st_mode & 0o777 == 0o755
    assert not [n for n in os.listdir(host.join("/opt")) if n.endswith(".tmp")]
    # again: nothing to do (the payload is not read)
    again = mi.install(host, None, "2.18.0.3", tree=str(tmp_path / "absent"))
    assert not (again.install or again.switch or again.remove)


def test_an_upgrade_from_a_tree_keeps_the_version_running_pods_mount(tmp_path):
    host = HostRoot(str(tmp_path / "node"))
    os.makedirs(host.join("/opt"))
    mi.install(host, None, "2.18.0.3", tree=payload_tree(tmp_path, "2.18.0.3"))
    # a running pod's CDI mount is the link's target at its start
    mounted = host_maca(host).host_path
    mi.install(host, None, "2.23.0.4", tree=payload_tree(tmp_path, "2.23.0.4"))
    assert os.readlink(host.join("/opt/maca")) == "maca-2.23.0.4"
    assert mounted.endswith("/opt/maca-2.18.0.3") and os.path.isfile(os.path.join(mounted, "Version.txt"))
    third = mi.install(host, None, "2.29.0.7", tree=payload_tree(tmp_path, "2.29.0.7"))
    assert third.remove == ("2.18.0.3",)
    assert sorted(os.listdir(host.join("/opt"))) == ["maca", "maca-2.23.0.4", "maca-2.29.0.7"]


def test_a_payload_without_a_tree_installs_nothing(tmp_path):
    host = HostRoot(str(tmp_path / "node"))
    os.makedirs(host.join("/opt"))
    empty = tmp_path / "image" / "opt" / "maca"
    empty.mkdir(parents=True)
    for tree, message in ((str(tmp_path / "none"), "has no MXMACA tree"), (str(empty), "is empty")):
        with pytest.raises(layout.MacaLayoutError, match=message):
            mi.install(host, None, "2.18.0.3", tree=tree)
        assert sorted(os.listdir(host.join("/opt"))) == []
