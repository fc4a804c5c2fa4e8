"""ansible-test reads tests/sanity/ignore-<core version>.txt: one per version requires_ansible admits."""
from __future__ import annotations

import glob
import os
import re

import yaml
from ansible.release import __version__ as core_version

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
# The newest ansible-core release when this was last reviewed; raise it with each release.
NEWEST_RELEASED_MINOR = 20


def _minimum_minor():
    with open(os.path.join(ROOT, "meta", "runtime.yml")) as handle:
        spec = yaml.safe_load(handle)["requires_ansible"]
    match = re.match(r"^>=\s*2\.(\d+)(\.\d+)?$", spec)
    assert match, "requires_ansible %r: expected '>=2.N.M' (no upper bound)" % spec
    return int(match.group(1))


def test_an_ignore_file_for_every_admitted_version():
    installed = int(core_version.split(".")[1])
    wanted = {"ignore-2.%d.txt" % m for m in range(_minimum_minor(), max(installed, NEWEST_RELEASED_MINOR) + 1)}
    present = {os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "tests", "sanity", "ignore-*.txt"))}
    assert wanted <= present, sorted(wanted - present)


def test_ignore_files_agree():
    """The same reasons hold for every version; a difference is a forgotten update."""
    contents = {}
    for path in sorted(glob.glob(os.path.join(ROOT, "tests", "sanity", "ignore-*.txt"))):
        with open(path) as handle:
            contents[os.path.basename(path)] = sorted(line for line in handle.read().splitlines() if line.strip())
    assert len({tuple(v) for v in contents.values()}) == 1, contents
    for lines in contents.values():
        for line in lines:
            assert " # " in line, "every ignore needs a reason: %s" % line
