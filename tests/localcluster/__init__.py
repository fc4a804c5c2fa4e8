# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The local test cluster as a Python package, one module per component.

Test infrastructure, not part of the collection (galaxy.yml ignores tests/).
Standard library only: scripts/cluster/cluster.sh may call it with the
machine's python3 before the project's venv exists (the deps phase comes
first). Layout and how to add a component: docs/local-cluster.md.

Phase 1 (this package today): the pure parts -- the node plan, addresses,
the PKI plan, kubeconfigs, every generated configuration file, the baseline
rule and the teardown plan -- as dataclasses and pure functions, checked
against the running cluster that cluster.sh made
(tests/integration/test_localcluster_equivalence.py). Processes stay in
cluster.sh until phase 2.
"""
