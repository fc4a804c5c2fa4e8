# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""A GpuDeviceAgent running in a thread, as a context manager.

Its own module (not conftest.py): tests import it by name, and with several
conftest.py files in the tree ``from conftest import`` finds whichever was
imported first.
"""

from __future__ import annotations

import threading

from ansible_collections.metax.gpu.plugins.module_utils.agents.gpu_device import GpuDeviceAgent


class RunningAgent:
    def __init__(self, agent: GpuDeviceAgent) -> None:
        self.agent = agent
        self.thread = threading.Thread(target=agent.run, name="agent", daemon=True)

    def __enter__(self):
        self.thread.start()
        return self.agent

    def __exit__(self, *exc):
        self.agent.stop.set()
        self.thread.join(60)          # generous: a loaded machine may be slow to finish a round
        assert not self.thread.is_alive(), "the agent did not stop"
