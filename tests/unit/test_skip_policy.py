"""The no-silent-skips rule (tests/skip_policy.py), proven on a real test that needs docker-registry."""
from __future__ import annotations

import os
import subprocess
import sys

import skip_policy

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NEEDS_REGISTRY = "tests/unit/registry/test_push_client.py::test_bearer_token_flow_caches_a_token_per_scope"


def _run_without_docker_registry(tmp_path, ci):
    """pytest on a registry test, with a PATH that has no docker-registry (an empty scratch directory)."""
    scratch = tmp_path / "bin"
    scratch.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PATH"] = str(scratch)
    if ci is not None:
        env["CI"] = ci
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", NEEDS_REGISTRY],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_under_ci_a_test_whose_tool_is_missing_fails(tmp_path):
    proc = _run_without_docker_registry(tmp_path, "true")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "1 failed" in out
    assert "docker-registry not on PATH" in out
    assert "not in tests/allowed-skips.yml" in out


def test_outside_ci_the_same_test_skips_and_says_why(tmp_path):
    for ci in (None, "false", "0"):
        proc = _run_without_docker_registry(tmp_path / str(ci), ci)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out
        assert "1 skipped" in out
        assert "docker-registry not on PATH" in out


def test_ci_values():
    assert skip_policy.in_ci({"CI": "true"}) and skip_policy.in_ci({"CI": "1"}) and skip_policy.in_ci({"CI": "yes"})
    for value in ("", "0", "false", "False", "no", "off"):
        assert not skip_policy.in_ci({"CI": value})
    assert not skip_policy.in_ci({})


def test_allowlist_matches_test_and_reason():
    entries = skip_policy.load_allowlist()
    assert entries and all(e.why.strip() for e in entries)
    root_skip = "tests/unit/gpu/test_discovery.py::test_unreadable_attribute"
    assert skip_policy.allowed(root_skip, "root reads everything", entries) is not None
    # same test, another reason: not allowed
    assert skip_policy.allowed(root_skip, "skopeo not installed", entries) is None
    # a reason that is allowed elsewhere does not carry over to another test
    assert skip_policy.allowed("tests/unit/registry/test_bundle.py::test_x", "root reads everything", entries) is None


def test_skip_reason_forms():
    assert skip_policy.skip_reason(("f.py", 3, "Skipped: no tool")) == "no tool"
    assert skip_policy.skip_reason("Skipped: plain") == "plain"
