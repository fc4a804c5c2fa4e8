# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Bring the scale profile up and down: kwok + N fake GPU nodes on the running local cluster.

    PYTHONPATH=.build/collections:tests .venv/bin/python -m scale.profile up N | down | status

The three real nodes stay as they are; the fake nodes are added beside them
(``type=kwok``, tainted) and carry what our agents compute for the presets
(agent_output). Run it under ``flock -o /tmp/metax-cluster.lock``: 2,000
nodes load the shared apiserver. ``down`` deletes every fake node (also those
of an interrupted run) and stops kwok.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from typing import List, Optional

from localcluster import fakenodes, kwok
from localcluster.settings import Settings, from_env

from .agent_output import profiles


@dataclass
class ScaleProfile:
    """kwok, the fake nodes and the writer; :meth:`grow` to a size, :meth:`down` at the end (always)."""

    settings: Settings = field(default_factory=lambda: from_env(os.environ))
    interval: float = fakenodes.AGENT_INTERVAL
    client: fakenodes.ApiClient = field(init=False)
    kwok: kwok.Kwok = field(init=False)
    profiles: List[fakenodes.GpuProfile] = field(init=False)
    nodes: List[fakenodes.FakeNode] = field(default_factory=list)
    writer: Optional[fakenodes.Writer] = None
    timings: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.client = fakenodes.ApiClient(self.settings)
        self.kwok = kwok.Kwok(kwok.spec(self.settings, fakenodes.SELECTOR))
        start = time.monotonic()
        self.profiles = profiles()
        self.timings["profiles_s"] = time.monotonic() - start

    def grow(self, count: int, ready_timeout: float = 600.0) -> None:
        """Up to ``count`` fake nodes (creating only the new ones), all Ready, the writer running."""
        self.kwok.up()
        self.nodes = fakenodes.plan(count, self.profiles)
        start = time.monotonic()
        fakenodes.create(self.client, self.nodes)
        self.timings["create_s"] = time.monotonic() - start
        self.timings["ready_s"] = fakenodes.wait_ready(self.client, count, ready_timeout)
        if self.writer is None:
            self.writer = fakenodes.Writer(self.client, {}, interval=self.interval)
            self.writer.start()
        self.writer.desired = fakenodes.profile_map(self.nodes)

    def down(self) -> int:
        if self.writer is not None:
            self.writer.stop()
            self.writer = None
        try:
            return fakenodes.delete_all(self.client)
        finally:
            self.kwok.down()

    def __enter__(self) -> "ScaleProfile":
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()


def main(argv: List[str]) -> int:
    settings = from_env(os.environ)
    if len(argv) == 3 and argv[1] == "up":
        prof = ScaleProfile(settings)
        try:
            prof.grow(int(argv[2]))
            assert prof.writer is not None
            prof.writer.stop()
            prof.writer.sync()   # one round, as the agents write at start
        except BaseException:
            prof.down()
            raise
        print("scale profile up: %d fake GPU nodes %s, kwok pid %s (%s)" % (
            len(prof.nodes), fakenodes.counts_by_preset(prof.nodes), prof.kwok.pid(),
            ", ".join("%s %.1f" % kv for kv in prof.timings.items())))
        return 0
    if argv[1:] == ["down"]:
        client = fakenodes.ApiClient(settings)
        deleted = fakenodes.delete_all(client)
        kwok.Kwok(kwok.spec(settings, fakenodes.SELECTOR)).down()
        print("scale profile down: %d fake nodes deleted, kwok stopped" % deleted)
        return 0
    if argv[1:] == ["status"]:
        client = fakenodes.ApiClient(settings)
        pid = kwok.Kwok(kwok.spec(settings, fakenodes.SELECTOR)).pid()
        print("fake nodes: %d; kwok: %s" % (len(fakenodes.names(client)), pid or "not running"))
        return 0
    sys.stderr.write(__doc__ or "")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
