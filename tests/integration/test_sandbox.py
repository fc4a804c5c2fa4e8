# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""scripts/cluster/sandbox.sh: the second cluster's namespaces keep it and the machine apart.

Runs real namespaces (root; under CI a run that is not root fails here, as the cluster tests do; marked
cluster, so it runs with the cluster modules on the machine, not in the clean room's container), in
a sandbox of its own name and directory, so it runs beside both cluster streams. Also checks the
split of the cluster modules between the two streams (tests/integration/conftest.py).
"""

from __future__ import annotations

import os
import subprocess

import pytest

from conftest import COMPUTING_LAST, EITHER_CLUSTER, WAITING_FIRST, must_run  # noqa: E402
from module_claims import ModuleClaims, claimed_run, module_groups  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SANDBOX_SH = os.path.join(os.path.dirname(os.path.dirname(HERE)), "scripts", "cluster", "sandbox.sh")

# what the sandbox's command reports, one "key value" line each
PROBE = r"""
set -e
echo "pid1 $(cat /proc/1/comm)"
echo "links $(ip -o link show | awk -F': ' '{print $2}' | tr '\n' ' ')"
echo "sandbox ${METAX_SANDBOX} ${METAX_CGROUP_PREFIX}"
for d in /etc/kubernetes /var/lib/kubelet /var/lib/metax-gpu-cluster /run/netns /var/log/pods; do
  echo "entries $d $(ls -A "$d" | wc -l)"
done
echo "containers $(stat -c %d:%i /var/lib/containers)"
[ "$(findmnt -n -o FSTYPE /var/lib)" = overlay ] || exit 3
touch /etc/kubernetes/from-sandbox /var/lib/metax-gpu-cluster/from-sandbox /var/lib/from-sandbox /run/from-sandbox
rm -rf "$KEEP"
(sleep 600 &)
exit 7
"""


def _root_or_fail():
    if os.geteuid() != 0:
        if must_run():
            pytest.fail("sandbox.sh needs root (namespaces); run the tests as root", pytrace=False)
        pytest.skip("sandbox.sh needs root (namespaces)")


# With the cluster modules: the sandbox is where the second cluster runs, and like a cluster it needs the
# machine. In the clean room's container, whose root is itself an overlay, the sandbox's overlays cannot
# mount (their upper layers would sit on an overlay).
@pytest.mark.cluster
def test_sandbox_keeps_its_writes_and_processes_from_the_machine(tmp_path):
    _root_or_fail()
    # a directory of the machine's that the command removes inside (named for this test, removed after it)
    keep = "/var/lib/metax-gpu-sandbox-selftest-%d" % os.getpid()
    os.makedirs(keep)
    env = dict(os.environ, METAX_SANDBOX_DIR=str(tmp_path / "sandboxes"), KEEP=keep)
    before = {p: os.path.exists(p) for p in ("/etc/kubernetes", "/var/lib/metax-gpu-cluster")}
    try:
        result = subprocess.run([SANDBOX_SH, "selftest", "bash", "-c", PROBE], env=env, capture_output=True,
                                text=True, timeout=120, check=False)
        removed_inside_kept_outside = os.path.isdir(keep)
    finally:
        os.rmdir(keep)
    assert result.returncode == 7, result.stdout + result.stderr
    seen = {}
    for line in result.stdout.splitlines():
        key, value = line.split(" ", 1) if " " in line else (line, "")
        seen.setdefault(key, []).append(value)
    # PID 1 of its own PID namespace is the reaping bash, and the only link is its own loopback
    assert seen["pid1"] == ["bash"]
    assert seen["links"] == ["lo "]
    assert seen["sandbox"] == ["selftest metax-sandbox-selftest-"]
    # the cluster's paths start empty inside, whatever the machine has there
    assert sorted(seen["entries"]) == sorted("%s 0" % d for d in (
        "/etc/kubernetes", "/var/lib/kubelet", "/var/lib/metax-gpu-cluster", "/run/netns", "/var/log/pods"))
    # podman's storage is the machine's own
    st = os.stat("/var/lib/containers")
    assert seen["containers"] == ["%d:%d" % (st.st_dev, st.st_ino)]
    # nothing written or removed inside reached the machine
    for path in ("/etc/kubernetes/from-sandbox", "/var/lib/metax-gpu-cluster/from-sandbox", "/var/lib/from-sandbox",
                 "/run/from-sandbox"):
        assert not os.path.exists(path), path
    assert {p: os.path.exists(p) for p in before} == before
    assert removed_inside_kept_outside
    # the command's orphan died with the namespace, and the layers went with the sandbox
    assert subprocess.run(["pgrep", "-f", "^sleep 600$"], capture_output=True, check=False).returncode == 1
    assert os.listdir(str(tmp_path / "sandboxes")) == ["selftest.lock"]


def test_sandbox_refuses_a_bad_name_before_making_anything(tmp_path):
    env = dict(os.environ, METAX_SANDBOX_DIR=str(tmp_path / "sandboxes"))
    result = subprocess.run([SANDBOX_SH, "../x", "true"], env=env, capture_output=True, text=True, timeout=30,
                            check=False)
    assert result.returncode == 2
    assert "NAME must be [a-z0-9]+" in result.stderr
    assert not os.path.exists(str(tmp_path / "sandboxes"))


def test_second_stream_modules_exist_are_ordered_and_run_nothing_of_podman():
    assert EITHER_CLUSTER, "the second stream has no module"
    for name in EITHER_CLUSTER:
        path = os.path.join(HERE, name)
        assert os.path.isfile(path), name
        # ordered like the first stream: waiting modules first, computing ones last
        assert name in WAITING_FIRST or name in COMPUTING_LAST, name
        with open(path, encoding="utf-8") as handle:
            source = handle.read()
        # no route out of the sandbox, and podman's containers belong to the machine's stream
        assert "podman" not in source and "molecule" not in source.lower(), name
        assert "pytest.mark.cluster" in source, name
    # the module that takes its cluster down and up again checks the machine's: it stays there
    assert "test_zz_cluster_down.py" not in EITHER_CLUSTER


def _module(item):
    return item[0]


def _drain(run, until=None):
    """(item, nextitem) pairs from RUN, up to and including the first whose item is UNTIL."""
    taken = []
    for pair in run:
        taken.append(pair)
        if pair[0] == until:
            break
    return taken


def test_each_shared_module_runs_once_in_the_stream_that_claims_it_first(tmp_path):
    """The first stream takes the shared modules front to back after its own, the second from the back;
    where they meet, no module runs twice or not at all, and each nextitem is the test that runs next."""
    claims = ModuleClaims(str(tmp_path))
    own = [("a", 1), ("a", 2), ("b", 1)]
    shared = ("s1", "s2", "s3", "s4")
    tests = [("s1", 1), ("s1", 2), ("s2", 1), ("s3", 1), ("s3", 2), ("s4", 1)]
    first = claimed_run(module_groups(own + tests, _module), _module, shared, claims.claim)
    second = claimed_run(module_groups(tests[::-1], _module), _module, shared, claims.claim)
    # the first stream is in its own modules when the second starts; as b's last test starts it claims s1
    ran_first = _drain(first, until=("b", 1))
    assert os.listdir(str(tmp_path)) == ["s1"]
    # the second takes s4, then s3, and as s3's last test starts it claims s2
    ran_second = _drain(second, until=("s3", 1))
    assert sorted(os.listdir(str(tmp_path))) == ["s1", "s2", "s3", "s4"]
    ran_first += list(first)          # s1; every other shared module is the second's
    ran_second += list(second)        # s2; s1 is taken: the second stream ends
    firsts = [pair[0] for pair in ran_first]
    seconds = [pair[0] for pair in ran_second]
    assert firsts == own + [("s1", 1), ("s1", 2)]
    assert seconds == [("s4", 1), ("s3", 2), ("s3", 1), ("s2", 1)]
    assert sorted(firsts + seconds) == sorted(own + tests)
    for ran in (ran_first, ran_second):
        assert [pair[1] for pair in ran] == [pair[0] for pair in ran][1:] + [None]
    assert not claims.claim("s3") and claims.claim("s5")
