"""No hand-written Python file in plugins/ is over 600 lines (issue 40: a file that grows past it does
more than one job; split it along its jobs, dependencies pointing down).

Generated code is excepted: protoc's ``*_pb2.py`` / ``*_pb2_grpc.py`` and the ``api/`` packages
that hold them (scripts regenerate them; their length is protoc's, not ours).
"""
from __future__ import annotations

import os

PLUGINS = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "plugins"))
LIMIT = 600


def _generated(rel: str) -> bool:
    parts = rel.split(os.sep)
    return "_pb2" in parts[-1] or "api" in parts[:-1]


def _hand_written():
    for dirpath, _dirs, files in os.walk(PLUGINS):
        for name in sorted(files):
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, PLUGINS)
            if name.endswith(".py") and not _generated(rel):
                yield rel, path


def _lines(path: str) -> int:
    with open(path, "rb") as stream:
        return sum(1 for _line in stream)


def test_the_walk_sees_the_files_it_judges():
    """The rule is not vacuous: it reads the modules, module_utils and the agents, and skips only generated stubs."""
    rels = [rel for rel, _path in _hand_written()]
    assert os.path.join("module_utils", "agents", "operator_controller.py") in rels
    assert any(rel.startswith("modules" + os.sep) for rel in rels)
    assert not any("_pb2" in rel for rel in rels)
    assert _generated(os.path.join("module_utils", "deviceplugin", "api", "podresources_v1_pb2.py"))
    assert not _generated(os.path.join("module_utils", "kube", "apiserver.py"))


def test_no_hand_written_file_is_over_the_limit():
    over = sorted((lines, rel) for rel, path in _hand_written() if (lines := _lines(path)) > LIMIT)
    assert over == [], "over %d lines (split them along their jobs): %s" % (
        LIMIT, ", ".join("%s (%d)" % (rel, lines) for lines, rel in reversed(over)))
