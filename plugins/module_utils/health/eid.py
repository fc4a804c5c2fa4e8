# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Error ids (EIDs) from the kernel log: MetaX's counterpart of NVIDIA's XID.

mx-exporter reads the driver's and the SDK's EIDs from the kernel log and
syslog. No real line is in the project's captures, so the default pattern
matches the simulator's form (docs/health.md, "EIDs") and an administrator
changes it per cluster (the policy's ``eid.pattern``):

    <time> <node> kernel: [<uptime>] metax 0000:0a:00.0: [EID 1021] <text>
    <time> <node> maca[<pid>]: 0000:0a:00.0 [SDK EID 3005] <text>

A pattern is a Python regular expression with a named group ``eid`` (the
number, decimal or 0x-hex) and optionally ``bdf`` (the GPU's PCI address;
without it, or when it names no GPU of the node, the EID counts against every
GPU: the log did not say which) and ``sdk`` (non-empty: an SDK EID, else the
driver's). A line the pattern does not match is not an EID; a match whose
``eid`` is not a number is reported and skipped.

:class:`LogTail` is the I/O edge: it reads what was appended to the log files
since the last call (the offset kept per file; a file that shrank or was
replaced by rotation is read from its start), never the whole history at
start-up: an EID from before the agent started is old news. Standard library
only (node-side).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from ..errors import MetaxGpuError
from ..gpu.pci import normalize_bdf
from .signals import EidCounts

# the GPU's address when the line names one (the driver's dev_err lines do), then ``[EID n]`` / ``[SDK EID n]``
DEFAULT_PATTERN = (r"(?:(?P<bdf>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\b.*?)?"
                   r"\[(?P<sdk>SDK\s+)?EID[\s:#=]*(?P<eid>0x[0-9a-fA-F]+|\d+)\]")
# under the host root; the first that exists is read (Debian/Ubuntu, then RHEL-likes)
DEFAULT_LOG_FILES = ("var/log/kern.log", "var/log/messages")
# a line longer than this is cut (a runaway writer must not take the agent's memory)
MAX_LINE = 4096
# per call, at most this much of a log is read (the rest on the next calls)
MAX_READ = 1 << 20


class PatternError(MetaxGpuError, ValueError):
    """An EID pattern an administrator gave cannot be used."""


@dataclass(frozen=True)
class Eid:
    eid: int
    sdk: bool
    bdf: Optional[str]       # None: the line names no GPU
    line: str


def compile_pattern(pattern: str) -> "re.Pattern[str]":
    """The compiled pattern; PatternError when it is not a regex or has no ``eid`` group."""
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise PatternError("the EID pattern %r is not a regular expression: %s" % (pattern, exc))
    if "eid" not in compiled.groupindex:
        raise PatternError("the EID pattern %r has no named group (?P<eid>...)" % pattern)
    unknown = set(compiled.groupindex) - {"eid", "bdf", "sdk"}
    if unknown:
        raise PatternError("the EID pattern %r has unknown named group(s) %s (known: eid, bdf, sdk)"
                           % (pattern, ", ".join(sorted(unknown))))
    return compiled


def parse_lines(lines: Iterable[str], pattern: "re.Pattern[str]",
                problems: Optional[List[str]] = None) -> List[Eid]:
    """Every EID in ``lines``, in order."""
    out: List[Eid] = []
    for line in lines:
        found = pattern.search(line)
        if not found:
            continue
        text = found.group("eid") or ""
        try:
            number = int(text, 16) if text.lower().startswith("0x") else int(text)
        except ValueError:
            if problems is not None:
                problems.append("kernel log: an EID line whose id %r is not a number: %r" % (text, line.strip()[:160]))
            continue
        groups = found.groupdict()
        bdf = None
        if groups.get("bdf"):
            try:
                bdf = normalize_bdf(groups["bdf"])
            except ValueError:
                bdf = None
        out.append(Eid(number, bool(groups.get("sdk")), bdf, line.rstrip("\n")[:MAX_LINE]))
    return out


class LogTail:
    """What was appended to a log since the last :meth:`read`; the first read starts at the end.

    Of ``paths`` the first that exists is read (a node with both kern.log and
    messages has the same lines in both: each EID counts once).
    """

    def __init__(self, paths: Sequence[str]) -> None:
        self.paths = tuple(paths)
        self._pos: Dict[str, Tuple[int, int]] = {}     # path -> (inode, offset)
        self._partial: Dict[str, str] = {}             # an unterminated last line, kept for the next read
        self._started = False                          # a file appearing after the first read is new: all of it

    def read(self, problems: Optional[List[str]] = None) -> List[str]:
        try:
            return self._read(problems)
        finally:
            self._started = True

    def _read(self, problems: Optional[List[str]]) -> List[str]:
        for path in self.paths:
            if not os.path.exists(path):
                self._pos.pop(path, None)
                continue
            try:
                return self._read_one(path)
            except OSError as exc:
                if problems is not None:
                    problems.append("kernel log %s: %s" % (path, exc.strerror or exc))
                return []
        return []

    def _read_one(self, path: str) -> List[str]:
        try:
            info = os.stat(path)
        except FileNotFoundError:
            self._pos.pop(path, None)
            return []
        known = self._pos.get(path)
        if known is None and not self._started:
            # at start: from the end (history before the agent is not news)
            self._pos[path] = (info.st_ino, info.st_size)
            return []
        if known is None:
            known = (info.st_ino, 0)      # created since: every line is new
        inode, offset = known
        if inode != info.st_ino or info.st_size < offset:
            offset = 0               # rotated or truncated: the new file from its start
            self._partial.pop(path, None)
        if info.st_size == offset:
            self._pos[path] = (info.st_ino, offset)
            return []
        with open(path, "rb") as handle:
            handle.seek(offset)
            data = handle.read(MAX_READ)
        self._pos[path] = (info.st_ino, offset + len(data))
        text = self._partial.pop(path, "") + data.decode("utf-8", "replace")
        parts = text.split("\n")
        if parts[-1]:
            self._partial[path] = parts[-1][:MAX_LINE]
        return [p[:MAX_LINE] for p in parts[:-1]]


def log_files(root: str, configured: Sequence[str]) -> List[str]:
    """The configured files (relative to the host root) as paths of this process."""
    return [os.path.join(root, rel.lstrip("/")) for rel in configured]


class EidTracker:
    """EID counts per GPU since it started: the kernel log's tail through the pattern.

    An EID naming no GPU of the node (or none at all) counts for every GPU:
    the log did not say which.
    """

    def __init__(self, root: str, pattern: str = DEFAULT_PATTERN, files: Sequence[str] = DEFAULT_LOG_FILES) -> None:
        self.root = root
        self.pattern = compile_pattern(pattern)
        self.tail = LogTail(log_files(root, files))
        self.counts: Dict[str, EidCounts] = {}

    def configure(self, pattern: str, files: Sequence[str]) -> None:
        """A new pattern or file list; a new list is read from its end again."""
        self.pattern = compile_pattern(pattern)
        paths = tuple(log_files(self.root, files))
        if paths != self.tail.paths:
            self.tail = LogTail(paths)

    def read(self, bdfs: Sequence[str], problems: Optional[List[str]] = None) -> Dict[str, EidCounts]:
        for item in parse_lines(self.tail.read(problems), self.pattern, problems):
            targets = [item.bdf] if item.bdf is not None and item.bdf in bdfs else list(bdfs)
            for bdf in targets:
                old = self.counts.get(bdf, EidCounts())
                if item.sdk:
                    self.counts[bdf] = EidCounts(old.driver, old.sdk + 1, old.last_driver, item.eid)
                else:
                    self.counts[bdf] = EidCounts(old.driver + 1, old.sdk, item.eid, old.last_sdk)
        return dict(self.counts)
