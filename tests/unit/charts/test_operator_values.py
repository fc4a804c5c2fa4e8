# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""The GPU Operator chart's values: the GPU Extensions options defined once, shared (issue 24, item 3).

scripts/gen_operator_values.py composes the operator chart's values.yaml and
values.schema.json from the Extensions chart's (every option but NOT_SHARED)
and the operator's own part (values-src/). Here: the files are current, the
shared options are the Extensions chart's exactly (defaults and schema), a
new Extensions option reaches the operator chart by a rerun, and defining a
shared option a second time is refused.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml

from .helm import CHART, CHARTS, ROOT, find_helm, helm_required, render

HELM = find_helm()
OPERATOR_CHART = CHARTS / "metax-operator"

_spec = importlib.util.spec_from_file_location("gen_operator_values", ROOT / "scripts" / "gen_operator_values.py")
gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen)


def load(chart: Path):
    values = yaml.safe_load((chart / "values.yaml").read_text(encoding="utf-8"))
    schema = json.loads((chart / "values.schema.json").read_text(encoding="utf-8"))
    return values, schema


def test_the_operator_values_are_generated():
    """Fails when an Extensions option or values-src/ changed and scripts/gen_operator_values.py was not rerun."""
    assert gen.out_of_date() == [], "run scripts/gen_operator_values.py"


def test_every_extensions_option_is_shared_as_it_is():
    ext_values, ext_schema = load(CHART)
    op_values, op_schema = load(OPERATOR_CHART)
    shared = [k for k in ext_schema["properties"] if k not in gen.NOT_SHARED]
    assert shared and {"registry", "pullPolicy", "log", "gpuDevice", "gpuLabel", "gpuAware", "imagePullSecrets",
                       "tolerations", "hostRoot", "nodeAgentPolicy"} <= set(shared)
    assert list(op_schema["properties"])[:len(shared)] == shared
    for key in shared:
        # the same default, and the operator's schema is the Extensions one plus members it adds
        assert op_values.get(key) == ext_values.get(key), key
        assert gen.merge(ext_schema["properties"][key], op_schema["properties"][key]) == \
            op_schema["properties"][key], key
    for key in set(ext_schema["required"]) - set(gen.NOT_SHARED):
        assert key in op_schema["required"]
    # what the operator keeps out exists there (a stale entry would hide nothing)
    for key in gen.NOT_SHARED:
        assert key in ext_schema["properties"] and key not in op_schema["properties"] and key not in op_values


def test_the_operator_options_are_its_own():
    op_values, op_schema = load(OPERATOR_CHART)
    own = json.loads((ROOT / gen.OWN_SCHEMA).read_text(encoding="utf-8"))
    for key in ("driver", "maca", "runtime", "minimal", "podTemplateSpec", "controller"):
        assert key in op_values and op_schema["properties"][key] == own["properties"][key]
    # members the operator adds to a shared component section
    assert set(op_schema["properties"]["gpuDevice"]["properties"]) == {
        "healthyInterval", "cdiMode", "log", "podTemplateSpec", "resources", "deploy",
        "healthPolicy",     # shared with the Extensions chart (docs/health.md)
        # accepted from a real 0.9.2 values file, not acted on (named in the IgnoredFields condition)
        "image", "podTemplateSpecFile", "cmInit"}
    assert "GENERATED" in op_schema["$comment"] and "GENERATED" in (OPERATOR_CHART / "values.yaml").read_text()


