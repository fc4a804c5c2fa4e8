# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""agents/common.py: how long ago a process began, from /proc's words."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ansible_collections.metax.gpu.plugins.module_utils.agents.common import process_age, seconds_since_start

# /proc/<pid>/stat of a process whose command name holds a space and a ')': field 22 (start time) is 500
STAT = "4242 (python) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 5 1 0 0 20 0 1 0 500 1000 200 18446744073709551615"


def test_start_time_is_counted_after_the_command_name_whatever_it_holds():
    assert seconds_since_start(STAT, "12.50 20.00\n", 100) == pytest.approx(7.5)


def test_a_clock_that_reads_before_the_start_gives_zero_not_a_negative_age():
    assert seconds_since_start(STAT, "4.00 1.00\n", 100) == 0.0


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="no /proc")
def test_a_new_process_is_younger_than_this_one():
    # this pytest process has run for a while; a child started now is younger, and both ages are ages
    child = subprocess.run([sys.executable, "-c", "from ansible_collections.metax.gpu.plugins.module_utils.agents."
                            "common import process_age; print(process_age())"],
                           capture_output=True, text=True, check=True, env=dict(os.environ))
    mine = process_age()
    assert mine is not None and float(child.stdout) >= 0.0
    assert float(child.stdout) < mine
