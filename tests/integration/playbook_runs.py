# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Running independent read-only ansible-playbook invocations side by side in the cluster tests.

A check-mode run, or a run a role's guard refuses before any change, writes
nothing, so two of them need not wait for each other: started together they
cost about the longer one instead of the sum. Each gets its own output files;
ansible-playbook keeps its temporary files in a directory of its own per
process (ansible-local-<pid>..., and ansible-tmp-<time>-<pid>-... per task).
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from typing import IO, Dict, List, Mapping, Optional, Sequence, Tuple

POLL_SECONDS = 0.1


def run_concurrently(commands: Sequence[Sequence[str]], env: Optional[Mapping[str, str]],
                     timeout: float) -> List[Tuple[subprocess.CompletedProcess, float]]:
    """Start every command at once and wait for all of them.

    Returns, in the order given, what ``subprocess.run(cmd, capture_output=True,
    text=True, env=env, check=False)`` returns for each, with the seconds it ran.
    Output goes to unnamed temporary files, not pipes: a pipe nobody reads while
    the other process is waited for fills up (64 KiB; a --diff run prints more)
    and stalls its writer, which would put the runs one after the other again.
    Past ``timeout`` every process still running is killed and
    ``subprocess.TimeoutExpired`` raised, as ``subprocess.run`` does.
    """
    start = time.monotonic()
    files: List[IO[str]] = []      # every output file opened, closed at the end whatever happens
    runs: List[Tuple[List[str], subprocess.Popen, IO[str], IO[str]]] = []
    finished: Dict[int, float] = {}   # index of the run -> its seconds
    try:
        for cmd in commands:
            # text mode, the locale's encoding and universal newlines on reading: text=True's decoding
            out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
            files += [out, err]
            runs.append((list(cmd), subprocess.Popen(list(cmd), stdout=out, stderr=err, env=env), out, err))
        while len(finished) < len(runs):
            for index, (_cmd, proc, _out, _err) in enumerate(runs):
                if index not in finished and proc.poll() is not None:
                    finished[index] = time.monotonic() - start
            if len(finished) == len(runs):
                break
            if time.monotonic() - start > timeout:
                late = next(cmd for index, (cmd, _p, _o, _e) in enumerate(runs) if index not in finished)
                raise subprocess.TimeoutExpired(late, timeout)
            time.sleep(POLL_SECONDS)
        results: List[Tuple[subprocess.CompletedProcess, float]] = []
        for index, (cmd, proc, stdout_file, stderr_file) in enumerate(runs):
            stdout_file.seek(0)
            stderr_file.seek(0)
            results.append((subprocess.CompletedProcess(cmd, proc.returncode, stdout_file.read(), stderr_file.read()),
                            finished[index]))
        return results
    finally:
        for _cmd, proc, _out, _err in runs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for handle in files:
            handle.close()
