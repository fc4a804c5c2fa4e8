# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""scripts/cluster/identity.py: a running cluster is reused only by the checkout, scripts and NODES that made it.

Regression guard: CI run from one checkout reused a 3-node cluster another
checkout had left running, and four cluster tests failed on it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SCRIPT = os.path.join(REPO, "scripts", "cluster", "identity.py")

_spec = importlib.util.spec_from_file_location("cluster_identity", SCRIPT)
identity = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(identity)

MINE = {"source": "/work/a", "scripts_sha256": "1" * 64, "nodes": "8xC500 4xN100"}


def test_nothing_running_is_fresh():
    assert identity.decide(None, False, MINE) == ("fresh", "")


def test_own_cluster_is_reused():
    assert identity.decide(dict(MINE), True, MINE) == ("reuse", "")


@pytest.mark.parametrize("field, value, words", [
    ("source", "/work/b", "started from /work/b, not from this checkout /work/a"),
    ("scripts_sha256", "2" * 64, "other cluster scripts"),
    ("nodes", "8xC500", 'its nodes are "8xC500", NODES asks for "8xC500 4xN100"'),
])
def test_any_difference_replaces_and_says_why(field, value, words):
    recorded = dict(MINE, **{field: value})
    verdict, why = identity.decide(recorded, True, MINE)
    assert verdict == "replace"
    assert words in why


def test_cluster_without_record_is_replaced():
    verdict, why = identity.decide(None, True, MINE)
    assert verdict == "replace" and "no record" in why


def test_reuse_of_a_foreign_cluster_only_on_purpose_and_never_with_other_nodes():
    foreign = dict(MINE, source="/work/b")
    verdict, why = identity.decide(foreign, True, MINE, allow_foreign=True)
    assert verdict == "reuse" and "METAX_CLUSTER_REUSE=1" in why and "/work/b" in why
    other_nodes = dict(foreign, nodes="1xC500")
    assert identity.decide(other_nodes, True, MINE, allow_foreign=True)[0] == "replace"


def test_scripts_hash_follows_contents(tmp_path):
    (tmp_path / "cluster.sh").write_text("echo 1\n")
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "x.pyc").write_bytes(b"junk")
    first = identity.scripts_hash(str(tmp_path))
    (tmp_path / "__pycache__" / "y.pyc").write_bytes(b"more junk")
    assert identity.scripts_hash(str(tmp_path)) == first
    (tmp_path / "cluster.sh").write_text("echo 2\n")
    assert identity.scripts_hash(str(tmp_path)) != first


def test_scripts_hash_covers_every_listed_dir(tmp_path):
    """cluster.sh passes scripts/cluster and tests/localcluster: a change in either is another cluster."""
    scripts, package = tmp_path / "scripts", tmp_path / "localcluster"
    scripts.mkdir()
    package.mkdir()
    (scripts / "cluster.sh").write_text("echo 1\n")
    (package / "nodes.py").write_text("X = 1\n")
    both = "%s:%s" % (scripts, package)
    first = identity.scripts_hash(both)
    assert first != identity.scripts_hash(str(scripts))
    (package / "nodes.py").write_text("X = 2\n")
    assert identity.scripts_hash(both) != first
    (package / "nodes.py").write_text("X = 1\n")
    assert identity.scripts_hash(both) == first


def _cli(*args, env=None):
    return subprocess.run([sys.executable, SCRIPT] + [str(a) for a in args], capture_output=True, text=True,
                          check=True, env=env).stdout.strip()


def test_cli_record_then_check(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    record = state / "identity.json"
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "cluster.sh").write_text("echo\n")
    env = {k: v for k, v in os.environ.items() if k != "METAX_CLUSTER_REUSE"}
    assert _cli("check", record, tmp_path, scripts, "8xC500", env=env) == "fresh"
    (state / "node-table").write_text("1 vm 8xC500\n")
    assert _cli("check", record, tmp_path, scripts, "8xC500", env=env).startswith("replace: ")
    _cli("record", record, tmp_path, scripts, " 8xC500  4xN100 ", env=env)
    assert json.loads(record.read_text())["nodes"] == "8xC500 4xN100"
    assert not [p for p in os.listdir(str(state)) if p.startswith(".")]
    assert _cli("check", record, tmp_path, scripts, "8xC500 4xN100", env=env) == "reuse"
    assert "NODES asks for" in _cli("check", record, tmp_path, scripts, "8xC500", env=env)
    other = tmp_path / "other"
    other.mkdir()
    assert "not from this checkout" in _cli("check", record, other, scripts, "8xC500 4xN100", env=env)
