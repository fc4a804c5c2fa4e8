"""The simulated mx-smi reads its state with json's C scanner alone: the same values as json.loads."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.sim import mx_smi

DOCUMENTS = [
    {"gpus": [{"bdf": "0000:0a:00.0", "failed": None, "numvfs": 2, "power": 57.5}], "seed": 1164},
    [1, -2, 3.25, 1e300, True, False, None, "\u00e9\u4e2d", "tab\tquote\"slash\\"],
    {"nested": {"deep": [[[]], {}]}, "empty": ""},
    "a bare string",
    -0.0,
]


@pytest.mark.parametrize("doc", DOCUMENTS)
@pytest.mark.parametrize("indent", [None, 2])
def test_reads_what_json_writes(tmp_path, doc, indent):
    path = tmp_path / "state.json"
    path.write_text("\n" + json.dumps(doc, indent=indent) + "\n\n")
    assert mx_smi.read_json(str(path)) == json.loads(path.read_text())


def test_reads_non_finite_numbers_as_json_does(tmp_path):
    path = tmp_path / "state.json"
    path.write_text('[NaN, Infinity, -Infinity]')
    got = mx_smi.read_json(str(path))
    assert [repr(v) for v in got] == [repr(v) for v in json.loads(path.read_text())]


@pytest.mark.parametrize("text", ["", "   ", "{", '{"a": 1} {"b": 2}', '{"a": 1,}', "nope", '{"a": "\x01"}'])
def test_refuses_what_json_refuses(tmp_path, text):
    path = tmp_path / "state.json"
    path.write_text(text)
    with pytest.raises(ValueError):
        json.loads(text)
    with pytest.raises(ValueError):
        mx_smi.read_json(str(path))


def test_the_tool_does_not_import_json_unless_it_prints_json(make_node):
    host = make_node("1xC500")
    probe = ("import runpy, sys; sys.argv = [%r] + sys.argv[1:]; "
             "code = 0\ntry:\n    runpy.run_path(%r, run_name='__main__')\n"
             "except SystemExit as exc:\n    code = exc.code\n"
             "sys.stderr.write('json imported: %%s\\n' %% ('json' in sys.modules)); sys.exit(code)"
             % (host.join("usr/bin/mx-smi"), host.join("usr/bin/mx-smi")))
    plain = subprocess.run([sys.executable, "-c", probe, "-L"], capture_output=True, text=True, check=True, timeout=120)
    assert "GPU#0" in plain.stdout and "json imported: False" in plain.stderr
    as_json = subprocess.run([sys.executable, "-c", probe, "-j"], capture_output=True, text=True, check=True,
                             timeout=120)
    assert json.loads(as_json.stdout.split("\n", 1)[1]) and "json imported: True" in as_json.stderr
