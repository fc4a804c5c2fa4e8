# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Restart a static pod through its manifest: taken out, the old pod gone, the new one written.

Written over the old manifest, the kubelet refuses to start the new static pod
while the old one of the same name terminates, and looks again only 10-15 s
later (``allowStaticPodStart``, ``pkg/kubelet/pod_workers.go``). So the
manifest is taken out, the old pod waited for (its processes ended and its
cgroup removed: the kubelet removes the pod cgroup last, just before it lets a
pod of that name start again), and the new manifest written. On the local
cluster: 4 s from the change to the new kube-scheduler answering, instead of
14 s (benchmarks/results/ci-history.md, session 17).

The node is without the manifest only in between. Whatever Python sees there
(an error, Ctrl-C, SIGTERM or SIGHUP: an Ansible timeout, a dropped SSH
session) ends with the new manifest written, or the old one if that write
fails; only SIGKILL or a power loss leaves none, and the caller's backup holds
it. I/O goes through injected callables: ``backend.py`` wires the real ones.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
from dataclasses import dataclass
from typing import Callable, Iterator, List, Optional, Sequence

from ..errors import MetaxGpuError

PodOf = Callable[[int], Optional[str]]          # pid -> its pod's cgroup directory (None: not found)
# The old pod gets at most this long (or half the caller's wait) before the new
# manifest is written anyway: the kubelet then starts it after its own backoff.
STOP_TIMEOUT = 60.0
POLL_STOPPED = 0.2
# Without a cgroup to watch: the seconds after the old process ended in which the
# kubelet finished that pod on the local cluster (1 s was once too short).
SETTLE_WITHOUT_CGROUP = 3.0

# a pod's own cgroup: "pod<uid>" (cgroupfs) or "kubepods-<qos>-pod<uid>.slice" (systemd);
# a static pod's UID is 32 hex digits, an API pod's a UUID (with "_" under systemd)
_POD_CGROUP = re.compile(r"(^|-)pod[0-9a-f][0-9a-f_-]{31,35}(\.slice)?$")
# cgroup v1 hierarchies a kubelet puts every pod in (v2 is the unified "0::" line)
_V1_HIERARCHIES = ("pids", "memory", "name=systemd")


class ManifestLostError(MetaxGpuError):
    """Neither the new nor the previous manifest could be written back."""


class RestartInterrupted(MetaxGpuError):
    """A signal came while the old pod stopped; the manifest was written before this was raised."""


class _Signalled(BaseException):
    """SIGTERM or SIGHUP while the manifest is out: unwinds to the write that puts one back."""


def pod_cgroup(pid: int, proc: str = "/proc", cgroup_root: str = "/sys/fs/cgroup") -> Optional[str]:
    """The cgroup directory of the pod that process ``pid`` runs in, None when there is none to see.

    None also where this process cannot see the kubelet's cgroups (its own cgroup
    namespace, a kubelet without per-pod cgroups): the caller then waits a settle instead.
    """
    try:
        with open(os.path.join(proc, str(pid), "cgroup")) as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        if fields[0] == "0" and not fields[1]:
            base = cgroup_root                                          # cgroup v2
        else:
            hierarchy = next((h for h in _V1_HIERARCHIES if h in fields[1].split(",")), None)
            if hierarchy is None:
                continue
            base = os.path.join(cgroup_root, hierarchy.replace("name=", ""))
        parts = [part for part in fields[2].split("/") if part]
        if ".." in parts:       # a cgroup namespace shows the kubelet's cgroups as "/../..": not ours to see
            continue
        for end, part in enumerate(parts):
            if _POD_CGROUP.search(part):
                path = os.path.join(base, *parts[:end + 1])
                if os.path.isdir(path):
                    return path
                break           # not visible in this hierarchy: try the next line
    return None


@contextlib.contextmanager
def signals_unwind() -> Iterator[None]:
    """SIGTERM and SIGHUP raise inside the block (Python's default would end the process on the spot)."""
    def _raise(signum: int, _frame: object) -> None:
        raise _Signalled("signal %d" % signum)
    previous = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        try:
            previous[sig] = signal.signal(sig, _raise)
        except ValueError:      # not the main thread: signals cannot be handled here
            break
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@dataclass
class StaticPodRestart:
    """One restart. ``write(text)`` writes the manifest (``None``: removes it); ``running()`` lists the
    PIDs of the pod's processes that still run."""
    write: Callable[[Optional[str]], None]
    running: Callable[[], Sequence[int]]
    clock: Callable[[], float]
    sleep: Callable[[float], None]

    def _stopped(self, old: Sequence[int], pods: Sequence[str], limit: float) -> bool:
        deadline = self.clock() + limit
        ended_at: Optional[float] = None
        while self.clock() < deadline:
            if ended_at is None and not set(self.running()) & set(old):
                ended_at = self.clock()
            if ended_at is not None and not any(os.path.isdir(path) for path in pods) and \
                    (pods or self.clock() - ended_at >= SETTLE_WITHOUT_CGROUP):
                return True
            self.sleep(POLL_STOPPED)
        return False

    def replace(self, text: str, previous: str, old: Sequence[int], pods: Sequence[str], limit: float,
                warnings: List[str], backup: str) -> None:
        """Manifest ``text`` in place of ``previous`` once the pod of ``old`` (cgroups ``pods``) has stopped."""
        self.write(None)
        signalled: Optional[_Signalled] = None
        try:
            with signals_unwind():
                stopped = self._stopped(old, pods, limit)
        except _Signalled as exc:
            stopped, signalled = True, exc
        finally:
            self._put_back(text, previous, backup)
        if signalled is not None:
            raise RestartInterrupted("%s while the previous kube-scheduler stopped; the new manifest was written "
                                     "(backup: %s)" % (signalled, backup))
        if not stopped:
            warnings.append("the previous kube-scheduler's pod had not stopped %ds after its manifest was taken "
                            "out; the new manifest was written anyway" % int(limit))

    def _put_back(self, text: str, previous: str, backup: str) -> None:
        try:
            self.write(text)
            return
        except OSError as exc:
            failure = exc
        try:
            self.write(previous)
        except OSError:
            raise ManifestLostError("the kube-scheduler manifest was taken out to restart the scheduler and "
                                    "could not be written back (%s): copy it from the backup %s"
                                    % (failure, backup)) from failure
        raise ManifestLostError("the new kube-scheduler manifest could not be written (%s); the previous one "
                                "was put back (backup: %s)" % (failure, backup)) from failure
