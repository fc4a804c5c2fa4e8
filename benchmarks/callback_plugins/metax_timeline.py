# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""Callback for benchmarks/driver_upgrade.py: a timeline of task starts and per-item results.

Enabled only by that benchmark (ANSIBLE_CALLBACK_PLUGINS=benchmarks/callback_plugins,
ANSIBLE_CALLBACKS_ENABLED=metax_timeline); writes JSON lines to $METAX_TIMELINE.
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: metax_timeline
type: aggregate
short_description: JSON-lines timeline of tasks and loop items (benchmarks only)
description:
  - Writes one JSON object per task start, loop item result and task result to the file named by
    E(METAX_TIMELINE), with wall-clock times, for benchmarks/driver_upgrade.py.
requirements:
  - enable in callbacks_enabled
"""

import json
import os
import time

from ansible.plugins.callback import CallbackBase


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "metax_timeline"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        path = os.environ.get("METAX_TIMELINE")
        self._out = open(path, "a") if path else None   # pylint: disable=consider-using-with

    def _emit(self, **event):
        if self._out is None:
            return
        event["t"] = time.time()
        self._out.write(json.dumps(event, default=str) + "\n")
        self._out.flush()

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._emit(ev="task", name=task.get_name())

    def v2_runner_item_on_ok(self, result):
        loop_var = result._result.get("ansible_loop_var", "item")
        self._emit(ev="item", name=result._task.get_name(), item=result._result.get(loop_var))

    def v2_runner_item_on_failed(self, result):
        loop_var = result._result.get("ansible_loop_var", "item")
        self._emit(ev="item_failed", name=result._task.get_name(), item=result._result.get(loop_var))

    def v2_runner_on_ok(self, result):
        self._emit(ev="ok", name=result._task.get_name(), host=result._host.get_name())

    def v2_playbook_on_stats(self, stats):
        if self._out is not None:
            self._out.close()
            self._out = None
