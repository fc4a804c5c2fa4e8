"""Every relative link in the docs resolves: the file exists and, for a Markdown file, the #anchor is a heading.

Anchors are GitHub's: the heading lower-cased, punctuation but ``-`` and ``_``
dropped, spaces turned into ``-``, a repeated heading suffixed ``-1``, ``-2``.
"""
from __future__ import annotations

import glob
import os
import re
from functools import lru_cache

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
DOCS = sorted([os.path.join(ROOT, "README.md")]
              + glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)
              + glob.glob(os.path.join(ROOT, "benchmarks", "results", "*.md")))
LINK = re.compile(r"\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def _prose(text):
    """Each line outside fenced code blocks, without its inline code spans ("" inside a block: numbers kept)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            lines.append("")
            continue
        lines.append("" if fenced else re.sub(r"`[^`]*`", "", line))
    return lines


def slug(heading):
    text = re.sub(r"`|\*\*?|_(?=\w)|(?<=\w)_", lambda m: "_" if m.group(0) == "_" else "", heading.strip())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = text.lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@lru_cache(maxsize=None)
def anchors(path):
    seen, found = {}, set()
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        match = None if fenced else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            base = slug(match.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else "%s-%d" % (base, count))
    return frozenset(found)


def _links(path):
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(_prose(handle.read()), 1):
            for target in LINK.findall(line):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):    # http:, https:, mailto:
                    continue
                yield number, target


def test_slug_is_githubs():
    assert slug("The rolling-upgrade planner (`benchmarks/scale_driver_plan.py`)") == (
        "the-rolling-upgrade-planner-benchmarksscale_driver_planpy")
    assert slug("The p99 tail at 2,000 nodes: what it is made of (2026-11-27)") == (
        "the-p99-tail-at-2000-nodes-what-it-is-made-of-2026-11-27")
    assert slug("MXMACA on the host") == "mxmaca-on-the-host"


@pytest.mark.parametrize("path", DOCS, ids=[os.path.relpath(p, ROOT) for p in DOCS])
def test_relative_links_resolve(path):
    broken = []
    for number, target in _links(path):
        where, _hash, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(path), where)) if where else path
        if not os.path.exists(dest):
            broken.append("%d: %s (no such file)" % (number, target))
        elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
            broken.append("%d: %s (no such heading)" % (number, target))
    assert not broken, "%s:\n%s" % (os.path.relpath(path, ROOT), "\n".join(broken))
