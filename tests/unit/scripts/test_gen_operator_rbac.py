# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""scripts/gen_operator_rbac.py: parsing `kubectl auth can-i --list` and the least-privilege checks."""

from __future__ import annotations

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("gen_operator_rbac", ROOT / "scripts" / "gen_operator_rbac.py")
gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen)

# the shape kubectl 1.36 prints (columns padded with spaces)
CAN_I = """Resources                                       Non-Resource URLs   Resource Names   Verbs
selfsubjectreviews.authentication.k8s.io        []                  []               [create]
nodes                                           []                  []               [get patch]
customresourcedefinitions.apiextensions.k8s.io  []                  [clusteroperators.gpu.metax-tech.com]   [get patch]
                                                [/healthz]          []               [get]
"""


def test_rows_leave_out_the_api_servers_defaults_and_non_resource_urls():
    assert gen.parse_can_i(CAN_I) == [
        ("customresourcedefinitions.apiextensions.k8s.io", "[clusteroperators.gpu.metax-tech.com]", "[get patch]"),
        ("nodes", "[]", "[get patch]")]


def test_wildcards_and_secrets_are_violations():
    table = "| nodes | [] | [get] |\n| secrets | [] | [get] |\n| *.* | [] | [*] |\n"
    assert gen.violations(table) == ["| secrets | [] | [get] |", "| *.* | [] | [*] |"]


def test_the_committed_table_has_every_account_and_no_violation():
    _head, committed = gen.split_doc(open(gen.DOC).read())
    for account in gen.SERVICE_ACCOUNTS:
        assert "### %s" % account in committed
    assert gen.violations(committed) == []
