from __future__ import annotations

import os

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.host import HostRoot, HostRootError


def test_join_and_host_path_keep_two_faces(tmp_path):
    host = HostRoot(str(tmp_path), host_prefix="/var/lib/sim")
    assert host.join("/dev/mxcd") == os.path.join(str(tmp_path), "dev/mxcd")
    assert host.host_path("/dev/mxcd") == "/var/lib/sim/dev/mxcd"
    assert HostRoot(str(tmp_path)).host_path("/dev/x") == os.path.join(str(tmp_path), "dev/x")


def test_realpath_reroots_absolute_links(tmp_path):
    (tmp_path / "sys/devices/a").mkdir(parents=True)
    (tmp_path / "sys/bus").mkdir(parents=True)
    os.symlink("/sys/devices/a", str(tmp_path / "sys/bus/abs"))
    os.symlink("../devices/a", str(tmp_path / "sys/bus/rel"))
    host = HostRoot(str(tmp_path))
    assert host.realpath("/sys/bus/abs") == "/sys/devices/a"
    assert host.realpath("sys/bus/rel") == "/sys/devices/a"


def test_realpath_detects_loops(tmp_path):
    os.symlink("b", str(tmp_path / "a"))
    os.symlink("a", str(tmp_path / "b"))
    with pytest.raises(HostRootError, match="too many levels"):
        HostRoot(str(tmp_path)).realpath("a")


def test_read_errors_name_the_file(tmp_path):
    host = HostRoot(str(tmp_path))
    with pytest.raises(HostRootError, match=str(tmp_path / "missing")):
        host.read_text("missing")
    (tmp_path / "n").write_text("zz\n")
    with pytest.raises(HostRootError, match="expected an integer"):
        host.read_int("n")
    assert host.read_int("absent", default=7) == 7
    (tmp_path / "h").write_text("0x9999\n")
    assert host.read_int("h", base=16) == 0x9999


def test_check_reports_missing_root(tmp_path):
    with pytest.raises(HostRootError, match="does not exist"):
        HostRoot(str(tmp_path / "nope")).check()


def test_write_file_atomic_leaves_no_temp_file(tmp_path):
    host = HostRoot(str(tmp_path))
    (tmp_path / "etc").mkdir()
    side = tmp_path / "side"
    side.mkdir()
    host.write_file_atomic("etc/f.yaml", b"a: 1\n", mode=0o600, tmp_dir=str(side))
    assert (tmp_path / "etc/f.yaml").read_bytes() == b"a: 1\n"
    assert oct((tmp_path / "etc/f.yaml").stat().st_mode & 0o777) == "0o600"
    assert os.listdir(str(tmp_path / "etc")) == ["f.yaml"]
    assert os.listdir(str(side)) == []


def test_write_attribute_on_a_plain_root_writes_the_file(tmp_path):
    (tmp_path / "attr").write_text("0\n")
    host = HostRoot(str(tmp_path))
    assert not host.is_simulated()
    host.write_attribute("/attr", "1")
    assert (tmp_path / "attr").read_text() == "1"
    with pytest.raises(HostRootError, match="cannot write"):
        host.write_attribute("/no/such/attr", "1")


def test_run_reports_missing_and_failing_commands(tmp_path):
    host = HostRoot(str(tmp_path))
    with pytest.raises(HostRootError, match="command not found"):
        host.run([str(tmp_path / "nope")])
    assert host.run(["sh", "-c", "echo out; echo err >&2; exit 3"]) == (3, "out\n", "err\n")


def _hook(root, status, message=""):
    """A kernel hook that records what it was asked and answers ``status``."""
    hook = root / ".metax-sim" / "kernel"
    hook.parent.mkdir(parents=True, exist_ok=True)
    hook.write_text("#!/bin/sh\nprintf '%%s %%s ' \"$1\" \"$2\" >> \"$METAX_HOST_ROOT/calls\"\n"
                    "cat >> \"$METAX_HOST_ROOT/calls\"\necho '%s' >&2\nexit %d\n" % (message, status))
    hook.chmod(0o755)


def test_hook_runs_instead_of_the_write_and_its_status_is_the_errno(tmp_path):
    import errno
    (tmp_path / "sys").mkdir()
    (tmp_path / "sys/attr").write_text("0\n")
    _hook(tmp_path, errno.EBUSY, "Device or resource busy")
    host = HostRoot(str(tmp_path))
    assert host.is_simulated()
    with pytest.raises(HostRootError, match="busy") as refused:
        host.write_attribute("sys/attr", "4")
    assert refused.value.errno == errno.EBUSY
    assert (tmp_path / "calls").read_text() == "write /sys/attr 4"
    assert (tmp_path / "sys/attr").read_text() == "0\n"      # the hook decides, not HostRoot


def test_hook_is_never_consulted_for_the_real_root():
    assert HostRoot("/").kernel_hook() is None


def test_a_plain_root_write_error_carries_the_errno(tmp_path):
    import errno
    with pytest.raises(HostRootError) as failed:
        HostRoot(str(tmp_path)).write_attribute("/missing/attr", "1")
    assert failed.value.errno == errno.ENOENT


def test_a_non_executable_hook_is_ignored(tmp_path):
    _hook(tmp_path, 0)
    (tmp_path / ".metax-sim" / "kernel").chmod(0o644)
    host = HostRoot(str(tmp_path))
    host.write_attribute("/attr", "1")
    assert not host.is_simulated() and (tmp_path / "attr").read_text() == "1"


def test_hook_is_ignored_when_sys_is_a_mount_point(tmp_path, monkeypatch):
    """A host mount in an agent container (/host with the real sysfs at /host/sys) never runs a hook."""
    (tmp_path / "sys").mkdir()
    _hook(tmp_path, 16)
    real_ismount = os.path.ismount
    monkeypatch.setattr(os.path, "ismount", lambda p: p == str(tmp_path / "sys") or real_ismount(p))
    host = HostRoot(str(tmp_path))
    assert host.kernel_hook() is None
    host.write_attribute("sys/attr", "1")
    assert (tmp_path / "sys/attr").read_text() == "1" and not (tmp_path / "calls").exists()
