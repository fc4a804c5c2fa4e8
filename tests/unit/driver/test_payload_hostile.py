# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Hostile driver payloads: a version that is a path, a payload file that is a link, FIFO or setuid."""

from __future__ import annotations

import os
import stat

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.driver import backend
from ansible_collections.metax.gpu.plugins.module_utils.driver.package import (DriverPackageError,
                                                                               check_payload_version)
from ansible_collections.metax.gpu.plugins.module_utils.host import HostRoot


@pytest.mark.parametrize("version", ["2.29.0.13", "2.12.13", "2.12.13-1", "3"])
def test_payload_versions_of_both_numbering_schemes_pass(version):
    assert check_payload_version(version) == version


@pytest.mark.parametrize("version", ["", "../x", "2.12/../../etc", "a b", "$(id)", "2..1", "-1", "2.12.13-..", "v2.12"])
def test_a_payload_version_that_could_name_another_path_is_refused(version):
    with pytest.raises(DriverPackageError, match="not a driver payload version"):
        check_payload_version(version)


def test_a_payload_file_that_is_a_link_is_refused_and_nothing_is_written(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("host file")
    payload = tmp_path / "payload"
    payload.mkdir()
    os.symlink(str(secret), str(payload / "metax-driver_2.12.13_amd64.deb"))
    host = HostRoot(str(tmp_path / "root"))
    with pytest.raises(backend.DriverError, match="refused"):
        backend.copy_payload_file(str(payload / "metax-driver_2.12.13_amd64.deb"), host, "var/cache/x.deb")
    assert not os.path.lexists(host.join("var/cache/x.deb"))


def test_a_payload_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "pipe.run"
    os.mkfifo(str(fifo))
    host = HostRoot(str(tmp_path / "root"))
    with pytest.raises(backend.DriverError, match="not a regular file"):
        backend.copy_payload_file(str(fifo), host, "var/cache/pipe.run")


def test_a_setuid_payload_file_is_copied_without_its_setuid_bit(tmp_path):
    src = tmp_path / "tool"
    src.write_text("#!/bin/sh\n")
    os.chmod(str(src), 0o6755)
    host = HostRoot(str(tmp_path / "root"))
    backend.copy_payload_file(str(src), host, "usr/bin/tool")
    assert stat.S_IMODE(os.stat(host.join("usr/bin/tool")).st_mode) == 0o755
