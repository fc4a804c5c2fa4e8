# Shared fixtures: simulated MetaX nodes in temporary directories.
from __future__ import annotations

import os
import sys

import pytest

# The collection is importable as ansible_collections.metax.gpu through the
# symlink tree `make venv` creates; make plain `pytest` work too.
_COLLECTIONS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".build", "collections")
if os.path.isdir(_COLLECTIONS) and _COLLECTIONS not in sys.path:
    sys.path.insert(0, _COLLECTIONS)

from hypothesis import settings  # noqa: E402

import skip_policy  # noqa: E402

from ansible_collections.metax.gpu.plugins.module_utils.sim import generator  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.sim.spec import preset  # noqa: E402


# CI explores the same examples on every run (a red run must be reproducible);
# developers' runs keep exploring new ones. Neither has Hypothesis's per-example
# deadline (200 ms): it is a timing assertion, and on a loaded 2-core machine an
# example that takes 20 ms idle took 276 ms and failed the unit phase.
settings.register_profile("ci", derandomize=True, print_blob=True, deadline=None)
settings.register_profile("dev", deadline=None)
settings.load_profile("ci" if skip_policy.in_ci() else "dev")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CI, a skip that tests/allowed-skips.yml does not list fails (tests/skip_policy.py)."""
    outcome = yield
    report = outcome.get_result()
    if not report.skipped or hasattr(report, "wasxfail") or not skip_policy.in_ci():
        return
    reason = skip_policy.skip_reason(report.longrepr)
    if skip_policy.allowed(item.nodeid, reason, _ALLOWED_SKIPS) is None:
        report.outcome = "failed"
        report.longrepr = ("skipped under CI (%s), and not in tests/allowed-skips.yml: a test gets what it needs "
                           "from the deps phase (scripts/deps.sh, requirements/system.txt), so this machine lacks "
                           "something CI must have" % reason)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """The same for a whole module skipped at import (pytest.importorskip at module level)."""
    outcome = yield
    report = outcome.get_result()
    if not report.skipped or not skip_policy.in_ci():
        return
    reason = skip_policy.skip_reason(report.longrepr)
    if skip_policy.allowed(report.nodeid, reason, _ALLOWED_SKIPS) is None:
        report.outcome = "failed"
        report.longrepr = "module skipped under CI (%s), and not in tests/allowed-skips.yml" % reason


_ALLOWED_SKIPS = skip_policy.load_allowlist()


@pytest.fixture
def make_node(tmp_path):
    """Factory: make_node("8xC500") -> HostRoot of a fresh simulated node."""
    counter = [0]

    def _make(name_or_spec="8xC500"):
        counter[0] += 1
        spec = preset(name_or_spec) if isinstance(name_or_spec, str) else name_or_spec
        return generator.create(str(tmp_path / ("node%d" % counter[0])), spec)

    return _make
