# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The local test cluster as a Python package, one module per component.

Test infrastructure, not part of the collection (galaxy.yml ignores tests/).
Standard library only: scripts/cluster/cluster.sh may call it with the
machine's python3 before the project's venv exists (the deps phase comes
first). Layout and how to add a component: docs/local-cluster.md.

scripts/cluster/cluster.sh resolves what scripts/cluster/lib.sh knows and runs
``python3 -m localcluster COMMAND``; everything else is here. Each component is
a frozen dataclass whose files and process are pure functions of it, with
``up``/``ready``/``down`` over the one object that does I/O
(``host.LocalHost``); ``up.py`` and ``teardown.py`` compose them, and
``equivalence.py`` checks a running cluster against the plan
(tests/integration/test_localcluster_equivalence.py).
"""
