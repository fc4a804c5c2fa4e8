# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""playbook_runs.run_concurrently, with plain Python processes (no cluster): the runs overlap, each keeps
its own output whole, and a run past the timeout is killed."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from playbook_runs import run_concurrently

# each waits for the other's file: run one after the other they would never finish
_MEET = """
import os, sys, time
mine, theirs, tag = sys.argv[1:4]
open(mine, "w").close()
while not os.path.exists(theirs):
    time.sleep(0.01)
sys.stdout.write((tag + "\\n") * 50000)
sys.stderr.write("err " + tag)
sys.exit(3 if tag == "b" else 0)
"""


def test_two_runs_overlap_and_keep_their_own_output(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    results = run_concurrently([[sys.executable, "-c", _MEET, a, b, "a"], [sys.executable, "-c", _MEET, b, a, "b"]],
                               dict(os.environ), timeout=120)
    assert [r.returncode for r, _secs in results] == [0, 3]
    assert [r.stdout for r, _secs in results] == ["a\n" * 50000, "b\n" * 50000]      # 100 kB each: past a pipe's 64 KiB
    assert [r.stderr for r, _secs in results] == ["err a", "err b"]
    assert results[0][0].args[-1] == "a" and all(secs > 0 for _r, secs in results)


def test_a_run_past_the_timeout_is_killed(tmp_path):
    marker = tmp_path / "pid"
    slow = [sys.executable, "-c", "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(600)",
            str(marker)]
    with pytest.raises(subprocess.TimeoutExpired):
        run_concurrently([[sys.executable, "-c", "pass"], slow], None, timeout=2)
    pid = int(marker.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
