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

from ansible_collections.metax.gpu.plugins.module_utils.sim import generator  # noqa: E402
from ansible_collections.metax.gpu.plugins.module_utils.sim.spec import preset  # noqa: E402


# CI explores the same examples on every run (a red run must be reproducible);
# developers' runs keep exploring new ones.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
    settings.load_profile("ci")


@pytest.fixture
def make_node(tmp_path):
    """Factory: make_node("8xC500") -> HostRoot of a fresh simulated node."""
    counter = [0]

    def _make(name_or_spec="8xC500"):
        counter[0] += 1
        spec = preset(name_or_spec) if isinstance(name_or_spec, str) else name_or_spec
        return generator.create(str(tmp_path / ("node%d" % counter[0])), spec)

    return _make
