# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""scripts/cluster/packages.sh: exit status on a machine that lacks packages.

Regression guard for issue 11: with a pre-existing policy-rc.d (many images
ship one) the script installed the packages and then exited 1 through its EXIT
trap. ``dpkg-query`` and ``apt-get`` are fakes on PATH (they record their
calls); the policy-rc.d path is redirected into a temp dir.
"""

from __future__ import annotations

import os
import stat
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PACKAGES_SH = os.path.join(REPO, "scripts", "cluster", "packages.sh")

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="packages.sh installs only as root")


def _fake(bindir, name, body):
    path = bindir / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture()
def fakes(tmp_path):
    """PATH with a dpkg-query reporting every package missing and an apt-get that succeeds."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    calls = tmp_path / "calls"
    # apt-get sees whether the policy file exists while it "installs": that is what
    # keeps maintainer scripts from starting services.
    _fake(bindir, "dpkg-query", "exit 1\n")
    _fake(bindir, "apt-get", 'echo "apt-get $* policy=$(tail -n1 "$METAX_POLICY_RC_D" 2>/dev/null)" >>%s\n'
          "exit ${FAKE_APT_RC:-0}\n" % calls)
    env = dict(os.environ)
    env["PATH"] = "%s:%s" % (bindir, env["PATH"])
    env["METAX_POLICY_RC_D"] = str(tmp_path / "policy-rc.d")
    env["TMPDIR"] = str(tmp_path)
    return env, tmp_path / "policy-rc.d", calls


def _run(env, *args):
    return subprocess.run(["bash", PACKAGES_SH] + list(args), env=env, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=60, check=False)


@needs_root
def test_installs_and_exits_0_without_a_policy_file(fakes):
    env, policy, calls = fakes
    proc = _run(env)
    assert proc.returncode == 0, proc.stderr
    log = calls.read_text().splitlines()
    assert log[0].startswith("apt-get update")
    install = [line for line in log if line.startswith("apt-get install")]
    assert len(install) == 1 and " etcd-server " in install[0]
    # the policy file existed while apt-get ran, and was removed afterwards
    assert install[0].endswith("policy=exit 101")
    assert not policy.exists()


@needs_root
def test_installs_and_exits_0_with_a_pre_existing_policy_file(fakes):
    env, policy, calls = fakes
    policy.write_text("#!/bin/sh\n# the image's own\nexit 0\n")
    proc = _run(env)
    assert proc.returncode == 0, proc.stderr
    assert "Debian packages installed: " in proc.stderr
    assert any(line.startswith("apt-get install") for line in calls.read_text().splitlines())
    # the image's file is untouched
    assert policy.read_text() == "#!/bin/sh\n# the image's own\nexit 0\n"


@needs_root
def test_failed_install_exits_1_with_a_message_and_cleans_up(fakes):
    env, policy, _calls = fakes
    env["FAKE_APT_RC"] = "100"
    proc = _run(env)
    assert proc.returncode == 1
    assert "apt-get update failed" in proc.stderr
    assert not policy.exists()


def test_check_lists_missing_packages_and_exits_1(fakes):
    env, policy, calls = fakes
    proc = _run(env, "--check")
    assert proc.returncode == 1
    # every deb entry of the one dependency list, in its order
    with open(os.path.join(REPO, "requirements", "system.txt")) as handle:
        debs = [line.split("#")[0].split()[1] for line in handle if line.split("#")[0].split()[:1] == ["deb"]]
    assert "etcd-server" in debs and "docker-registry" in debs
    assert proc.stdout == "missing Debian packages: %s\n" % " ".join(debs)
    assert not calls.exists() and not policy.exists()


def test_the_list_is_read_from_requirements_system_txt(fakes, tmp_path):
    env, _policy, _calls = fakes
    scratch = tmp_path / "system.txt"
    scratch.write_text("# a comment\ndeb alpha   # first\ngo helm\n\ndeb beta\n")
    env["METAX_SYSTEM_DEPS"] = str(scratch)
    proc = _run(env, "--check")
    assert proc.returncode == 1
    assert proc.stdout == "missing Debian packages: alpha beta\n"
