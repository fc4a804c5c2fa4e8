"""Closing summary of scripts/run-tests.sh, read from pytest's junit files.

Prints the skipped tests with their reasons (outside CI a skip stays a skip,
and the summary names it), every test module slower than 30 s (so that the
suite's growth is visible), and, as the last line, "PASSED FAILED SKIPPED".

Usage: test_summary.py OUTPUT_DIR JUNIT_FILE...
"""
from __future__ import annotations

import collections
import os
import sys
import xml.etree.ElementTree as ET
from typing import Dict, List, Tuple

SLOW_MODULE_SECONDS = 30.0


def module_of(classname: str) -> str:
    """tests.unit.registry.test_push_client[.TestClass] -> tests/unit/registry/test_push_client.py"""
    parts = classname.split(".")
    for i, part in enumerate(parts):
        if part.startswith("test") and not (i == 0 and part == "tests"):
            return "/".join(parts[:i + 1]) + ".py"
    return classname


def read(paths: List[str]) -> Tuple[Tuple[int, int, int], Dict[str, List[str]], Dict[str, float]]:
    passed = failed = skipped = 0
    skips: Dict[str, List[str]] = collections.defaultdict(list)
    seconds: Dict[str, float] = collections.defaultdict(float)
    for path in paths:
        for case in ET.parse(path).getroot().iter("testcase"):
            classname = case.get("classname", "")
            seconds[module_of(classname)] += float(case.get("time", 0) or 0)
            if case.find("failure") is not None or case.find("error") is not None:
                failed += 1
            elif case.find("skipped") is not None:
                skipped += 1
                reason = case.find("skipped").get("message", "")
                skips[reason].append("%s::%s" % (module_of(classname), case.get("name", "")))
            else:
                passed += 1
    return (passed, failed, skipped), skips, seconds


def main(argv: List[str]) -> int:
    out_dir, names = argv[1], argv[2:]
    paths = [os.path.join(out_dir, n) for n in names if os.path.exists(os.path.join(out_dir, n))]
    (passed, failed, skipped), skips, seconds = read(paths)
    if skips:
        print("=== skipped (%d)" % skipped)
        for reason, tests in sorted(skips.items()):
            print("  %s" % reason)
            for test in tests:
                print("      %s" % test)
    slow = sorted(((s, m) for m, s in seconds.items() if s > SLOW_MODULE_SECONDS), reverse=True)
    if slow:
        print("=== test modules slower than %d s" % SLOW_MODULE_SECONDS)
        for secs, module in slow:
            print("  %7.1f s  %s" % (secs, module))
    print(passed, failed, skipped)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
