# -*- coding: utf-8 -*-
# Copyright: metax.gpu contributors
# Apache License 2.0 (see LICENSE)
"""gpu-device's health monitor: read the signals, apply the policy, tell the Node. The one entry point.

gpu-device's health loop calls :meth:`HealthMonitor.step` after each device
scan with the scan's inventory and the GPUs it knew that are gone; the
answer's ``unhealthy_gpus`` are held out of Allocatable (deviceplugin
``DeviceState.hold``). The policy is read from a JSON file (the ConfigMap
``metax-gpu-health-policy`` mounted by the chart) and read again when the
file changes; a file that cannot be used is reported and the policy in force
stays (at start: the shipped defaults).
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any, Callable, Optional, Sequence, Tuple

from ..gpu.model import Inventory
from ..host import HostRoot
from .evaluate import RECOVERED, Decision, Evaluator
from .node import NodeHealthWriter
from .policy import DEFAULT_POLICY, Policy, parse_policy
from .reader import HealthReader

LOG = logging.getLogger("gpu-device.health")


class PolicyFile:
    """The policy in a JSON file, read again when its modification time or size changes."""

    def __init__(self, path: Optional[str]) -> None:
        self.path = path
        self.policy: Policy = DEFAULT_POLICY
        self.error: Optional[str] = None
        self._seen: Optional[Tuple[float, int]] = None

    def load(self) -> bool:
        """True when the policy in force changed."""
        if not self.path:
            return False
        try:
            info = os.stat(self.path)
        except OSError:
            # no file (the ConfigMap is optional): the shipped defaults
            changed = self._seen is not None and self.policy != DEFAULT_POLICY
            self._seen, self.policy, self.error = None, DEFAULT_POLICY, None
            return changed
        stamp = (info.st_mtime, info.st_size)
        if stamp == self._seen:
            return False
        self._seen = stamp
        try:
            with open(self.path, encoding="utf-8") as handle:
                text = handle.read()
            doc: Any = json.loads(text) if text.strip() else {}
            policy = parse_policy(doc)
        except (OSError, ValueError) as exc:      # PolicyError is a ValueError, as json's errors
            self.error = "health policy %s not used: %s" % (self.path, exc)
            LOG.error("%s; the policy in force stays", self.error)
            return False
        self.error = None
        if policy == self.policy:
            return False
        self.policy = policy
        LOG.info("health policy from %s: %d rule(s), hold-off %ds, recovery after %d clean reading(s)",
                 self.path, len(policy.rules), policy.hold_off_seconds, policy.recovery_readings)
        return True


class HealthMonitor:
    def __init__(self, host: HostRoot, policy_path: Optional[str] = None,
                 writer: Optional[NodeHealthWriter] = None, clock: Callable[[], float] = time.time) -> None:
        self.policy_file = PolicyFile(policy_path)
        self.policy_file.load()
        policy = self.policy_file.policy
        self.reader = HealthReader(host, policy.eid_pattern, policy.log_files, clock=clock)
        self.evaluator = Evaluator(policy)
        self.writer = writer
        self.last: Optional[Decision] = None
        self.write_error: Optional[str] = None

    def attach(self, writer: NodeHealthWriter) -> None:
        """The Node writer, once the API side is up; the next step writes the whole state."""
        self.writer = writer

    def step(self, inventory: Inventory, lost: Sequence[Tuple[str, int]] = ()) -> Decision:
        if self.policy_file.load():
            policy = self.policy_file.policy
            self.evaluator.set_policy(policy)
            try:
                self.reader.configure(policy.eid_pattern, policy.log_files)
            except ValueError as exc:      # parse_policy compiled it: not expected
                LOG.error("EID pattern not used: %s", exc)
        reading = self.reader.read(inventory, lost)
        decision = self.evaluator.evaluate(reading)
        for t in decision.transitions:
            log = LOG.info if t.kind == RECOVERED or t.rule.severity == "info" else LOG.warning
            log("GPU %d (%s) %s: %s [%s]%s", t.index, t.bdf, t.signal, t.kind, t.rule.describe(),
                "" if t.out_of_service is None else " after %.0fs out of service" % t.out_of_service,
                extra={"fields": {"gpu": t.bdf, "signal": t.signal, "transition": t.kind, "value": t.value,
                                  "severity": t.rule.severity, "action": t.rule.action}})
        if self.writer is not None:
            try:
                self.writer.write(decision, self.last)
                if self.write_error:
                    LOG.info("node %s's health condition written again", self.writer.node)
                self.write_error = None
            except Exception as exc:  # pylint: disable=broad-except  # the client raises many kinds
                if self.write_error is None:
                    LOG.warning("cannot write node %s's health condition or taint (retrying): %s",
                                self.writer.node, exc)
                self.write_error = str(exc)
        self.last = decision
        return decision