def _tree_copy(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    shutil.copytree(CHARTS, root / gen.CHARTS)
    return root


def test_a_new_extensions_option_reaches_the_operator_chart(tmp_path):
    """Adding an option is one place: the Extensions chart's values.yaml and schema, then a rerun."""
    root = _tree_copy(tmp_path)
    ext = root / gen.SHARED_CHART
    with open(ext / "values.yaml", "a", encoding="utf-8") as handle:
        handle.write("\n# extra: a new option.\nnewOption:\n  level: 3\n")
    schema = json.loads((ext / "values.schema.json").read_text(encoding="utf-8"))
    schema["properties"]["newOption"] = {"type": "object", "properties": {"level": {"type": "integer"}}}
    (ext / "values.schema.json").write_text(json.dumps(schema, indent=2) + "\n", encoding="utf-8")
    assert gen.out_of_date(str(root)) == ["files/charts/metax-operator/values.schema.json",
                                          "files/charts/metax-operator/values.yaml"]
    assert gen.main(["--check", "--root", str(root)]) == 1
    assert gen.main(["--root", str(root)]) == 0 and gen.out_of_date(str(root)) == []
    values = (root / gen.TARGET_CHART / "values.yaml").read_text(encoding="utf-8")
    assert "# extra: a new option.\nnewOption:\n  level: 3\n" in values
    assert yaml.safe_load(values)["newOption"] == {"level": 3}
    op_schema = json.loads((root / gen.TARGET_CHART / "values.schema.json").read_text(encoding="utf-8"))
    assert op_schema["properties"]["newOption"] == schema["properties"]["newOption"]


def test_a_shared_option_defined_again_is_refused(tmp_path, capsys):
    root = _tree_copy(tmp_path)
    own = root / gen.OWN_VALUES
    own.write_text(own.read_text(encoding="utf-8") + "\n# a second definition\nregistry: other.example\n",
                   encoding="utf-8")
    assert gen.main(["--check", "--root", str(root)]) == 2
    assert "redefines the shared option(s) registry" in capsys.readouterr().err


@pytest.mark.parametrize("overlay, words", [
    ({"properties": {"gpuDevice": {"properties": {"healthyInterval": {"type": "integer", "minimum": 1}}}}},
     "changes /properties/gpuDevice/properties/healthyInterval/minimum"),
    ({"properties": {"registry": {"type": "integer"}}}, "changes /properties/registry/type"),
    ({"properties": {"gpuNodeSelector": {"type": "object"}}}, "kept out by NOT_SHARED"),
])
def test_a_shared_schema_changed_by_the_operator_is_refused(overlay, words):
    shared = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    with pytest.raises(gen.SharingError) as err:
        gen.compose_schema(shared, overlay)
    assert words in str(err.value)


def test_blocks_keep_comments_with_their_option():
    header, blocks = gen.blocks("---\n# file comment\n\n# a's comment\na: 1\nb:\n  - x\n  # inner\n  - y\n\n"
                                "# c\nc: {}\n")
    assert header == ["---", "# file comment"]
    assert blocks == [("a", "# a's comment\na: 1"), ("b", "b:\n  - x\n  # inner\n  - y"), ("c", "# c\nc: {}")]
    with pytest.raises(gen.SharingError):
        gen.blocks("a: 1\na: 2\n")


needs_helm = helm_required(HELM)


@needs_helm
@pytest.mark.parametrize("pair, refused", [
    ("gpuDevice.healthyInterval=-1", True),         # the shared schema, in the operator chart
    ("log.level=loud", True),
    ("pullPolicy=Sometimes", True),
    ("gpuExporter.enabled=true", True),             # not shared (yet)
    ("gpuDevice.podTemplateSpec.metadata.labels.a=b", False),   # what the operator adds
])
def test_the_operator_chart_validates_with_the_shared_schema(pair, refused):
    # minimal: the driver and MACA components, on by default, would need their payloads (not the point here)
    rc, _objects, err = render(HELM, {"minimal": True}, sets=[pair], chart=OPERATOR_CHART, namespace="metax-operator")
    ext_rc, _o, _e = render(HELM, {}, sets=[pair], chart=CHART)
    assert (rc != 0) == refused, err
    if not pair.startswith(("gpuExporter", "gpuDevice.podTemplateSpec")):
        assert (ext_rc != 0) == refused     # both charts say the same about a shared option


@needs_helm
def test_the_sources_are_not_packaged(tmp_path):
    proc = subprocess.run([HELM, "package", str(OPERATOR_CHART), "-d", str(tmp_path)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    with tarfile.open(next(tmp_path.glob("metax-operator-*.tgz"))) as tar:
        members = tar.getnames()
    assert "metax-operator/values.yaml" in members and "metax-operator/values.schema.json" in members
    assert not [m for m in members if "values-src" in m]
